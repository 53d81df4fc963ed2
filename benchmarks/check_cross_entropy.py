"""The language-model loss (`kernels.linear_cross_entropy`) on the GPU, piece by piece.

1. The per-row kernel (`_cross_entropy_rows`) at a GPT-2 vocabulary for each tiling in TILINGS:
   milliseconds, bytes moved per second (two reads and one write of the logits), and its largest
   error against torch's fp32 softmax of the same logits. GROUP=1 is the per-logit online softmax
   (two exp2 per logit in the first pass); larger groups spend one exp2 per group to rescale.
2. The weight gradient over chunks: the product rounded to bf16 and added to an fp32 sum (before),
   against cuBLAS writing fp32 and adding in its epilogue (`_add_weight_grad`), with each one's error
   against one fp32-accumulated product of all tokens.
3. The whole op, forward and backward under bf16 autocast, for several chunk sizes, against eager
   `F.linear` + `F.cross_entropy`: milliseconds and peak memory.

    python benchmarks/check_cross_entropy.py --tokens 16384 --width 1024 --out check_cross_entropy.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import peak_memory_mib, time_ms, write_results  # noqa: E402
from kernels import linear_cross_entropy  # noqa: E402
from kernels.cross_entropy import _add_weight_grad, cross_entropy_rows_, rows_tiling  # noqa: E402

TILINGS = [
    dict(BLOCK_V=4096, GROUP=1, num_warps=8),
    dict(BLOCK_V=4096, GROUP=8, num_warps=8),
    dict(BLOCK_V=4096, GROUP=16, num_warps=8),
    dict(BLOCK_V=2048, GROUP=8, num_warps=4),
    dict(BLOCK_V=8192, GROUP=8, num_warps=16),
    dict(BLOCK_V=4096, GROUP=8, num_warps=16),
    dict(BLOCK_V=1024, GROUP=8, num_warps=2),
    # few programs per SM: the rows in flight fit in L2, so the second pass may read from there
    dict(BLOCK_V=8192, GROUP=8, num_warps=32),
    dict(BLOCK_V=16384, GROUP=8, num_warps=32),
    dict(BLOCK_V=16384, GROUP=8, num_warps=16),
]


def rows_kernel(tokens: int, vocab: int) -> list[dict]:
    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 3
    targets = torch.randint(0, vocab, (tokens,), device="cuda")
    targets[::7] = -100
    ref = logits.float().requires_grad_()
    ref_losses = F.cross_entropy(ref, targets, reduction="none")
    (ref_grad,) = torch.autograd.grad(ref_losses.sum(), ref)
    rows = []
    shipped = rows_tiling(vocab, logits.dtype)
    for tiling in [shipped, *(t for t in TILINGS if t != shipped)]:
        work = logits.clone()
        losses = cross_entropy_rows_(work, targets, tiling=tiling)
        ms = time_ms(lambda t=tiling: cross_entropy_rows_(logits.clone(), targets, tiling=t)) - time_ms(
            logits.clone
        )  # each call overwrites its logits: time a fresh copy, less the copy
        rows.append(
            dict(
                part="rows_kernel", tokens=tokens, vocab=vocab, **tiling, ms=ms,
                gb_per_s=3 * logits.numel() * logits.element_size() / ms / 1e6,
                loss_max_err=float((losses - ref_losses).abs().max()),
                grad_max_err=float((work.float() - ref_grad).abs().max()),
            )
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def weight_grad(tokens: int, width: int, vocab: int, chunk: int) -> list[dict]:
    dlogits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 1e-3
    h = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    exact = torch.mm(dlogits.t().float(), h.float())
    chunks = [(dlogits[s : s + chunk], h[s : s + chunk]) for s in range(0, tokens, chunk)]

    def rounded_then_added():  # the loop before session 30
        dw = torch.zeros(vocab, width, device="cuda")
        for dl, hc in chunks:
            dw += dl.t() @ hc
        return dw

    def fp32_epilogue():
        dw = None
        for dl, hc in chunks:
            dw = _add_weight_grad(dw, dl, hc, torch.float32)
        return dw

    rows = []
    for name, fn in (("rounded_then_added", rounded_then_added), ("fp32_epilogue", fp32_epilogue)):
        err = float((fn() - exact).abs().max() / exact.abs().max())
        rows.append(
            dict(part="weight_grad", variant=name, tokens=tokens, chunk=chunk, ms=time_ms(fn), rel_err=err)
        )
        print(rows[-1], flush=True)
    return rows


def whole_loss(tokens: int, width: int, vocab: int, chunks: list[int]) -> list[dict]:
    hidden = torch.randn(tokens, width, device="cuda", requires_grad=True)
    weight = (torch.randn(vocab, width, device="cuda") * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device="cuda")

    def ours(chunk):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk)
        loss.backward()
        hidden.grad = weight.grad = None

    def eager():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
        loss.backward()
        hidden.grad = weight.grad = None

    cases = [(f"ours_chunk{c}", lambda c=c: ours(c)) for c in chunks] + [("eager", eager)]
    rows = []
    for name, fn in cases:
        rows.append(
            dict(part="whole_loss", impl=name, tokens=tokens, width=width, vocab=vocab,
                 fwdbwd_ms=time_ms(fn), peak_mem_mib=peak_memory_mib(fn))
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--chunks", default="2048,4096,8192,16384")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = []
    for tokens in sorted({4096, args.tokens}):
        rows += rows_kernel(tokens, args.vocab)
        write_results(args.out, rows)
    for chunk in chunks:
        rows += weight_grad(args.tokens, args.width, args.vocab, chunk)
        write_results(args.out, rows)
    rows += whole_loss(args.tokens, args.width, args.vocab, chunks)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
