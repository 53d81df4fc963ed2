"""Programmatic dependent launch (PDL) of the Gluon kernels off and on (`kernels._launch.PDL`),
alternating in one process (GPU only): short calls, where each kernel's launch and set-up is a
visible share of the time.

Points: dense attention at the issue's shapes (batch x seqlen = 16k tokens, nheads x headdim = 2048)
and block-sparse butterfly layouts on 128-blocks (batch 1, 16 heads), bf16, fwd+bwd. Each point: the
call replayed from a CUDA graph (device time, what PDL can change) and eager, off and on in `--rounds`
rounds (each round starts with the other setting, `common.rotated`), the median of each kept; the
kernels' summed device time from a profile of the graph's replay, off and on (the graph's time less
that sum is the device's idle time between kernels); out and gradients of the two settings compared
bit for bit; and an anchor timed the same way: SDPA cuDNN for dense points, FlexAttention compiled
for the same block mask for block-sparse ones.

    python benchmarks/ab_pdl.py --out ab_pdl.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import issue_shape, make_impl  # noqa: E402
from benchmarks.bench_block_sparse import butterfly_points, flex_block_mask, flex_fn  # noqa: E402
from benchmarks.common import (  # noqa: E402
    capture_graph,
    device_profile,
    graph_time_ms,
    markdown_table,
    rotated,
    time_ms,
    versions,
    write_results,
)
from kernels import _launch  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402


def _fwdbwd(fn, q, k, v, do):
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do)


def _inputs(shape, transpose=False):
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    if transpose:  # (SDPA's and Flex's (B, H, N, d))
        q, k, v, do = (x.transpose(1, 2).contiguous() for x in (q, k, v, do))
    return [x.requires_grad_() for x in (q, k, v)] + [do]


def _outputs(fn, q, k, v, do):
    out = fn(q, k, v)
    return [out.detach().clone(), *torch.autograd.grad(out, (q, k, v), do)]


def _kernels_ms(call) -> float:
    """The kernels' summed device time of one replay of call's graph (profiled over 5 replays)."""
    graph, _ = capture_graph(call)
    return device_profile(graph.replay, steps=5)["kernels_ms"]


def ab_point(fn, q, k, v, do, rounds: int) -> dict:
    """fn's fwd+bwd with PDL off and on, alternating; PDL is as it was when this returns."""
    saved = _launch.PDL
    call = _fwdbwd(fn, q, k, v, do)
    times = {(pdl, kind): [] for pdl in (False, True) for kind in ("graph", "eager")}
    results, kernels = {}, {}
    try:
        for pdl in (False, True):  # (first calls: builds and lists outside the timings)
            _launch.PDL = pdl
            results[pdl] = _outputs(fn, q, k, v, do)
            kernels[pdl] = _kernels_ms(call)
        for r in range(rounds):
            for pdl in rotated((False, True), r):
                _launch.PDL = pdl
                times[pdl, "graph"].append(graph_time_ms(call))
                times[pdl, "eager"].append(time_ms(call, warmup_ms=10, rep_ms=50))
    finally:
        _launch.PDL = saved
    row = {f"{'on' if pdl else 'off'}_{kind}_ms": statistics.median(ts) for (pdl, kind), ts in times.items()}
    row |= {f"{'on' if pdl else 'off'}_kernels_ms": kernels[pdl] for pdl in (False, True)}
    row["on_speedup_graph"] = row["off_graph_ms"] / row["on_graph_ms"]
    row["on_speedup_eager"] = row["off_eager_ms"] / row["on_eager_ms"]
    row["bitwise_equal"] = all(torch.equal(a, b) for a, b in zip(results[False], results[True], strict=True))
    return row


def anchor_ms(fn, shape) -> dict:
    q, k, v, do = _inputs(shape, transpose=True)
    call = _fwdbwd(fn, q, k, v, do)
    call()
    return dict(anchor_graph_ms=graph_time_ms(call), anchor_eager_ms=time_ms(call, warmup_ms=10, rep_ms=50))


def dense_rows(args) -> list[dict]:
    rows = []
    ours, cudnn = make_impl("triton"), make_impl("sdpa_cudnn")
    for d in args.headdims:
        for n in args.dense_seqlens:
            for causal in (True, False):
                batch, heads = issue_shape(n, d)
                shape = (batch, n, heads, d)
                row = dict(kind="dense", headdim=d, seqlen=n, causal=causal, density_pct=100.0, anchor="sdpa_cudnn")
                row |= ab_point(lambda q, k, v, c=causal: ours(q, k, v, c), *_inputs(shape), args.rounds)
                row |= anchor_ms(lambda q, k, v, c=causal: cudnn(q, k, v, c), shape)
                rows.append(_report(row))
    return rows


def block_sparse_rows(args) -> list[dict]:
    rows = []
    flex = flex_fn()
    for d in args.headdims:
        for n in args.sparse_seqlens:
            shape = (1, n, 16, d)
            for label, layout in butterfly_points(n):
                if layout.density > args.max_density:
                    continue
                layout = layout.cuda()
                mask = flex_block_mask(layout, n)
                row = dict(kind="block_sparse", headdim=d, seqlen=n, causal=False, layout=label,
                           density_pct=100 * layout.density, anchor="flex")  # fmt: skip
                row |= ab_point(lambda q, k, v, lay=layout: block_sparse_attention(q, k, v, lay), *_inputs(shape),
                                args.rounds)  # fmt: skip
                row |= anchor_ms(lambda q, k, v, m=mask: flex(q, k, v, block_mask=m), shape)
                rows.append(_report(row))
    return rows


def _report(row: dict) -> dict:
    row["off_vs_anchor_graph"] = row["anchor_graph_ms"] / row["off_graph_ms"]
    row["on_vs_anchor_graph"] = row["anchor_graph_ms"] / row["on_graph_ms"]
    row["on_vs_anchor_eager"] = row["anchor_eager_ms"] / row["on_eager_ms"]
    print({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dense-seqlens", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--sparse-seqlens", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--max-density", type=float, default=0.11)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for part in (dense_rows, block_sparse_rows):
        rows += part(args)
        write_results(args.out, rows, extra={"versions": versions()})
    cols = ["kind", "headdim", "seqlen", "causal", "density_pct", "off_graph_ms", "on_graph_ms", "on_speedup_graph",
            "off_kernels_ms", "on_kernels_ms", "off_eager_ms", "on_eager_ms", "off_vs_anchor_graph",
            "on_vs_anchor_graph", "on_vs_anchor_eager", "bitwise_equal"]  # fmt: skip
    table = markdown_table(rows, cols, floatfmt="{:.3g}")
    with open(args.out.replace(".json", ".md"), "w") as f:
        f.write(f"# fwd+bwd with PDL off / on, bf16 (anchor: SDPA cuDNN dense, Flex block-sparse)\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
