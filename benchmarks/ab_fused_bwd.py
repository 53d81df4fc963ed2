"""The one-kernel backward (`kernels._flash_bwd_fused_hopper`) against the deterministic two kernels,
alternating in one process for several rounds: the backward alone on a saved forward (do_bench
median), d128, bf16, batch x seqlen = 16k tokens, 16 heads. Session 42 used it where single runs of
bench_attention.py and exp_fused_bwd.py disagreed (causal 16k).

    python benchmarks/ab_fused_bwd.py --causal --seqlens 8192 16384 --rounds 5 --out ab.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import rotated, time_ms, write_results  # noqa: E402
from benchmarks.exp_fused_bwd import _backward, saved_forward  # noqa: E402
from kernels import _flash_bwd_fused_hopper  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("--causal-from", type=int, default=None,
                        help="send causal calls from this many queries to the fused kernel (its CAUSAL_FROM)")  # fmt: skip
    args = parser.parse_args()
    if args.causal_from is not None:
        _flash_bwd_fused_hopper.CAUSAL_FROM = args.causal_from
    rows = []
    for seqlen in args.seqlens:
        inputs = saved_forward(seqlen, 128, args.causal)
        times = {False: [], True: []}
        for r in range(args.rounds):
            for fused in rotated((False, True), r):
                times[fused].append(time_ms(lambda f=fused, t=inputs: _backward(*t, args.causal, f)))
        row = dict(seqlen=seqlen, causal=args.causal, rounds=args.rounds, deterministic_ms=times[False],
                   fused_ms=times[True])  # fmt: skip
        row["median_ratio"] = statistics.median(times[False]) / statistics.median(times[True])
        print(row, flush=True)
        rows.append(row)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
