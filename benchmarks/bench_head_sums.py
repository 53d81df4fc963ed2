"""The GQA backward route's per-kv-head dK / dV sums (`kernels._head_sums.sum_head_groups`) against
torch.sum over the middle dim of a (.., kv heads, repeat, d) view (what the route ran until session 78) and
a clone of the input (the copy bandwidth they both aim at), at the route's sizes, for each BLOCK_ROWS asked.

    python benchmarks/bench_head_sums.py --block-rows 16 32 64 --out benchmarks/results/head_sums_h200.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import mean_ms, write_results  # noqa: E402
from kernels import _head_sums  # noqa: E402

# (batch, seqlen, kv heads, repeat): 32 query heads of 128 on 8 at 16k tokens, one program a query head (4)
# or two (2, full attention under 8k keys), and one sequence of 16k
SHAPES = [(4, 4096, 8, 4), (4, 4096, 8, 2), (2, 8192, 8, 4), (1, 16384, 8, 4)]


def time_shape(batch: int, seqlen: int, kv: int, repeat: int, block_rows: list[int], reps: int) -> dict:
    """Milliseconds and GB/s of torch.sum, a clone and ours at each block_rows; whether ours equals torch.sum."""
    heads = torch.randn(batch, seqlen, kv * repeat, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(batch, seqlen, kv, 128, device="cuda", dtype=torch.bfloat16)
    view = heads.view(batch, seqlen, kv, repeat, 128)
    moved = (heads.numel() + out.numel()) * heads.element_size()
    row = dict(batch=batch, seqlen=seqlen, kv_heads=kv, repeat=repeat, headdim=128, dtype="bfloat16")
    row["torch_sum_ms"] = mean_ms(lambda: torch.sum(view, dim=-2, out=out), reps, warmup=3)
    row["clone_ms"] = mean_ms(lambda: heads.clone(), reps, warmup=3)
    row["torch_sum_gbps"] = moved / row["torch_sum_ms"] / 1e6
    row["clone_gbps"] = 2 * heads.numel() * heads.element_size() / row["clone_ms"] / 1e6
    expected = torch.sum(view, dim=-2)
    default_rows = _head_sums.BLOCK_ROWS
    try:
        for rows in block_rows:
            _head_sums.BLOCK_ROWS = rows
            ms = mean_ms(lambda: _head_sums.sum_head_groups(heads, out), reps, warmup=3)
            row[f"ours_{rows}_ms"] = ms
            row[f"ours_{rows}_gbps"] = moved / ms / 1e6
            row[f"ours_{rows}_equals_torch_sum"] = bool(torch.equal(out, expected))
    finally:  # (the module's rule as it was, for whatever runs after in this process)
        _head_sums.BLOCK_ROWS = default_rows
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-rows", type=int, nargs="+", default=[_head_sums.BLOCK_ROWS],
                        help="output rows a program sums (powers of two)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    bad = [r for r in args.block_rows if r < 1 or r & (r - 1)]
    if bad or args.reps < 1:
        parser.error(
            f"--block-rows takes powers of two and --reps at least 1, got {args.block_rows} / {args.reps}"
        )
    if not torch.cuda.is_available():
        parser.error("bench_head_sums.py times CUDA kernels: run it on a GPU machine")
    rows = []
    for shape in SHAPES:
        rows.append(time_shape(*shape, args.block_rows, args.reps))
        print(rows[-1], flush=True)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
