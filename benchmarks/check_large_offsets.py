"""Do the kernels address tensors past 2**31 elements within one sequence correctly?

Every kernel offsets its batch in int64, but offsets inside one sequence (row x row stride) are int32
products in Triton unless cast. One sequence of N tokens with H heads of D has N x H x D elements; past 2**31
(a million tokens at 16 heads of 128) an int32 product wraps. Each case runs a call on such tensors and
compares the last query rows (the ones whose offsets wrap first) with the same call on a slice of the
tensors near their end, whose offsets are small: equal within bf16 rounding if the addressing is right.

Since session 72 such a call takes the kernels' WIDE builds (64-bit row and head offsets,
`kernels._common.wide_offsets`; decode since session 71); `--narrow` keeps the usual 32-bit builds, to
see what each route does without them. The `batch_*` cases hold many sequences of ordinary length whose
batch spans past 2**31 elements (the batch offset is 64-bit): the last sequence's output and gradients
against the same call on it alone. `wide_cost` times the WIDE builds against the usual ones where both
read right (a shorter sequence, the WIDE build forced), `dq_route_cost` Hopper's dq kernel against the
portable WIDE one there. The `anchors` cases run SDPA's backends beside ours on the same causal call (its
seconds, peak memory and last rows against float32: session 73 found cuDNN's dq wrong past 2**31
elements). Each case runs in a process of its own (a fault spoils the process's CUDA context).

    python benchmarks/check_large_offsets.py --out large_offsets.json [--narrow]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels._common  # noqa: E402
import kernels._flash_dq_hopper  # noqa: E402
from benchmarks.common import mean_ms, peak_memory_mib, wall_ms, write_results  # noqa: E402
from kernels import block_sparse_attention, flash_attention, flash_attention_varlen, flash_decode  # noqa: E402
from kernels.layouts import local_layout  # noqa: E402

TAIL = 256  # query rows compared
WINDOW = 512  # keys each of them sees in the windowed cases
# (tests run the cases small on CPU tensors under the Triton interpreter, fp16: its bf16 dots are wrong)
DEVICE, DTYPE = "cuda", torch.bfloat16


def _diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def _peak_gb(fn) -> float:
    """GB allocated at the peak of one call of fn beyond what it found held (`peak_memory_mib`); 0 off CUDA
    (the tests run the cases on CPU tensors)."""
    if DEVICE != "cuda":
        fn()
        return 0.0
    return round(peak_memory_mib(fn) / 1024, 1)


def _two_calls(fn) -> tuple[list[float], list[float]]:
    """Seconds and peak GB (`_peak_gb`) of two calls of fn: the first builds and tunes, the second is warm."""
    seconds, peaks = [], []
    for _ in range(2):
        seconds.append(wall_ms(lambda: peaks.append(_peak_gb(fn))) / 1e3)
    return seconds, peaks


def _tail_softmax(qt, kf, d):
    """The causal softmax of a sequence's last query rows qt (float32) over its keys kf: row r of the t
    rows sees keys up to n - t + r. (Before session 72's CPU test of this script the references let every
    one of those rows see every key: at 1.11M keys a flaw of ~1e-4 in the causal rows' figures.)"""
    n, tail = kf.shape[0], qt.shape[0]
    scores = (qt @ kf.T) / d**0.5
    cols = torch.arange(n, device=scores.device)
    rows = torch.arange(n - tail, n, device=scores.device)
    return torch.softmax(scores.masked_fill(cols[None, :] > rows[:, None], float("-inf")), dim=-1)


def _tail_reference(q, k, v, g, head, d):
    """float32 out, dq (the last rows), dk and dv (every key) of one head of the last sequence of a causal
    call whose output gradient g is zero but in those rows."""
    qt, gt = q[-1, -TAIL:, head].float(), g[-1, -TAIL:, head].float()
    kf, vf = k[-1, :, head].float(), v[-1, :, head].float()
    p = _tail_softmax(qt, kf, d)  # (TAIL, n)
    dp = gt @ vf.T
    ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / d**0.5
    return {"out": p @ vf, "dq": ds @ kf, "dk": ds.T @ qt, "dv": p.T @ gt}


def case_window(n, h, d, backward):
    """flash_attention with a causal window: the rows at the end see only the last WINDOW + TAIL keys,
    so the slice holding those is the reference."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(3))
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


def case_varlen_window(n, h, d, short=1000):
    """flash_attention_varlen with a causal window over a sequence of `short` tokens and one of n - short:
    the long one's last rows against the call on its last WINDOW + TAIL rows alone."""
    q, k, v = (torch.randn(n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(3))
    cu = torch.tensor([0, short, n], dtype=torch.int32, device=DEVICE)
    out = flash_attention_varlen(q, k, v, cu, cu, n - short, n - short, causal=True, window=(WINDOW, 0))
    lo = n - TAIL - WINDOW
    ref = flash_attention(*(t[None, lo:] for t in (q, k, v)), causal=True, window=(WINDOW, 0))
    return {"out": _diff(out[-TAIL:], ref[0, -TAIL:])}


def case_causal_bwd(n, h, d, used=1):
    """Causal forward and backward over `used` heads of tensors of h heads (their rows as far apart as h
    heads put them): output and gradients of the last rows against float32 over every key, and dK/dV of
    every key (the last rows see all of them). One head (used=1, 1/h of the work) keeps `out` short, so
    every kernel is a Hopper one (TMA descriptors); all heads make `out` wide, and Hopper's dq kernel gives
    way to the portable WIDE one before session 73 (since, Hopper's reads it too). fwd_bwd_s: the first
    call's seconds (builds and tuning included); warm_fwd_bwd_s: a second call's."""
    big = [torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(3)]
    q, k, v = (t[:, :, :used].requires_grad_() for t in big)
    g = torch.zeros_like(q)
    g[:, -TAIL:] = torch.randn_like(q[:, -TAIL:])
    result = []

    def fwd_bwd():
        result[:] = [flash_attention(q, k, v, causal=True)]
        result.extend(torch.autograd.grad(result[0], (q, k, v), g))

    (first_s, warm_s), _ = _two_calls(fwd_bwd)
    out, dq, dk, dv = result
    row = {
        "fwd_bwd_s": round(first_s, 1),
        "warm_fwd_bwd_s": round(warm_s, 2),
        "out": 0.0,
        "dq": 0.0,
        "dk": 0.0,
        "dv": 0.0,
        "out_scale": 0.0,
    }
    for head in range(used):
        want = _tail_reference(q, k, v, g, head, d)
        got = {
            "out": out[0, -TAIL:, head],
            "dq": dq[0, -TAIL:, head],
            "dk": dk[0, :, head],
            "dv": dv[0, :, head],
        }
        for name in got:
            row[name] = max(row[name], _diff(got[name], want[name]))
        row["out_scale"] = max(row["out_scale"], want["out"].abs().max().item())
    return row


def case_block_sparse_bwd(n, h, d, block=128):
    """block_sparse_attention's backward with the local layout of `case_block_sparse`, a gradient on the
    last rows: their dq, and dK/dV of the last 4 blocks, against the call on those blocks alone."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    out = block_sparse_attention(q, k, v, local_layout(n, block, local_blocks=1, causal=True).to(DEVICE))
    g = torch.zeros_like(out)
    g[:, -TAIL:] = torch.randn_like(out[:, -TAIL:])
    grads = torch.autograd.grad(out, (q, k, v), g)
    lo = n - 4 * block
    part = [t.detach()[:, lo:].clone().requires_grad_() for t in (q, k, v)]
    ref = block_sparse_attention(*part, local_layout(n - lo, block, local_blocks=1, causal=True).to(DEVICE))
    ref_grads = torch.autograd.grad(ref, part, g[:, lo:])
    row = {"out": _diff(out[:, -TAIL:], ref[:, -TAIL:])}
    row.update(
        {name: _diff(a[:, lo:], b) for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True)}
    )
    return row


def case_wide_cost(n=131072, h=16, d=128, reps=5):
    """fwd and fwd+bwd ms of a causal window call (the portable kernels) in the usual builds and with the
    WIDE builds forced (the limit set to 0), where both read right."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            flash_attention(q, k, v, causal=True, window=(4096, 0))

    def fwdbwd():
        torch.autograd.grad(flash_attention(q, k, v, causal=True, window=(4096, 0)), (q, k, v), g)

    row = {"usual_fwd_ms": mean_ms(fwd, reps), "usual_fwdbwd_ms": mean_ms(fwdbwd, reps)}
    kernels._common.SEQUENCE_EXTENT_LIMIT = 0
    row.update(wide_fwd_ms=mean_ms(fwd, reps), wide_fwdbwd_ms=mean_ms(fwdbwd, reps))
    return {"tokens": n, **{key: round(value, 3) for key, value in row.items()}}


def case_dq_route_cost(n=131072, h=16, d=128, reps=3):
    """fwd+bwd ms of a causal call with the WIDE builds forced, where both routes read right: dq through
    Hopper's kernel (which reads a wide `out` since session 73) against the portable WIDE dq (the route of
    such calls in session 72)."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)

    def fwdbwd():
        torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), g)

    kernels._common.SEQUENCE_EXTENT_LIMIT = 0
    row = {"hopper_dq_ms": mean_ms(fwdbwd, reps)}
    kernels._flash_dq_hopper.ENABLED = False
    row["portable_dq_ms"] = mean_ms(fwdbwd, reps)
    return {"tokens": n, **{key: round(value, 3) for key, value in row.items()}}


SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION", "sdpa_math": "MATH"}


def case_anchors(n, h, d, impls=("ours", "sdpa_cudnn", "sdpa_flash"), batch=1):
    """Causal fwd+bwd of `batch` sequences on ours and on SDPA's backends: a warm call's seconds (after a
    first, which builds and tunes), its peak memory, and the last sequence's last rows' out and dq against
    float32 over every key, per impl (and the references' largest values, out_scale and dq_scale). An impl
    that raises gets its error as its row."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = (batch, n, h, d)
    q, k, v = (torch.randn(shape, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    g = torch.zeros_like(q)
    g[-1, -TAIL:] = torch.randn_like(q[-1, -TAIL:])
    refs = []
    for head in range(h):
        ref = _tail_reference(q, k, v, g, head, d)
        refs.append((ref["out"], ref["dq"]))

    def call(name):
        if name == "ours":
            return flash_attention(q, k, v, causal=True)
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name])):
            sdpa = torch.nn.functional.scaled_dot_product_attention
            return sdpa(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)

    row = {
        "out_scale": max(ref[0].abs().max().item() for ref in refs),
        "dq_scale": max(ref[1].abs().max().item() for ref in refs),
    }

    def fwd_bwd(name, result):
        result.clear()  # (the previous call's out and dq freed before this one)
        out = call(name)
        result.extend([out, *torch.autograd.grad(out, (q,), g)])

    for name in impls:
        result = []
        try:
            (_, seconds), peaks = _two_calls(functools.partial(fwd_bwd, name, result))
        except RuntimeError as e:
            row[name] = {"error": str(e)[:300]}
            continue
        out, dq = result
        row[name] = {
            "fwd_bwd_s": round(seconds, 2),
            "first_call_gb": peaks[0],  # (peak memory beyond what the call found held)
            "call_gb": peaks[1],
            "out": max(_diff(out[-1, -TAIL:, i], ref[0]) for i, ref in enumerate(refs)),
            "dq": max(_diff(dq[-1, -TAIL:, i], ref[1]) for i, ref in enumerate(refs)),
        }
        del out, dq, result  # (freed before the next impl's calls)
    return row


def case_causal(n, h, d):
    """flash_attention causal (the Hopper forward on an H100/H200): the last rows against a reference
    over all keys in float32, per head; out_scale: the reference's largest value (over a million keys an
    output row is an average of that many values, ~1e-3)."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(3))
    out = flash_attention(q, k, v, causal=True)
    worst = scale = 0.0
    for head in range(h):
        ref = _tail_softmax(q[0, -TAIL:, head].float(), k[0, :, head].float(), d) @ v[0, :, head].float()
        worst = max(worst, _diff(out[0, -TAIL:, head], ref))
        scale = max(scale, ref.abs().max().item())
    return {"out": worst, "out_scale": scale}


def case_decode(n, hk, d):
    """flash_decode of one query against a cache of n positions: against a reference in float32."""
    q = torch.randn(1, 1, hk, d, device=DEVICE, dtype=DTYPE)
    k, v = (torch.randn(1, n, hk, d, device=DEVICE, dtype=DTYPE) for _ in range(2))
    lens = torch.tensor([n], dtype=torch.int32, device=DEVICE)
    out = flash_decode(q, k, v, lens)
    worst = 0.0
    for head in range(hk):
        s = (k[0, :, head].float() @ q[0, 0, head].float()) / d**0.5
        ref = torch.softmax(s, dim=0) @ v[0, :, head].float()
        worst = max(worst, _diff(out[0, 0, head], ref))
    return {"out": worst}


def case_block_sparse(n, h, d, block=128):
    """block_sparse_attention with a local layout (each block row keeps itself and the one before): the
    last rows see the last two blocks, so the slice of the last 4 blocks is the reference."""
    q, k, v = (torch.randn(1, n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(3))
    out = block_sparse_attention(q, k, v, local_layout(n, block, local_blocks=1, causal=True).to(DEVICE))
    lo = n - 4 * block
    qs, ks, vs = (t[:, lo:] for t in (q, k, v))
    ref = block_sparse_attention(
        qs, ks, vs, local_layout(n - lo, block, local_blocks=1, causal=True).to(DEVICE)
    )
    return {"out": _diff(out[:, -TAIL:], ref[:, -TAIL:])}


def case_batch(kind, batch=40, n=16384, h=32, d=128):
    """batch sequences of n tokens (batch x n x h x d past 2**31 elements): the last one's output (and,
    but for decode, its gradients) against the call on it alone."""
    if kind == "decode":
        q = torch.randn(batch, 1, h, d, device=DEVICE, dtype=DTYPE)
        k, v = (torch.randn(batch, n, h, d, device=DEVICE, dtype=DTYPE) for _ in range(2))
        lens = torch.full((batch,), n, dtype=torch.int32, device=DEVICE)
        out = flash_decode(q, k, v, lens)
        alone = flash_decode(q[-1:], k[-1:], v[-1:], lens[-1:])  # (its own split count: rounding differs)
        return {"out": _diff(out[-1:], alone)}
    kw = dict(causal=True, window=(WINDOW, 0) if kind == "window" else None)
    q, k, v = (torch.randn(batch, n, h, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    out = flash_attention(q, k, v, **kw)
    g = torch.zeros_like(out)
    g[-1:] = torch.randn_like(out[-1:])
    grads = torch.autograd.grad(out, (q, k, v), g)
    last = [t.detach()[-1:].clone().requires_grad_() for t in (q, k, v)]
    ref = flash_attention(*last, **kw)
    ref_grads = torch.autograd.grad(ref, last, g[-1:])
    row = {"out": _diff(out[-1:], ref)}
    row.update(
        {name: _diff(a[-1:], b) for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True)}
    )
    return row


CASES = {
    "window": lambda n: case_window(n, 16, 128, backward=False),
    "window_bwd": lambda n: case_window(n, 16, 128, backward=True),
    "decode": lambda n: case_decode(2 * n, 8, 128),  # 2n x 8 x 128 elements: past 2**31 as the others
    "block_sparse": lambda n: case_block_sparse(n, 16, 128),
    "causal": lambda n: case_causal(n, 16, 128),
    "causal_bwd": lambda n: case_causal_bwd(n, 16, 128),
    "causal_bwd_full": lambda n: case_causal_bwd(n, 16, 128, used=16),
    "block_sparse_bwd": lambda n: case_block_sparse_bwd(n, 16, 128),
    "varlen_window": lambda n: case_varlen_window(n, 16, 128),
    "batch_causal": lambda n: case_batch("causal"),
    "batch_window": lambda n: case_batch("window"),
    "batch_decode": lambda n: case_batch("decode"),
    "wide_cost": lambda n: case_wide_cost(),
    "dq_route_cost": lambda n: case_dq_route_cost(),
    "anchors": lambda n: case_anchors(n, 16, 128),
    "anchors_cudnn": lambda n: case_anchors(n, 16, 128, impls=("ours", "sdpa_cudnn")),
    # (cuDNN alone, at 8 and 32 heads: past 2**20 rows under 2**31 elements, and the other way round)
    "cudnn_h8": lambda n: case_anchors(n, 8, 128, impls=("sdpa_cudnn",)),
    "cudnn_h32": lambda n: case_anchors(n, 32, 128, impls=("sdpa_cudnn",)),
    "cudnn_h20": lambda n: case_anchors(n, 20, 128, impls=("sdpa_cudnn",)),
    # (9 sequences: past 2**31 elements in all, each far under)
    "cudnn_batch": lambda n: case_anchors(n, 16, 128, impls=("ours", "sdpa_cudnn"), batch=9),
    "ours_memory": lambda n: case_anchors(n, 16, 128, impls=("ours",)),
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=(1 << 20) + (1 << 16), help="one sequence's length")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--narrow", action="store_true", help="the usual 32-bit builds past 2**31 elements")
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)  # (one case, in this process)
    parser.add_argument("--out", default="large_offsets.json")
    args = parser.parse_args(argv)
    if args.case:
        if args.narrow:
            kernels._common.SEQUENCE_EXTENT_LIMIT = 2**63
        t0 = time.time()
        try:
            row = CASES[args.case](args.tokens)
        except ValueError as e:  # a refusal is this case's row
            row = {"refused": str(e)[:300]}
        row.update(case=args.case, narrow=args.narrow, seconds=round(time.time() - t0, 1))
        row.setdefault("tokens", args.tokens)  # (wide_cost gives its own)
        print(json.dumps(row), flush=True)
        return
    rows = []
    for name in args.cases:
        cmd = [sys.executable, __file__, "--case", name, "--tokens", str(args.tokens)]
        proc = subprocess.run(cmd + (["--narrow"] if args.narrow else []), capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {
            "case": name, "narrow": args.narrow, "exit": proc.returncode, "error": proc.stderr.strip()[-400:]
        }  # fmt: skip
        rows.append(row)
        print(row, flush=True)
        write_results(args.out, rows)  # (device, versions and date with the rows, as the other benchmarks)


if __name__ == "__main__":
    main()
