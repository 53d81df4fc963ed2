"""The backward's gradient sums (`kernels._grad_sums`) at each BLOCK_ROWS asked:

- the GQA route's per-kv-head dK / dV sums (`sum_head_groups`) against torch.sum over the middle dim of a
  (.., kv heads, repeat, d) view (what the route ran until session 78) and a clone of the input (the copy
  bandwidth they both aim at), at the route's sizes;
- the ordered backward's dq, its key groups' fp32 buffers summed into bf16 (`_flash_bwd_fused_hopper.
  sum_dq_buffers`, the pass `_grad_sums.sum_key_groups`, with the buffers' allocation, `dq_buffer`), against
  torch's adds of whole buffers zeroed where no program writes (TORCH_DQ_SUM, what ran until session 86; one
  group: its copy, which the backward still takes) and a clone of the buffers, at d128 16k tokens x 16 heads
  with the key groups the backward takes.

    python benchmarks/bench_grad_sums.py --block-rows 16 32 64 --out benchmarks/results/grad_sums_h200.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import issue_shape  # noqa: E402
from benchmarks.common import mean_ms, write_results  # noqa: E402
from kernels import _flash_bwd_fused_hopper as fused  # noqa: E402
from kernels import _grad_sums  # noqa: E402
from kernels._common import sm_count  # noqa: E402

# (batch, seqlen, kv heads, repeat): 32 query heads of 128 on 8 at 16k tokens, one program a query head (4)
# or two (2, full attention under 8k keys), and one sequence of 16k
SHAPES = [(4, 4096, 8, 4), (4, 4096, 8, 2), (2, 8192, 8, 4), (1, 16384, 8, 4)]
# (seqlen, causal) of the dq sums, in the issue's shapes (16k tokens x 16 heads of 128: ab_cudnn.py's settled cases)
DQ_CASES = [(4096, True), (8192, True), (16384, True), (32768, True), (65536, True), (4096, False),
            (16384, False), (65536, False)]  # fmt: skip


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
    for rows in block_rows:
        ms = _with_block_rows(
            rows, lambda: mean_ms(lambda: _grad_sums.sum_head_groups(heads, out), reps, warmup=3)
        )
        row[f"ours_{rows}_ms"] = ms
        row[f"ours_{rows}_gbps"] = moved / ms / 1e6
        row[f"ours_{rows}_equals_torch_sum"] = bool(torch.equal(out, expected))
    return row


def _with_block_rows(rows: int, fn):
    default_rows = _grad_sums.BLOCK_ROWS
    _grad_sums.BLOCK_ROWS = rows
    try:
        return fn()
    finally:  # (the module's rule as it was, for whatever runs after in this process)
        _grad_sums.BLOCK_ROWS = default_rows


def time_dq_sum(seqlen: int, causal: bool, block_rows: list[int], reps: int) -> dict:
    """Milliseconds of the dq buffers' allocation and sum, torch's way and ours at each block_rows, and a
    clone of the buffers; whether ours equals torch's sum of the zeroed buffers."""
    sms = sm_count(torch.device("cuda"))
    convoy = fused.ordered_convoy(seqlen, seqlen, causal, 1, sms)
    key_groups = fused.ordered_dq_groups(seqlen, causal, convoy, sms)
    written, step = fused.dq_rows_written(seqlen, causal, key_groups)
    batch, heads = issue_shape(seqlen, 128)
    q = torch.empty(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    dq = torch.empty_like(q)
    row = dict(seqlen=seqlen, causal=causal, batch=batch, heads=heads, headdim=128, key_groups=key_groups,
               groups_written=written, first_row_step=step)  # fmt: skip
    values = torch.randn((key_groups * q.shape[0], *q.shape[1:]), device="cuda") * 1e3
    per_group = values.view(key_groups, *q.shape)
    zeroed = values.clone()  # (torch's way: zeros where no program writes)
    fused.zero_unwritten(zeroed.view(key_groups, *q.shape), written, step)
    values_read = sum(per_group[g, :, g * step :].numel() for g in range(written))
    moved = values_read * 4 + dq.numel() * dq.element_size()

    def buffer_and_sum(one_pass: bool):
        acc = fused.dq_buffer(q, seqlen, causal, key_groups, True)
        if one_pass:  # (the pass itself, also where one group takes torch's copy)
            _grad_sums.sum_key_groups(acc, dq, written, step)
        else:
            fused.sum_dq_buffers(acc, dq, seqlen, causal, key_groups)

    fused.TORCH_DQ_SUM = True
    try:
        row["torch_ms"] = mean_ms(lambda: buffer_and_sum(False), reps, warmup=3)
        expected = fused.sum_dq_buffers(zeroed, torch.empty_like(dq), seqlen, causal, key_groups)
    finally:
        fused.TORCH_DQ_SUM = False
    row["clone_ms"] = mean_ms(lambda: values.clone(), reps, warmup=3)
    row["ours_bytes"] = moved
    for rows in block_rows:
        row[f"ours_{rows}_ms"] = _with_block_rows(
            rows, lambda: mean_ms(lambda: buffer_and_sum(True), reps, warmup=3)
        )
        row[f"ours_{rows}_gbps"] = moved / row[f"ours_{rows}_ms"] / 1e6
        _with_block_rows(rows, lambda: _grad_sums.sum_key_groups(values, dq, written, step))
        row[f"ours_{rows}_equals_torch"] = bool(torch.equal(dq, expected))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-rows", type=int, nargs="+", default=[_grad_sums.BLOCK_ROWS],
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
        parser.error("bench_grad_sums.py times CUDA kernels: run it on a GPU machine")
    rows = []
    for shape in SHAPES:
        rows.append(dict(sum="heads", **time_shape(*shape, args.block_rows, args.reps)))
        print(rows[-1], flush=True)
    for case in DQ_CASES:
        rows.append(dict(sum="dq", **time_dq_sum(*case, args.block_rows, args.reps)))
        print(rows[-1], flush=True)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
