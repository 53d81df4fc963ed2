"""Do the kernels address tensors past 2**31 elements within one sequence correctly?

Every kernel offsets its batch in int64, but offsets inside one sequence (row x row stride) are int32
products in Triton unless cast. One sequence of N tokens with H heads of D has N x H x D elements; past 2**31
(a million tokens at 16 heads of 128) an int32 product wraps. Each case runs a call on such tensors and
compares the last query rows (the ones whose offsets wrap first) with the same call on a slice of the
tensors near their end, whose offsets are small: equal within bf16 rounding if the addressing is right.

    python benchmarks/check_large_offsets.py --out large_offsets.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import block_sparse_attention, flash_attention, flash_decode  # noqa: E402
from kernels.layouts import local_layout  # noqa: E402

TAIL = 256  # query rows compared
WINDOW = 512  # keys each of them sees in the windowed cases


def _diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def case_window(n, h, d, backward):
    """flash_attention with a causal window: the rows at the end see only the last WINDOW + TAIL keys,
    so the slice holding those is the reference."""
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if backward:
        for t in (q, k, v):
            t.requires_grad_()
    out = flash_attention(q, k, v, causal=True, window=(WINDOW, 0))
    lo = n - TAIL - WINDOW
    qs, ks, vs = (t.detach()[:, lo:].clone().requires_grad_(backward) for t in (q, k, v))
    ref = flash_attention(qs, ks, vs, causal=True, window=(WINDOW, 0))
    row = {"out": _diff(out[:, -TAIL:], ref[:, -TAIL:])}
    if backward:  # a gradient on the last rows only: it reaches the last WINDOW + TAIL keys
        g = torch.zeros_like(out)
        g[:, -TAIL:] = torch.randn_like(out[:, -TAIL:])
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
        rdq, rdk, rdv = torch.autograd.grad(ref, (qs, ks, vs), g[:, lo:])
        row.update(
            dq=_diff(dq[:, -TAIL:], rdq[:, -TAIL:]), dk=_diff(dk[:, lo:], rdk), dv=_diff(dv[:, lo:], rdv)
        )
    return row


def case_causal(n, h, d):
    """flash_attention causal (the Hopper forward on an H100/H200): the last rows against a reference
    over all keys in float32, per head (the rows see every key)."""
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attention(q, k, v, causal=True)
    worst = 0.0
    for head in range(h):
        qh = q[0, -TAIL:, head].float()
        s = (qh @ k[0, :, head].float().T) / d**0.5  # the last rows see every key
        ref = torch.softmax(s, dim=-1) @ v[0, :, head].float()
        worst = max(worst, _diff(out[0, -TAIL:, head], ref))
    return {"out": worst}


def case_decode(n, hk, d):
    """flash_decode of one query against a cache of n positions: against a reference in float32."""
    q = torch.randn(1, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, n, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.tensor([n], dtype=torch.int32, device="cuda")
    out = flash_decode(q, k, v, lens)
    worst = 0.0
    for head in range(hk):
        s = (k[0, :, head].float() @ q[0, 0, head].float()) / d**0.5
        ref = torch.softmax(s, dim=0) @ v[0, :, head].float()
        worst = max(worst, _diff(out[0, 0, head], ref))
    return {"out": worst}


def case_block_sparse(n, h, d):
    """block_sparse_attention with a local layout (each block row keeps itself and the one before): the
    last rows see the last two blocks, so the slice of the last 4 blocks is the reference."""
    block = 128
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = block_sparse_attention(q, k, v, local_layout(n, block, local_blocks=1, causal=True).to("cuda"))
    lo = n - 4 * block
    qs, ks, vs = (t[:, lo:] for t in (q, k, v))
    ref = block_sparse_attention(
        qs, ks, vs, local_layout(n - lo, block, local_blocks=1, causal=True).to("cuda")
    )
    return {"out": _diff(out[:, -TAIL:], ref[:, -TAIL:])}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=(1 << 20) + (1 << 16), help="one sequence's length")
    parser.add_argument(
        "--cases", nargs="+", default=["window", "window_bwd", "decode", "block_sparse", "causal"]
    )
    parser.add_argument("--out", default="large_offsets.json")
    args = parser.parse_args(argv)
    n, h, d = args.tokens, 16, 128
    rows = []
    for name in args.cases:
        t0 = time.time()
        try:
            if name == "window":
                row = case_window(n, h, d, backward=False)
            elif name == "window_bwd":
                row = case_window(n, h, d, backward=True)
            elif name == "causal":
                row = case_causal(n, h, d)
            elif name == "decode":
                row = case_decode(2 * n, 8, d)  # 2n x 8 x 128 elements: past 2**31 as the others
            elif name == "block_sparse":
                row = case_block_sparse(n, h, d)
            else:
                raise SystemExit(f"unknown case {name}")
        except Exception as e:  # a refusal or a fault is this case's row
            row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        row.update(case=name, tokens=n, seconds=round(time.time() - t0, 1))
        rows.append(row)
        print(row, flush=True)
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
