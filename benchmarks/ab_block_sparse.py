"""Block-sparse fwd+bwd with a change to `kernels._block_sparse_hopper`'s routes off and on (`VARIANTS`),
alternating in one process (GPU only), beside FlexAttention on the same mask: the end-to-end check a
kernel route needs before it becomes the default.

Butterfly layouts on 128-blocks up to --max-density, batch 1, 16 heads, bf16. Each point: fwd+bwd
replayed from a CUDA graph (device time) and eager (host time included), each setting timed
alternately twice and the lower kept; every variant named is timed at every point, each against the
state the run started from.

    python benchmarks/ab_block_sparse.py --variants persistent_dq --out ab.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_block_sparse import butterfly_points, flex_block_mask, flex_fn, graph_timed, timed  # noqa: E402
from benchmarks.common import markdown_table, write_results  # noqa: E402
from kernels import _block_sparse_hopper as bs  # noqa: E402
from kernels import _flash_dkdv_hopper as dkdv_hopper  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402


def _persistent_dq(on: bool) -> None:
    bs.PERSISTENT_DQ_ENABLED = on


def _persistent_everywhere(table: dict, headdim: int, on: bool) -> None:
    """A persistent-variant rule (`bs.PERSISTENT_FORWARD`, `PERSISTENT_DQ` or `PERSISTENT_DKDV`) at
    headdim: on, its persistent config at every list length; off, at none."""
    table[headdim] = (table[headdim][0], math.inf if on else -1)


def _d128_persistent_dq(on: bool) -> None:
    """On: the d128 dq kernel's persistent variant at every list length, off: never."""
    _persistent_everywhere(bs.PERSISTENT_DQ, 128, on)


def _d64_persistent_forward(on: bool) -> None:
    """On: the d64 forward's persistent variant at every list length, off: never."""
    _persistent_everywhere(bs.PERSISTENT_FORWARD, 64, on)


def _persistent_dkdv(on: bool) -> None:
    """On: the dK/dV kernel's persistent variant at every list length, off: never (both head dims)."""
    for d in bs.PERSISTENT_DKDV:
        _persistent_everywhere(bs.PERSISTENT_DKDV, d, on)


def _d128_row_tile_forward(on: bool) -> None:
    """On: the d128 forward's row-tile kernel (128-key tiles) at every list length, off: its persistent
    variant (64-key tiles) at every length."""
    _persistent_everywhere(bs.PERSISTENT_FORWARD, 128, not on)


def _d128_persistent_128key_forward(on: bool) -> None:
    """The d128 forward's persistent variant on 128-key tiles in K and V rings of their own (the dense
    path's since session 76, `_flash_fwd_hopper.PERSISTENT_CONFIGS[128]`) up to 10 of them a program (on),
    or on 64-key tiles up to 20 (off: `PERSISTENT_64KEY`, the rule since session 39): the same key range."""
    fwd = bs.fwd_hopper
    bs.PERSISTENT_FORWARD[128] = (fwd.PERSISTENT_CONFIGS[128], 10) if on else (fwd.PERSISTENT_64KEY, 20)


def _row_tile_forward_turns(on: bool) -> None:
    """The row-tile forward's consumers taking turns (`_flash_fwd_hopper.wait_turn`) on, off (both head dims)."""
    for d, (fwd, dq, dkdv) in bs.CONFIGS.items():
        bs.CONFIGS[d] = (dataclasses.replace(fwd, pingpong=on), dq, dkdv)


def _persistent_forward_turns(on: bool) -> None:
    """The persistent forward's consumers taking turns on, off (both head dims)."""
    for d, (cfg, up_to) in bs.PERSISTENT_FORWARD.items():
        bs.PERSISTENT_FORWARD[d] = (dataclasses.replace(cfg, pingpong=on), up_to)


BS_D64_DKDV = bs.CONFIGS[64][2]  # (block-sparse d64's grid dK/dV config, 64-query steps)


def _d64_dkdv_128_query_steps(on: bool) -> None:
    """On: the d64 dK/dV kernel, grid and persistent, on the dense path's 128-query steps, two stages
    (`_flash_dkdv_hopper.CONFIGS[64]`); off: both on the grid kernel's 64-query steps, four stages (the
    routes before session 61, which kept 128 for the persistent variant alone)."""
    steps = dkdv_hopper.CONFIGS[64] if on else BS_D64_DKDV
    _set_d64_dkdv(steps, persistent=steps)


