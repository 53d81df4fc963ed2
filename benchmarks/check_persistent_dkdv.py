"""The persistent variant of the Gluon dK/dV kernel (`_attn_bwd_dkdv_hopper_persistent`) against the grid
kernel, on block-sparse lists (GPU only, sm_90).

1. Correctness: dk and dv of both kernels, bitwise (each work item runs the same steps in the same order
   as a grid program), over butterfly, local and hand-made layouts (a key block no query sees, lengths
   no tile divides, Sq != Sk, GQA, causal and not), with one program per SM and with 1 and 3 programs
   (each walks many items). A mismatch names the (batch, key head, 128-key block)s that differ.
2. Speed: the dK/dV kernel alone, replayed from CUDA graphs, grid against persistent, butterfly on
   128-blocks with 0, 2 and all factors at n4k and n16k, 16 heads, batch 1.

    python benchmarks/check_persistent_dkdv.py --out persistent_dkdv.json
Exit status 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.check_persistent_dq import record_pair  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from kernels import _block_sparse_hopper as bs  # noqa: E402
from kernels import _flash_dkdv_hopper as dkdv_hopper  # noqa: E402
from kernels.layouts import BlockLayout, butterfly_layout, local_layout  # noqa: E402


def _layout(kind: str, seqlen_k: int, causal: bool) -> BlockLayout:
    if kind == "butterfly":
        return butterfly_layout(seqlen_k, 128, causal=causal)
    if kind == "diagonal":
        return butterfly_layout(seqlen_k, 128, n_factors=0)
    if kind == "butterfly2":
        return butterfly_layout(seqlen_k, 128, n_factors=2)
    if kind == "local256":
        return local_layout(seqlen_k, 256, local_blocks=1)
    mask = butterfly_layout(seqlen_k, 128).mask.clone()  # "empty": a query block and a key block unseen
    mask[:, 1] = False
    mask[:, :, 3] = False
    return BlockLayout(mask, 128)


# (batch, seqlen_q, seqlen_k, heads, kv heads, layout, causal)
CASES = [
    (1, 4096, 4096, 16, 16, "diagonal", False),
    (1, 4096, 4096, 16, 16, "butterfly", False),
    (1, 1024, 1024, 2, 2, "butterfly", False),
    (1, 1000, 1000, 2, 2, "butterfly", False),
    (2, 1000, 1000, 4, 2, "butterfly", True),
    (2, 1000, 1000, 4, 2, "empty", False),
    (2, 1000, 1000, 4, 2, "empty", True),
    (1, 700, 1500, 4, 4, "local256", True),
    (1, 1500, 700, 4, 4, "butterfly", False),
]


def case_inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, kind, causal, d, dtype):
    torch.manual_seed(seqlen_q + seqlen_k + heads)
    q = torch.randn(batch, seqlen_q, heads, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seqlen_k, kv_heads, d, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    layout = _layout(kind, max(seqlen_q, seqlen_k), causal).cuda()
    scale = d**-0.5
    out, lse = bs.block_sparse_forward_hopper(q, k, v, layout, causal, scale)
    grid_cfg = bs.CONFIGS[d][2]
    lists = bs._col_lists(layout, seqlen_q, seqlen_k, causal, grid_cfg.block_m, heads // kv_heads)
    # delta = rowsum(dO * O), as the dq kernel writes it (laid out like lse: the kernel reads both with
    # lse's strides)
    delta = torch.empty_like(lse)
    delta.copy_((do.float() * out.float()).sum(-1).transpose(1, 2))

    def run(cfg):
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        dkdv_hopper.flash_attn_dkdv_hopper(
            q, k, v, do, dk, dv, lse, delta, sm_scale=scale, causal=causal, config=cfg, lists=lists
        )
        return dk, dv

    return run


def differing_blocks(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int, int]]:
    """(batch, key head, 128-key block) where a and b differ (a, b: (batch, seqlen, heads, d))."""
    diff = (a != b).any(-1)  # (batch, seqlen, heads)
    idx = diff.nonzero().tolist()
    return sorted({(bi, hi, si // 128) for bi, si, hi in idx})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--cases", type=int, nargs="+", help="indices into CASES (default all)")
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument(
        "--programs", type=int, nargs="+", default=[0, 1, 3], help="grid sizes (0: one per SM)"
    )
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--producer-regs", type=int, help="the persistent kernel's producer registers")
    args = parser.parse_args()
    checks, rows, all_ok = [], [], True
    for d in args.headdims:
        grid_cfg = bs.CONFIGS[d][2]
        pers_cfg = dataclasses.replace(grid_cfg, persistent=True)
        if args.producer_regs:
            pers_cfg = dataclasses.replace(pers_cfg, producer_regs=args.producer_regs)
        for dtype in [getattr(torch, name) for name in args.dtypes]:
            for case in [CASES[i] for i in args.cases] if args.cases else CASES:
                run = case_inputs(*case, d, dtype)
                dk_a, dv_a = run(grid_cfg)
                for programs in args.programs:
                    real = dkdv_hopper.sm_count
                    if programs:
                        dkdv_hopper.sm_count = lambda device, n=programs: n
                    dk_b, dv_b = run(pers_cfg)
                    torch.cuda.synchronize()
                    dkdv_hopper.sm_count = real
                    ok = torch.equal(dk_a, dk_b) and torch.equal(dv_a, dv_b)
                    diffs = [
                        (a.float() - b.float()).abs().max().item() for a, b in ((dk_a, dk_b), (dv_a, dv_b))
                    ]
                    name = f"d{d} {case} {dtype} programs={programs or 'SMs'}"
                    bad = {"dk": differing_blocks(dk_a, dk_b), "dv": differing_blocks(dv_a, dv_b)}
                    checks.append(dict(check=name, bitwise_equal=ok, differing=bad))
                    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": max |diff| dk, dv {diffs}; {bad}"),
                          flush=True)  # fmt: skip
                    all_ok &= ok
    if not args.skip_speed:
        for d in args.headdims:
            grid_cfg = bs.CONFIGS[d][2]
            pers_cfg = dataclasses.replace(grid_cfg, persistent=True)
            for seqlen in (4096, 16384):
                for kind, factors in (("diagonal", 0), ("butterfly2", 2), ("butterfly", None)):
                    run = case_inputs(1, seqlen, seqlen, 16, 16, kind, False, d, torch.bfloat16)
                    record_pair(rows, f"d{d} n{seqlen} factors={factors}", run, grid_cfg, pers_cfg, first="grid",
                                headdim=d, seqlen=seqlen, n_factors=factors)  # fmt: skip
    write_results(args.out, rows, extra=dict(checks=checks, all_correct=all_ok))
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
