"""The block-sparse backward's two routes, the portable kernels (dq, then dK/dV) and the Hopper ones
(Gluon dq and dK/dV), over butterfly layouts from one block per row upwards: device time of the backward
alone, replayed from CUDA graphs (which decided the Hopper route's former floor on tiles per program).

    python benchmarks/check_bs_bwd_routes.py --headdims 64 128 --seqlens 4096 16384 --out routes.json

The Hopper route's gradients are compared with the portable route's (max abs difference, bf16).
(results/s31/call4-5 were taken by this script's first version, check_bs_fused_bwd.py, which also timed
a one-launch portable backward, since removed: slower than the two kernels at every config tried.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_block_sparse import BLOCK, butterfly_config  # noqa: E402
from benchmarks.common import graph_time_ms, write_results  # noqa: E402
from kernels import _block_sparse_hopper, block_sparse  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402

# butterfly (n_factors, local_blocks) on 128-blocks: 1, 2, 3, 4, 6, 8 and more blocks per row
LAYOUTS = [butterfly_config(fl) for fl in ("0:0", "1:0", "0:1", "2:0", "3:0", "5:0", "7:0", "7:4")]


@contextlib.contextmanager
def forced_route(route: str):
    """Block-sparse backwards inside go to `route` ("portable" or "hopper")."""
    saved = _block_sparse_hopper.BACKWARD_ENABLED
    _block_sparse_hopper.BACKWARD_ENABLED = route == "hopper"
    try:
        yield
    finally:
        _block_sparse_hopper.BACKWARD_ENABLED = saved


def backward_fn(route, q, k, v, do, out, lse, layout, scale):
    def run():
        with forced_route(route):
            return block_sparse._block_sparse_backward(do, q, k, v, out, lse, layout, False, scale, 0.0, 0)

    return run


def hopper_fits(q, k, v, do, out, layout) -> bool:
    """Whether the Hopper backward takes this call."""
    with forced_route("hopper"):
        return _block_sparse_hopper.usable_backward(q, k, v, do, out, layout, 0.0, lse_grad=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--layouts", nargs="+", type=butterfly_config, default=LAYOUTS, metavar="F:L",
                        help="butterfly n_factors:local_blocks pairs (default: LAYOUTS)")  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for d in args.headdims:
        for n in args.seqlens:
            q, k, v, do = (
                torch.randn(1, n, args.nheads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)
            )
            scale = d**-0.5
            levels = (-(-n // BLOCK) - 1).bit_length()
            for butterfly in args.layouts:
                if butterfly["n_factors"] > levels:
                    continue
                layout = butterfly_layout(n, BLOCK, **butterfly).cuda()
                lists = layout.block_lists(n, n)
                blocks = (lists.row_full_cnt + lists.row_part_cnt).float().mean().item()
                out, lse = block_sparse._block_sparse_forward(q, k, v, layout, False, scale, 0.0, 0)
                want = backward_fn("portable", q, k, v, do, out, lse, layout, scale)()
                for route in ("portable", "hopper"):
                    fn = backward_fn(route, q, k, v, do, out, lse, layout, scale)
                    if route == "hopper" and not hopper_fits(q, k, v, do, out, layout):
                        continue
                    got = fn()
                    diff = max(
                        (g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True)
                    )
                    ms = graph_time_ms(fn)
                    row = dict(headdim=d, seqlen=n, **butterfly,
                               density=layout.density, blocks_per_row=blocks, route=route, bwd_ms=ms, max_abs_diff=diff)  # fmt: skip
                    rows.append(row)
                    print(f"d{d} n{n} {blocks:5.1f} blocks/row {route:8s} {ms:.4f} ms  diff {diff:.2e}",
                          flush=True)  # fmt: skip
                write_results(args.out, rows, {})


if __name__ == "__main__":
    main()