def _d64_grid_dkdv_128_query_steps(on: bool) -> None:
    """On: the d64 grid dK/dV kernel (long lists; the persistent variant takes 128-query steps already)
    on 128-query steps with three stages (at two its causal build spills in its loops); off: 64-query
    steps, four stages."""
    _set_d64_dkdv(dataclasses.replace(dkdv_hopper.CONFIGS[64], stages=3) if on else BS_D64_DKDV)


def _set_d64_dkdv(grid, persistent=None) -> None:
    """The d64 dK/dV kernel's config for long lists (`bs.CONFIGS`), and with persistent that of its
    persistent variant (`bs.PERSISTENT_DKDV`, its list-length rule kept)."""
    fwd, dq, _ = bs.CONFIGS[64]
    bs.CONFIGS[64] = (fwd, dq, grid)
    if persistent is not None:
        bs.PERSISTENT_DKDV[64] = (dataclasses.replace(persistent, persistent=True), bs.PERSISTENT_DKDV[64][1])


def _d128_one_kernel(ordered: bool):
    def set_route(on: bool) -> None:
        """On: d128's backward through the one-kernel backward (`bs.ONE_KERNEL_BACKWARD`) at every list
        length, its dQ adds in key-tile order (ordered) or as they land; off: the two kernels."""
        bs.ONE_KERNEL_BACKWARD[128] = (ordered, 0.0) if on else None

    return set_route


def _d128_first_stores(on: bool) -> None:
    """The ordered one-kernel backward at every list length (d128), each item's first adder storing (on)
    or adding into a zero-filled buffer (off: `_flash_bwd_fused_hopper.FIRST_STORES`)."""
    bs.ONE_KERNEL_BACKWARD[128] = (True, 0.0)
    bs.fused_bwd.FIRST_STORES = on


def _dependent_dkdv(on: bool) -> None:
    """The two-kernel backward's dK/dV kernel launched dependent on the dq kernel at any number of dq work
    items (on) or the ordinary way (off: `_flash_dkdv_hopper.DEPENDENT_AFTER_DQ`, `DEPENDENT_MAX_ITEMS_PER_SM`)."""
    dkdv_hopper.DEPENDENT_AFTER_DQ = on
    dkdv_hopper.DEPENDENT_MAX_ITEMS_PER_SM = math.inf


# name: set(on), for routes read at every call
VARIANTS = {
    "dependent_dkdv": _dependent_dkdv,
    "d128_one_kernel_backward": _d128_one_kernel(True),
    "d128_one_kernel_backward_unordered": _d128_one_kernel(False),
    "d128_first_stores": _d128_first_stores,
    "d64_dkdv_128_query_steps": _d64_dkdv_128_query_steps,
    "d64_grid_dkdv_128_query_steps": _d64_grid_dkdv_128_query_steps,
    "persistent_dq": _persistent_dq,
    "d128_persistent_dq": _d128_persistent_dq,
    "d64_persistent_forward": _d64_persistent_forward,
    "persistent_dkdv": _persistent_dkdv,
    "d128_row_tile_forward": _d128_row_tile_forward,
    "d128_persistent_128key_forward": _d128_persistent_128key_forward,
    "row_tile_forward_turns": _row_tile_forward_turns,
    "persistent_forward_turns": _persistent_forward_turns,
}


def routes() -> tuple:
    """A copy of every route setting a variant changes (`restore_routes` puts one back)."""
    return (bs.PERSISTENT_DQ_ENABLED, dict(bs.PERSISTENT_DQ), dict(bs.PERSISTENT_FORWARD), dict(bs.PERSISTENT_DKDV),
            dict(bs.CONFIGS), dict(bs.ONE_KERNEL_BACKWARD), bs.fused_bwd.FIRST_STORES,
            dkdv_hopper.DEPENDENT_AFTER_DQ, dkdv_hopper.DEPENDENT_MAX_ITEMS_PER_SM)  # fmt: skip


def restore_routes(state: tuple) -> None:
    (bs.PERSISTENT_DQ_ENABLED, bs.PERSISTENT_DQ, bs.PERSISTENT_FORWARD, bs.PERSISTENT_DKDV, bs.CONFIGS,
     bs.ONE_KERNEL_BACKWARD, bs.fused_bwd.FIRST_STORES, dkdv_hopper.DEPENDENT_AFTER_DQ,
     dkdv_hopper.DEPENDENT_MAX_ITEMS_PER_SM) = state  # fmt: skip


