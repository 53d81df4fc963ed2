"""The persistent variant of the Gluon dq kernel (`_attn_bwd_dq_hopper_persistent`) against the
row-tile kernel it walks the grid of (GPU only, sm_90).

1. Correctness: dq and delta of both kernels, dense (causal and full, GQA, lengths that no tile divides,
   more programs than work items and fewer) and block-sparse (butterfly layouts at d128 and d64,
   causal and not), bf16 and fp16: bitwise equal (each work item runs the same steps in the same
   order as a row-tile program; the row-tile kernel's own accuracy is what the GPU tests check).
2. Speed: the dq kernel alone, replayed from CUDA graphs, row-tile against persistent: dense d128 at
   the benchmark's shapes (batch x seqlen = 16k tokens, 16 heads) and block-sparse n4k / n16k, 16 heads,
   batch 1, butterfly on 128-blocks with 0 (the diagonal), 2 and all factors.

    python benchmarks/check_persistent_dq.py --out persistent_dq.json
Exit status 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import graph_time_ms, write_results  # noqa: E402
from kernels import _block_sparse_hopper as bs  # noqa: E402
from kernels import _flash_dq_hopper as dq_hopper  # noqa: E402
from kernels import _flash_fwd_hopper as fwd_hopper  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402

# (batch, seqlen_q, seqlen_k, heads, kv heads, causal)
DENSE_SHAPES = [
    (2, 1000, 1000, 4, 4, True),
    (2, 1000, 1000, 4, 4, False),
    (1, 1500, 1200, 8, 2, True),  # GQA, bottom-right causal with fewer keys
    (1, 1200, 1500, 8, 2, True),
    (1, 1024, 1024, 2, 2, True),  # 16 items: fewer than the SMs
    (3, 4096, 4096, 16, 4, True),  # ~3 items per program
    (3, 4096, 4096, 16, 4, False),
]
# (seqlen, heads, headdim, butterfly factors, causal)
SPARSE_SHAPES = [
    (3000, 4, 128, 2, True),
    (3000, 4, 128, None, False),
    (4096, 16, 128, 0, False),
    (4096, 16, 64, 2, True),
    (4096, 16, 64, None, False),
]


def dense_case(batch, seqlen_q, seqlen_k, heads, kv_heads, causal, d, dtype):
    q = torch.randn(batch, seqlen_q, heads, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seqlen_k, kv_heads, d, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    scale = d**-0.5
    out, lse2 = fwd_hopper.flash_attn_forward_hopper(q, k, v, sm_scale=scale, causal=causal)

    def run(cfg):
        dq, delta = torch.empty_like(q), torch.empty_like(lse2)
        return dq_hopper.flash_attn_dq_hopper(
            q, k, v, do, out, lse2, delta, dq, sm_scale=scale, causal=causal, config=cfg
        )

    return run


def sparse_case(seqlen, heads, d, factors, causal, dtype, cfg_row):
    q, k, v, do = (torch.randn(1, seqlen, heads, d, device="cuda", dtype=dtype) for _ in range(4))
    layout = butterfly_layout(seqlen, 128, n_factors=factors, causal=causal).cuda()
    scale = d**-0.5
    out, lse = bs.block_sparse_forward_hopper(q, k, v, layout, causal, scale)
    tiles, counts, _ = bs._row_lists(layout, seqlen, seqlen, causal, cfg_row.block_n)

    def run(cfg):
        dq, delta = torch.empty_like(q), torch.empty_like(lse)
        return dq_hopper.flash_attn_dq_hopper(
            q, k, v, do, out, lse, delta, dq, sm_scale=scale, causal=causal, config=cfg, lists=(tiles, counts)
        )

    return run


def compare(name, run, cfg_row, cfg_persistent, results) -> bool:
    dq_a, delta_a = run(cfg_row)
    dq_b, delta_b = run(cfg_persistent)
    torch.cuda.synchronize()
    ok = torch.equal(dq_a, dq_b) and torch.equal(delta_a, delta_b)
    diff = (dq_a.float() - dq_b.float()).abs().max().item()
    nan = bool(torch.isnan(dq_b).any())
    results.append(dict(check=name, bitwise_equal=ok, max_abs_diff=diff, nan=nan))
    print(
        f"{'ok  ' if ok and not nan else 'FAIL'} {name}: bitwise equal {ok}, max |diff| {diff:.3g}",
        flush=True,
    )
    return ok and not nan


def both_ms(run, cfg_row, cfg_persistent) -> tuple[float, float]:
    """ms of the row-tile and persistent dq kernels replayed from CUDA graphs, each the lower of two
    timings taken alternately."""
    times = [graph_time_ms(lambda cfg=cfg: run(cfg)) for cfg in (cfg_row, cfg_persistent) * 2]
    return min(times[0::2]), min(times[1::2])


def record_pair(rows, label, run, cfg_first, cfg_persistent, first="row_tile", **fields) -> None:
    """Times run's first kernel (`first`: its name in the row, row_tile or grid) and its persistent
    variant (`both_ms`), appends fields with both times and first ÷ persistent to rows, and prints it."""
    first_ms, pers_ms = both_ms(run, cfg_first, cfg_persistent)
    rows.append(
        dict(**fields, **{f"{first}_ms": first_ms}, persistent_ms=pers_ms, speedup=first_ms / pers_ms)
    )
    print(f"{label}: {first.replace('_', '-')} {first_ms:.4f} ms, persistent {pers_ms:.4f} "
          f"({first_ms / pers_ms:.3f}x)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    checks, rows, all_ok = [], [], True
    row128 = dq_hopper.CONFIGS[128]
    pers128 = dq_hopper.PERSISTENT_CONFIGS[128]
    row64, (pers64, _) = bs.CONFIGS[64][1], bs.PERSISTENT_DQ[64]  # (the configs block-sparse dispatches)
    for dtype in (torch.bfloat16, torch.float16):
        for shape in DENSE_SHAPES:
            run = dense_case(*shape, 128, dtype)
            all_ok &= compare(f"dense d128 {shape} {dtype}", run, row128, pers128, checks)
        for seqlen, heads, d, factors, causal in SPARSE_SHAPES:
            row, pers = (row128, pers128) if d == 128 else (row64, pers64)
            run = sparse_case(seqlen, heads, d, factors, causal, dtype, row)
            all_ok &= compare(f"sparse d{d} n{seqlen} h{heads} f{factors} causal={causal} {dtype}", run, row, pers,
                              checks)  # fmt: skip
    if not args.skip_speed:
        for seqlen in (1024, 4096, 16384):
            for causal in (True, False):
                run = dense_case(16384 // seqlen, seqlen, seqlen, 16, 16, causal, 128, torch.bfloat16)
                record_pair(rows, f"dense d128 n{seqlen} causal={causal}", run, row128, pers128, case="dense",
                            headdim=128, seqlen=seqlen, causal=causal)  # fmt: skip
        for d, (row, pers) in ((128, (row128, pers128)), (64, (row64, pers64))):
            for seqlen in (4096, 16384):
                for factors in (0, 2, None):
                    run = sparse_case(seqlen, 16, d, factors, False, torch.bfloat16, row)
                    record_pair(rows, f"block-sparse d{d} n{seqlen} factors={factors}", run, row, pers,
                                case="block_sparse", headdim=d, seqlen=seqlen, n_factors=factors)  # fmt: skip
    write_results(args.out, rows, extra=dict(checks=checks, all_correct=all_ok))
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
