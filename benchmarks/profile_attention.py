"""Per-kernel device time of one attention fwd+bwd, ours against FlexAttention (or any impl of
bench_attention.py), from torch.profiler: which kernel of the backward loses where the totals differ.

    python benchmarks/profile_attention.py --shape 2,8192,16,128 --shape 2,8192,16,128,causal \\
        --impls triton flex --out profile.json

A shape is batch,seqlen,nheads,headdim[,causal] (bf16). Each impl runs a few untimed fwd+bwd (autotune,
compile), then --iters profiled ones; a kernel's time is its device total over the iterations / iters.
Block-sparse impls name a butterfly layout on 128-blocks (`kernels.layouts.butterfly_layout`):
`bs:F:L` is ours with n_factors=F and local_blocks=L, `flexbs:F:L` FlexAttention with that block mask.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import make_impl, native_shape  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from benchmarks.sweep_tiles import parse_shape  # noqa: E402


def kernel_times(impl: str, shape: dict, iters: int) -> tuple[dict[str, float], dict[str, float]]:
    """Mean device ms per fwd+bwd of each CUDA kernel the impl launches, and its launches per fwd+bwd."""
    b, n, h, d = shape["batch"], shape["seqlen"], shape["nheads"], shape["headdim"]
    layout = native_shape(impl, b, n, h, d)
    q, k, v = (torch.randn(layout, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(layout, device="cuda", dtype=torch.bfloat16)
    fn = attention_fn(impl, n, shape["causal"])

    def step():
        out = fn(q, k, v, shape["causal"])
        out.backward(do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    launches: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time / 1000 / iters  # us -> ms per iteration
            launches[event.name[:90]] += 1 / iters
    totals = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    return totals, {name: launches[name] for name in totals}


def attention_fn(impl: str, seqlen: int, causal: bool):
    """fn(q, k, v, causal) of impl: a bench_attention impl, or a block-sparse one (`block_sparse_impl`)."""
    return block_sparse_impl(impl, seqlen, causal) if ":" in impl else make_impl(impl)


def block_sparse_impl(impl: str, seqlen: int, causal: bool):
    """fn(q, k, v, causal) for `bs:F:L` (ours) or `flexbs:F:L` (FlexAttention, same block mask)."""
    from benchmarks.bench_block_sparse import BLOCK, butterfly_config, flex_block_mask, flex_fn
    from kernels import block_sparse_attention
    from kernels.layouts import butterfly_layout

    kind, _, butterfly = impl.partition(":")
    if kind not in ("bs", "flexbs"):
        raise ValueError(f"block-sparse impl {impl!r}: write bs:F:L or flexbs:F:L")
    layout = butterfly_layout(seqlen, BLOCK, **butterfly_config(butterfly), causal=causal)
    print(f"{impl}: density {layout.density:.4f}")
    if kind == "bs":
        layout = layout.cuda()
        return lambda q, k, v, causal: block_sparse_attention(q, k, v, layout, causal=causal)
    block_mask, flex = flex_block_mask(layout, seqlen), flex_fn()
    return lambda q, k, v, causal: flex(q, k, v, block_mask=block_mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape", action="append", required=True, help="batch,seqlen,nheads,headdim[,causal]"
    )
    parser.add_argument("--impls", nargs="+", default=["triton", "flex"])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    rows = []
    for text in args.shape:
        shape = parse_shape(text)
        for impl in args.impls:
            times, launches = kernel_times(impl, shape, args.iters)
            rows.append(
                {
                    **shape,
                    "impl": impl,
                    "total_ms": sum(times.values()),
                    "kernels_ms": times,
                    "launches": launches,
                }
            )
            print(f"{text} {impl}: {sum(times.values()):.3f} ms in {sum(launches.values()):.0f} launches")
            for name, ms in list(times.items())[:8]:
                print(f"    {ms:8.3f} x{launches[name]:.0f}  {name}")
            write_results(args.out, rows, {"iters": args.iters})


if __name__ == "__main__":
    main()
