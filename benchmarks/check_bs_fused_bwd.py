"""The block-sparse backward in one launch against two (dq, then dK/dV) and the Hopper kernels: device
time of the backward alone, replayed from CUDA graphs, per tile config of the fused kernel, over
butterfly layouts from one block per row upwards. Picks `_FUSED_CONFIGS` and `FUSED_MAX_BLOCKS`
(kernels/block_sparse.py).

    python benchmarks/check_bs_fused_bwd.py --headdims 64 128 --seqlens 4096 16384 --out fused.json

Every variant's gradients are compared with the two-kernel route's (max abs difference, bf16).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_block_sparse import BLOCK  # noqa: E402
from benchmarks.common import graph_time_ms, write_results  # noqa: E402
from kernels import _block_sparse_hopper, block_sparse  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402

# (dq tile_m, dq tile_n, dk/dv tile_m, dk/dv tile_n, warps, stages): candidates that build for sm_90
# without spills in their loops (the d128 ones with 4 warps spill 80+ values there)
CANDIDATES = {
    64: [(128, 64, 64, 64, 8, 2), (64, 64, 64, 64, 4, 2), (64, 64, 64, 64, 4, 3), (128, 64, 64, 128, 8, 2),
         (64, 128, 64, 128, 8, 2), (128, 128, 64, 128, 8, 2)],
    128: [(128, 64, 32, 64, 8, 2), (64, 64, 32, 64, 8, 2), (64, 64, 64, 32, 8, 2), (128, 64, 64, 32, 8, 2),
          (128, 64, 64, 64, 8, 2), (64, 64, 64, 64, 8, 1)],
}  # fmt: skip
# butterfly (n_factors, local_blocks) on 128-blocks: 1, 2, 3, 4, 6, 8 and more blocks per row
LAYOUTS = [(0, 0), (1, 0), (0, 1), (2, 0), (3, 0), (5, 0), (7, 0), (7, 4)]


def backward_fn(route, cfg, q, k, v, do, out, lse, layout, scale):
    def run():
        return block_sparse._block_sparse_backward(do, q, k, v, out, lse, layout, False, scale, 0.0, 0)

    def configured():
        d = q.shape[-1]
        saved = (block_sparse.FUSED_MAX_BLOCKS, _block_sparse_hopper.BACKWARD_ENABLED,
                 _block_sparse_hopper.BACKWARD_MIN_TILES, block_sparse._FUSED_CONFIGS[d])  # fmt: skip
        block_sparse.FUSED_MAX_BLOCKS = 10**6 if route == "fused" else -1
        _block_sparse_hopper.BACKWARD_ENABLED = route == "hopper"
        _block_sparse_hopper.BACKWARD_MIN_TILES = 0
        if cfg is not None:
            block_sparse._FUSED_CONFIGS[d] = cfg
        try:
            return run()
        finally:
            (block_sparse.FUSED_MAX_BLOCKS, _block_sparse_hopper.BACKWARD_ENABLED,
             _block_sparse_hopper.BACKWARD_MIN_TILES, block_sparse._FUSED_CONFIGS[d]) = saved  # fmt: skip

    return configured


def hopper_fits(q, k, v, do, out, layout) -> bool:
    """Whether the Hopper backward takes this call whatever its tiles per program."""
    saved = _block_sparse_hopper.BACKWARD_MIN_TILES
    _block_sparse_hopper.BACKWARD_MIN_TILES = 0
    try:
        return _block_sparse_hopper.usable_backward(q, k, v, do, out, layout, False, 0.0, lse_grad=False)
    finally:
        _block_sparse_hopper.BACKWARD_MIN_TILES = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--layouts", nargs="+", default=None, metavar="F:L",
                        help="butterfly n_factors:local_blocks pairs (default: LAYOUTS)")  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    layouts = (
        LAYOUTS if args.layouts is None else [tuple(int(x) for x in fl.split(":")) for fl in args.layouts]
    )
    rows = []
    for d in args.headdims:
        for n in args.seqlens:
            q, k, v, do = (
                torch.randn(1, n, args.nheads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)
            )
            scale = d**-0.5
            levels = (-(-n // BLOCK) - 1).bit_length()
            for n_factors, local in layouts:
                if n_factors > levels:
                    continue
                layout = butterfly_layout(n, BLOCK, n_factors=n_factors, local_blocks=local).cuda()
                lists = layout.block_lists(n, n)
                blocks = (lists.row_full_cnt + lists.row_part_cnt).float().mean().item()
                out, lse = block_sparse._block_sparse_forward(q, k, v, layout, False, scale, 0.0, 0)
                base = backward_fn("two", None, q, k, v, do, out, lse, layout, scale)
                want = base()
                variants = [("two_kernels", None), ("hopper", None)] + [("fused", c) for c in CANDIDATES[d]]
                for route, cfg in variants:
                    fn = backward_fn(route, cfg, q, k, v, do, out, lse, layout, scale)
                    if route == "hopper" and not hopper_fits(q, k, v, do, out, layout):
                        continue
                    got = fn()
                    diff = max(
                        (g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True)
                    )
                    ms = graph_time_ms(fn)
                    row = dict(headdim=d, seqlen=n, n_factors=n_factors, local_blocks=local,
                               density=layout.density, blocks_per_row=blocks, route=route,
                               config=None if cfg is None else list(cfg), bwd_ms=ms, max_abs_diff=diff)  # fmt: skip
                    rows.append(row)
                    print(f"d{d} n{n} {blocks:5.1f} blocks/row {route:11s} {cfg}  {ms:.4f} ms  diff {diff:.2e}",
                          flush=True)  # fmt: skip
                write_results(args.out, rows, {})


if __name__ == "__main__":
    main()