def _outputs(fn, args) -> list:
    """fn's output and q's, k's and v's gradients for the upstream gradient args[-1], as fp32 copies."""
    q, k, v, do = args
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    return [t.detach().float() for t in (out, *grads)]


def timings(fn, args) -> tuple[float, float]:
    """(fwd+bwd ms from a graph, eager fwd+bwd ms)."""
    return graph_timed(fn, *args), timed(fn, *args)[1]


def ab_point(variant: str, fn, args) -> dict:
    """The variant off and on, alternating; the routes are as they were when this returns. Also the
    largest difference between the two settings' outputs and gradients (so a timing is of a right answer)."""
    state = routes()
    results = {}
    for setting in (False, True):
        VARIANTS[variant](setting)
        results[setting] = _outputs(fn, args)
    max_diff = max((a - b).abs().max().item() for a, b in zip(results[False], results[True], strict=True))
    runs = {False: [], True: []}
    for setting in (False, True, False, True):
        VARIANTS[variant](setting)
        runs[setting].append(timings(fn, args))
    restore_routes(state)
    off_graph, off_eager = (min(t[i] for t in runs[False]) for i in (0, 1))
    on_graph, on_eager = (min(t[i] for t in runs[True]) for i in (0, 1))
    return dict(max_diff_off_on=max_diff, off_graph_ms=off_graph, on_graph_ms=on_graph, off_eager_ms=off_eager,
                on_eager_ms=on_eager, on_speedup_graph=off_graph / on_graph,
                on_speedup_eager=off_eager / on_eager)  # fmt: skip


def selected_points(seqlen: int, min_density: float, max_density: float) -> list:
    """The butterfly points (`bench_block_sparse.butterfly_points`) of seqlen whose density lies in
    [min_density, max_density]: an A/B can go straight to the points in question (each new point builds
    kernels on a fresh machine, and at n16k a whole range ran past a call's limit, results/s60)."""
    return [(cfg, lay) for cfg, lay in butterfly_points(seqlen) if min_density <= lay.density <= max_density]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--max-density", type=float, default=0.11)
    parser.add_argument("--min-density", type=float, default=0.0)
    parser.add_argument(
        "--no-flex", action="store_true", help="leave FlexAttention out (its compiles take time)"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.min_density > args.max_density:
        parser.error(f"--min-density {args.min_density} is above --max-density {args.max_density}: no point")
    flex = None if args.no_flex else flex_fn()
    rows = []
    for d in args.headdims:
        for n in args.seqlens:
            shape = (1, n, 16, d)
            q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            qh, kh, vh, doh = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, do))
            qh, kh, vh = (x.requires_grad_() for x in (qh, kh, vh))
            for cfg, layout in selected_points(n, args.min_density, args.max_density):
                layout = layout.cuda()
                ours = lambda q, k, v, lay=layout: block_sparse_attention(q, k, v, lay)  # noqa: E731
                if flex is not None:
                    mask = flex_block_mask(layout, n)
                    flex_graph, flex_eager = timings(
                        lambda q, k, v, m=mask: flex(q, k, v, block_mask=m), (qh, kh, vh, doh)
                    )
                for variant in args.variants:
                    row = dict(
                        variant=variant, seqlen=n, headdim=d, density_pct=100 * layout.density, layout=cfg
                    )
                    row |= ab_point(variant, ours, (q, k, v, do))
                    if flex is not None:
                        row |= dict(flex_graph_ms=flex_graph, flex_eager_ms=flex_eager,
                                    off_vs_flex_graph=flex_graph / row["off_graph_ms"],
                                    on_vs_flex_graph=flex_graph / row["on_graph_ms"])  # fmt: skip
                    rows.append(row)
                    print(
                        {k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}, flush=True
                    )
                    write_results(args.out, rows)
    cols = ["variant", "seqlen", "headdim", "density_pct", "off_graph_ms", "on_graph_ms", "flex_graph_ms",
            "off_vs_flex_graph", "on_vs_flex_graph", "off_eager_ms", "on_eager_ms", "flex_eager_ms"]  # fmt: skip
    table = markdown_table(rows, cols, floatfmt="{:.3g}")
    with open(args.out.replace(".json", ".md"), "w") as f:
        f.write(f"# Block-sparse fwd+bwd, variants off / on, bf16, batch 1, 16 heads\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
