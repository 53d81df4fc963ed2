"""Host time of eager attention calls with session 50's host trims against without them, the two
alternating in one process (GPU only; host time varies by a third between processes, results/s35/call1
and s50/call2).

The trims: a block-sparse backward takes its forward's answer on the Hopper kernels
(`_block_sparse_hopper.usable_backward`'s forward_hopper) instead of checking q, k and v again, and
`_hopper_pipeline.tma_ready` is a plain loop. "untrimmed" puts back the full check and the all()-over-a-
generator form (the patch: results/s50/host_trim.patch; its third change, dq/dk/dv by empty_like, stays
in both ways). Cases as `check_launch_encoding.py`'s: (1, seqlen, 16, headdim) bf16, block-sparse
(butterfly, 2 factors) and dense causal; `fwdbwd_ms` one eager fwd+bwd, calls issued back to back.

    python benchmarks/ab_host_trims.py --out host_trims.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_host_overhead import alternating_host_ms  # noqa: E402
from benchmarks.check_launch_encoding import case_fns  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from kernels import _block_sparse_hopper, _hopper_pipeline  # noqa: E402

TRIMMED = (_hopper_pipeline.tma_ready, _block_sparse_hopper.usable_backward)


def _tma_ready_untrimmed(t) -> bool:
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all((s * size) % 16 == 0 for s in t.stride()[:-1])


def _usable_backward_untrimmed(*args, forward_hopper=None, **kwargs) -> bool:
    return TRIMMED[1](*args, **kwargs)  # (forward_hopper dropped: q, k, v checked again)


WAYS = {"trimmed": TRIMMED, "untrimmed": (_tma_ready_untrimmed, _usable_backward_untrimmed)}


def use(way: str) -> None:
    _hopper_pipeline.tma_ready, _block_sparse_hopper.usable_backward = WAYS[way]


def measure(path: str, seqlen: int, headdim: int, batches: int, calls: int) -> dict:
    fwdbwd, _ = case_fns(path, seqlen, headdim)
    switches = {way: (lambda way=way: use(way)) for way in WAYS}
    times = alternating_host_ms(switches, {"fwdbwd": fwdbwd}, batches, calls)
    use("trimmed")
    row = dict(path=path, seqlen=seqlen, headdim=headdim, nheads=16, batch=1, batches=batches, calls=calls)
    for (way, _), values in times.items():
        row[f"{way}_fwdbwd_ms"] = round(statistics.median(values), 4)
        row[f"{way}_fwdbwd_range"] = [round(min(values), 4), round(max(values), 4)]
    # untrimmed / trimmed: above 1 where the trims save host time
    row["ratio"] = round(row["untrimmed_fwdbwd_ms"] / row["trimmed_fwdbwd_ms"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for headdim in args.headdims:
        for path in ("block_sparse", "dense"):
            row = measure(path, args.seqlen, headdim, args.batches, args.calls)
            rows.append(row)
            print(
                f"{path:12s} n{args.seqlen} d{headdim}: fwd+bwd {row['trimmed_fwdbwd_ms']:.3f} ms trimmed, "
                f"{row['untrimmed_fwdbwd_ms']:.3f} untrimmed ({row['ratio']:.3f}x)",
                flush=True,
            )
    write_results(args.out, rows, extra=dict(dtype="bfloat16"))


if __name__ == "__main__":
    main()
