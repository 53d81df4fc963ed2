"""flash_decode's launch settings against the defaults (`pdl`), with SDPA cuDNN alongside, in alternating
rounds in one process. One query token, bf16, full caches; each point timed as launched (`time_ms`) and
replayed from a CUDA graph (`graph_time_ms`). Reports per point the medians over rounds and the ratios to
`pdl`. The variants (`VARIANTS`, `--impls`), each `kernels.decode`'s settings for the call:

- `ordinary`: both kernels launched the ordinary way, not as programmatic dependent launches (session 66);
- `pdl_round_up`: little work's split count rounded up at every head dim (before session 66);
- `min_tiles_4`: splits of at least 4 key tiles (before session 67); `stages_3`: 3 pipeline stages;
- `pdl_gqa`: programmatic dependent launches under GQA at every head dim (default: up to 64; sessions 66
  and 71 measured them slower at d128);
- `before_s71`: no PDL under GQA, and little work at d64 in 4 programs per SM rounded up (session 71's call 5
  timed today's defaults as `fill5_pdl_gqa` against it: floor(5 x SMs / items) splits, one wave of the 5
  programs an SM holds at 88 registers, and PDL under GQA);
- `layout_min_tiles_2` (with `--layout`): a layout's lists split into at least 2 tiles, not 1 (before session 70;
  its call 9 ran the other way round, as `min_tiles_1`: MIN_SPLIT_TILES=1 when the lists took that floor).
`--layout butterfly|random` times ours through a block-sparse layout (`bench_decode.py`'s), cuDNN dense.

Dropped variants and the commits they ran at: session 66's merge inside the split kernel (this file as
ab_decode_merge.py, commit 61c1f50) and its cap at a table of programs an SM holds (`pdl_no_cap`); session
67's K and V read through TMA descriptors (call 4, commit 2d3f4f6) and kv heads packed side by side in one
key tile (call 5, commit 2dcdc26); session 68's warps each on their own slice of a key tile with its own
softmax state (`slices_4`, `slices_4_d128_regs168`, call 1, commit 44eebb5); session 70's copy of each head's keep
beside a per-head layout's tile list (`keep_from_layout`, call 6, commit 34de7e2).

    python benchmarks/ab_decode_launch.py --rounds 5 --out ab_decode_launch.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_decode import layout_for, make_call  # noqa: E402
from benchmarks.common import (  # noqa: E402
    graph_time_ms,
    print_summary,
    rotated,
    time_ms,
    with_settings,
    write_results,
)
from kernels import decode  # noqa: E402

# (nheads, nheads_kv, headdim): GPT-2 medium's heads, a Llama-like GQA and MHA at d128
HEADS = {
    "d64_mha16": (16, 16, 64),
    "d64_gqa16_4": (16, 4, 64),
    "d64_gqa32_8": (32, 8, 64),
    "d128_gqa32_8": (32, 8, 128),
    "d128_mha32": (32, 32, 128),
}


# Our launch variants, each `kernels.decode`'s settings for the call; `pdl` (the defaults) is the base of
# the ratios.
VARIANTS = {
    "pdl": {},
    "ordinary": dict(DECODE_PDL=False),
    "pdl_round_up": dict(ROUND_DOWN_HEAD_DIM=None),
    "min_tiles_4": dict(MIN_SPLIT_TILES=4),  # (before session 67)
    "stages_3": dict(SPLIT_STAGES=3),
    "pdl_gqa": dict(PDL_GQA_MAX_HEAD_DIM=256),  # under GQA at every head dim
    # before session 71: no PDL under GQA, little work at d64 rounded up at 4 programs per SM
    "before_s71": dict(PDL_GQA_MAX_HEAD_DIM=0, SPLITS_PER_SM_SMALL_WORK_D64=4, ROUND_DOWN_HEAD_DIM=128),
    "layout_min_tiles_2": dict(LAYOUT_MIN_SPLIT_TILES=2),  # (with --layout: before session 70's call 9)
}


def point(
    heads: str, batch: int, cache_len: int, rounds: int, impls: list[str], layout: str | None = None
) -> dict:
    """One (heads, batch, cache) point; with `layout`, ours decodes through that block-sparse layout
    (`bench_decode.layout_for`: 128-blocks, random at 10% a pattern per head) and cuDNN stays dense."""
    nheads, nheads_kv, headdim = HEADS[heads]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 1, nheads, headdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(batch, cache_len, nheads_kv, headdim, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2))  # fmt: skip
    seqlens = torch.full((batch,), cache_len, device="cuda", dtype=torch.int32)
    ours = make_call("triton", q, k, v, seqlens)
    if layout is not None:
        ours = make_call(
            "triton_layout", q, k, v, seqlens, layout_for(layout, cache_len, 128, nheads, 0.1, "cuda")
        )
    calls = {"pdl": ours}
    for name in impls:
        calls[name] = make_call("sdpa_cudnn", q, k, v, seqlens) if name == "cudnn" else (
            with_settings(ours, decode, **VARIANTS[name]))  # fmt: skip
    base = calls["pdl"]().float()
    row = dict(heads=heads, batch=batch, cache_len=cache_len, nheads=nheads, nheads_kv=nheads_kv,
               headdim=headdim, layout=layout)  # fmt: skip
    for name in calls:  # our variants bitwise alike? (cuDNN's rounding differs)
        row[f"{name}_max_abs_diff"] = (calls[name]().float() - base).abs().max().item()
    times = {f"{name}_{how}_ms": [] for name in calls for how in ("eager", "graph")}
    for r in range(rounds):
        for name in rotated(list(calls), r):
            times[f"{name}_eager_ms"].append(time_ms(calls[name]))
            times[f"{name}_graph_ms"].append(graph_time_ms(calls[name]))
    row.update(times)
    for key, values in times.items():
        row[key.replace("_ms", "_median")] = statistics.median(values)
    for how in ("eager", "graph"):
        pdl = times[f"pdl_{how}_ms"]
        for other in (name for name in calls if name != "pdl"):
            ratios = [o / s for o, s in zip(times[f"{other}_{how}_ms"], pdl, strict=True)]
            row[f"{other}_over_pdl_{how}"] = statistics.median(ratios)
            row[f"{other}_over_pdl_{how}_range"] = [min(ratios), max(ratios)]
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--heads", nargs="+", choices=list(HEADS), default=["d64_mha16", "d128_gqa32_8", "d128_mha32"]
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cache-lens", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--impls",
        nargs="+",
        choices=[*VARIANTS, "cudnn"],
        default=["ordinary", "pdl_round_up", "cudnn"],
        help="timed against `pdl` (the defaults)",
    )
    parser.add_argument(
        "--layout", choices=["butterfly", "random"], default=None,
        help="ours through a block-sparse layout (bench_decode.py's), cuDNN dense",
    )  # fmt: skip
    parser.add_argument("--out", default="ab_decode_launch.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: this A/B times GPU kernels")
    rows = []
    for heads in args.heads:
        for batch in args.batches:
            for cache_len in args.cache_lens:
                rows.append(
                    point(
                        heads,
                        batch,
                        cache_len,
                        args.rounds,
                        [i for i in args.impls if i != "pdl"],
                        args.layout,
                    )
                )
                print_summary(rows[-1])
                write_results(
                    args.out, rows, extra={"seqlen_q": 1, "dtype": "bfloat16", "rounds": args.rounds}
                )
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
