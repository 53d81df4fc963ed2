"""Session 41's experiment: the d128 dK/dV kernel in two passes with K (and, in the dK pass, V) as
register operands, against the one pass in use. GPU only; run with EXP_K_REGS=1 EXP_V_REGS=1 over the
experiment's kernel patch (benchmarks/results/s41/call5/k_regs.patch), which loads K, V into registers
in the passes of a split kernel (PART 1 and 2) and leaves the one-pass kernel (PART 0) as it is.

Why: in one pass each consumer's step reads 96 KB of shared memory (S^T and dP^T with both operands
there, dV and dK with one) for 4 products; split, with K and V in registers, 80 KB for 5 products (S^T
is computed in both passes). Session 33's arithmetic has the kernel bound by those reads; the one-pass
kernel cannot hold K in registers without spilling (NOTES, session 41).

Variants, alternating in one process: `one_pass` (SPLIT_ABOVE 128, the kernel in use), `two_pass`
(SPLIT_ABOVE 64: dV then dK, 64-query tiles), `two_pass_dv128` (the dV pass on 128-query tiles). At
d128, batch x seqlen = 16k tokens, 16 heads, bf16: fwd+bwd through the public API, the kernels' summed
device time (torch.profiler) and the dK/dV kernel's alone, two rounds, the lower kept; dk and dv of each
variant against one_pass's (max abs difference relative to the largest value).

    EXP_K_REGS=1 EXP_V_REGS=1 python benchmarks/ab_dkdv_two_pass.py --out ab.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_profile, time_ms, write_results  # noqa: E402
from kernels import _flash_dkdv_hopper as dkdv  # noqa: E402
from kernels import flash_attention  # noqa: E402

BASE = dkdv.CONFIGS[128]
VARIANTS = {  # name -> (SPLIT_ABOVE, d128 config)
    "one_pass": (128, BASE),
    "two_pass": (64, BASE),
    "two_pass_dv128": (64, dataclasses.replace(BASE, dv_block_m=128)),
}


def set_variant(name: str) -> None:
    dkdv.SPLIT_ABOVE, dkdv.CONFIGS[128] = VARIANTS[name]


def dkdv_ms(profile: dict) -> float:
    """The dK/dV kernels' ms per step in a `device_profile`."""
    return sum(ms for kernel, ms in profile["top_kernels_ms"].items() if "dkdv" in kernel)


def d128_fwdbwd(seqlen: int, causal: bool):
    """(batch, nheads, fwdbwd): fwdbwd() -> dq, dk, dv of a public-API d128 call on fresh bf16 inputs of
    batch x seqlen = 16k tokens, 16 heads."""
    batch, nheads = 16384 // seqlen, 16
    torch.manual_seed(seqlen + causal)
    q, k, v = (
        torch.randn(batch, seqlen, nheads, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn_like(q)

    def fwdbwd():
        return torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)

    return batch, nheads, fwdbwd


def point(seqlen: int, causal: bool) -> dict:
    batch, nheads, fwdbwd = d128_fwdbwd(seqlen, causal)
    row = dict(seqlen=seqlen, causal=causal, batch=batch, nheads=nheads, headdim=128)
    grads = {}
    for name in VARIANTS:  # first calls (compiles) outside the timings; the check
        set_variant(name)
        grads[name] = [g.float() for g in fwdbwd()]
    for name in VARIANTS:
        scale = max(g.abs().max().item() for g in grads["one_pass"][1:])
        row[f"{name}_dkdv_max_rel_diff"] = max(
            (a - b).abs().max().item() / scale
            for a, b in zip(grads[name][1:], grads["one_pass"][1:], strict=True)
        )
    for _ in range(2):
        for name in VARIANTS:
            set_variant(name)
            profile = device_profile(fwdbwd, steps=10, top=12)
            got = dict(
                fwdbwd_device=profile["kernels_ms"], dkdv_device=dkdv_ms(profile), fwdbwd=time_ms(fwdbwd)
            )
            for kind, ms in got.items():
                key = f"{name}_{kind}_ms"
                row[key] = min(row.get(key, ms), ms)
    set_variant("one_pass")
    flops = 3.5 * 4 * batch * nheads * seqlen**2 * 128 / (2 if causal else 1)
    for name in VARIANTS:
        row[f"{name}_fwdbwd_tflops"] = flops / row[f"{name}_fwdbwd_ms"] / 1e9
        row[f"one_pass_over_{name}_dkdv"] = row["one_pass_dkdv_device_ms"] / row[f"{name}_dkdv_device_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ab_dkdv_two_pass needs a CUDA device")
    if os.environ.get("EXP_K_REGS") != "1":
        raise SystemExit("set EXP_K_REGS=1 (and EXP_V_REGS=1) over the experiment's kernel patch")
    rows = []
    for seqlen in args.seqlens:
        for causal in (True, False):
            rows.append(point(seqlen, causal))
            write_results(args.out, rows)
            r = rows[-1]
            print(
                f"d128 n{seqlen} {'causal' if causal else 'full'}: dK/dV kernel ms "
                + " / ".join(f"{n} {r[f'{n}_dkdv_device_ms']:.3f}" for n in VARIANTS)
                + "; fwd+bwd TFLOP/s "
                + " / ".join(f"{n} {r[f'{n}_fwdbwd_tflops']:.0f}" for n in VARIANTS)
                + "; diff "
                + " / ".join(f"{r[f'{n}_dkdv_max_rel_diff']:.1e}" for n in VARIANTS),
                flush=True,
            )


if __name__ == "__main__":
    main()
