"""Session 42's ablation of the one-kernel backward (`kernels._flash_bwd_fused_hopper`) over
results/s42/ablation.patch: with EXP_NO_SYNC=1 a consumer does not wait for the other's dS^T before its
dQ product, with EXP_NO_REDUCE=1 the dQ tiles are not added to global memory (dq is then wrong: timing
only). One process per setting; prints the backward's time (do_bench median) and the fused kernel's
device time (torch.profiler), d128 full, batch x seqlen = 16k tokens, 16 heads, bf16.

    EXP_NO_SYNC=1 python benchmarks/exp_fused_ablation.py --out nosync.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_profile, time_ms, write_results  # noqa: E402
from benchmarks.exp_fused_bwd import _backward, saved_forward  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    setting = {name: os.environ.get(name, "0") for name in ("EXP_NO_SYNC", "EXP_NO_REDUCE")}
    rows = []
    for seqlen in args.seqlens:
        inputs = saved_forward(seqlen, 128, False)
        for atomic in (False, True):
            bwd = lambda atomic=atomic, t=inputs: _backward(*t, False, atomic)  # noqa: E731
            row = dict(setting, seqlen=seqlen, fused=atomic, bwd_ms=time_ms(bwd))
            row["kernels_ms"] = device_profile(bwd, steps=5, top=4)["top_kernels_ms"]
            print(row, flush=True)
            rows.append(row)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
