"""Session 41's experiment: the d128 dK/dV kernel with each step's dV and dK products left running into
the next step (`_steps_deferred`, selected by EXP_DEFER=1 at import; the patch beside the results).
Nsight Compute had the dq kernel's tensor pipe busy 94% of its cycles and the dK/dV kernel's 78%
(results/s41/call6): the dq kernel issues the previous step's dq product behind the next step's, and
the dK/dV kernel waited for its dV and dK products at the end of every step.

One process times one setting (run it with EXP_DEFER=0 and =1 in turn): at d128, batch x seqlen = 16k
tokens, 16 heads, bf16, 2 and 3 stages, the dK/dV kernel's device time (torch.profiler) and fwd+bwd
through the public API, and dk, dv against the portable dK/dV kernel's (max abs difference relative to
the largest value).

    EXP_DEFER=1 python benchmarks/exp_dkdv_defer.py --out defer1.json

Also used for the next try (`--label`): S^T and dP^T started from zero (wgmma without an accumulator
input) and -lse / scale and -delta added after them, EXP_RZ=1 over `results/s41/call9/rz.patch`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ab_dkdv_two_pass import d128_fwdbwd, dkdv_ms  # noqa: E402
from benchmarks.common import device_profile, time_ms, write_results  # noqa: E402
from kernels import _flash_dkdv_hopper as dkdv  # noqa: E402

BASE = dkdv.CONFIGS[128]
STAGES = {2: BASE, 3: dataclasses.replace(BASE, stages=3)}


def point(seqlen: int, causal: bool, stages: int) -> dict:
    batch, nheads, fwdbwd = d128_fwdbwd(seqlen, causal)
    dkdv.CONFIGS[128] = STAGES[stages]
    got = [g.float() for g in fwdbwd()]
    dkdv.ENABLED = False  # the portable dK/dV kernel
    want = [g.float() for g in fwdbwd()]
    dkdv.ENABLED = True
    scale = max(g.abs().max().item() for g in want[1:])
    diff = max((a - b).abs().max().item() / scale for a, b in zip(got[1:], want[1:], strict=True))
    kernel_ms = dkdv_ms(device_profile(fwdbwd, steps=10, top=12))
    ms = time_ms(fwdbwd)
    flops = 3.5 * 4 * batch * nheads * seqlen**2 * 128 / (2 if causal else 1)
    dkdv.CONFIGS[128] = BASE
    return dict(
        defer=os.environ.get("EXP_DEFER", "0") == "1", seqlen=seqlen, causal=causal, stages=stages,
        dkdv_device_ms=kernel_ms, fwdbwd_ms=ms, fwdbwd_tflops=flops / ms / 1e9, dkdv_max_rel_diff_vs_portable=diff,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--stages", type=int, nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--label", default="", help="recorded in each row (another experiment's setting)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("exp_dkdv_defer needs a CUDA device")
    rows = []
    for seqlen in args.seqlens:
        for causal in (True, False):
            for stages in args.stages:
                rows.append({**point(seqlen, causal, stages), "label": args.label})
                write_results(args.out, rows)
                r = rows[-1]
                print(
                    f"{args.label} defer={r['defer']} n{seqlen} {'causal' if causal else 'full'} stages {stages}: dK/dV "
                    f"{r['dkdv_device_ms']:.3f} ms, fwd+bwd {r['fwdbwd_tflops']:.0f} TFLOP/s, "
                    f"diff {r['dkdv_max_rel_diff_vs_portable']:.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
