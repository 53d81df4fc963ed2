"""Block-sparse attention benchmark: our kernel vs FlexAttention on the same block mask, and the dense
anchors (our FlashAttention, SDPA flash), in one run.

Butterfly layouts on 128-blocks (issue 4): batch 1, 16 heads, bf16, n = 4k / 16k / 64k, d = 64 / 128,
densities from ~1% to ~50% (fewer butterfly factors below the all-factor density, a local band above
it). For each point: fwd and fwd+bwd time of ours and of compiled FlexAttention given the same mask
through `create_block_mask`, and the ideal `our dense fwd+bwd x density`; from CUDA graphs also the time the call's fewest bytes take at
the device's copy bandwidth (measured first in the same run), the floor no density goes under.

    python benchmarks/bench_block_sparse.py                      # full sweep
    python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 --tune

--tune first times a few tile configs of each pass at n=16k and uses the fastest for the sweep.
--portable also times our portable Triton kernels where the Hopper (Gluon) path takes the call
(`kernels._block_sparse_hopper`), as impl "ours_bs_portable", in the same run.
Writes benchmarks/results/block_sparse_<gpu>.json (and .md, .png) unless --out names another path.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    copy_bandwidth,
    error_note,
    gpu_slug,
    graph_time_ms,
    markdown_table,
    time_ms,
    write_results,
)
from kernels import _block_sparse_hopper, block_sparse  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402
from kernels.layouts import BlockLayout, butterfly_layout  # noqa: E402

BLOCK = 128
TARGET_DENSITIES = [0.01, 0.02, 0.05, 0.1, 0.25, 0.5]
TUNE_CANDIDATES = {
    "fwd": [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3)],
    "dq": [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
    # 32x64 w4 and 32x128 w8 fit d128 without spilling (ptxas, sm_90); 64x64 w4 spills 156 bytes there
    "dkdv": [(32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3), (32, 128, 8, 3)],
}


def butterfly_config(text: str) -> dict:
    """ "F:L" -> the butterfly_layout keywords n_factors=F, local_blocks=L (command lines' layouts)."""
    n_factors, sep, local = text.partition(":")
    if not (sep and n_factors.isdigit() and local.isdigit()):
        raise argparse.ArgumentTypeError(
            f"butterfly layout {text!r}: write F:L (n_factors:local_blocks), e.g. 2:0"
        )
    return dict(n_factors=int(n_factors), local_blocks=int(local))


def butterfly_points(seqlen: int) -> list[tuple[dict, BlockLayout]]:
    """Butterfly configs whose densities are closest to the targets (the all-factor one always in)."""
    n = -(-seqlen // BLOCK)
    levels = max(1, (n - 1).bit_length())
    cands = {}
    for n_factors in range(levels + 1):
        for local in [0] + [2**i for i in range(levels)]:
            cfg = dict(n_factors=n_factors, local_blocks=local)
            lay = butterfly_layout(seqlen, BLOCK, **cfg)
            cands.setdefault(round(lay.density, 6), (cfg, lay))
    chosen = {round(butterfly_layout(seqlen, BLOCK).density, 6)}
    for t in TARGET_DENSITIES:
        chosen.add(min(cands, key=lambda d: abs(d - t) / t))
    return [cands[d] for d in sorted(chosen)]


_FLEX = {}


def flex_fn():
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _FLEX:
        # every seqlen/head dim recompiles; past the default limit dynamo silently falls back to eager
        # and dynamic=False: after the first recompile dynamo would otherwise make the sequence length
        # dynamic, and the dynamic-shape kernel runs up to ~25% slower than the one a user compiling for
        # one shape gets (measured 2026-11-23, benchmarks/NOTES_attention.md "FlexAttention baseline")
        torch._dynamo.config.cache_size_limit = 256
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 256
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def flex_block_mask(layout: BlockLayout, seqlen: int):
    from torch.nn.attention.flex_attention import create_block_mask

    tiles = layout.mask[0].cuda()

    def mask_mod(b, h, q_idx, kv_idx):
        return tiles[q_idx // BLOCK, kv_idx // BLOCK]

    return create_block_mask(
        mask_mod, None, None, seqlen, seqlen, device="cuda", BLOCK_SIZE=BLOCK, _compile=True
    )


def _fwdbwd(fn, q, k, v, do):
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do)


def timed(fn, q, k, v, do):
    def fwd():
        with torch.no_grad():
            return fn(q, k, v)

    fwdbwd = _fwdbwd(fn, q, k, v, do)
    fwdbwd()  # compile / build lists outside the timed region
    fwd()
    return time_ms(fwd, warmup_ms=10, rep_ms=50), time_ms(fwdbwd, warmup_ms=10, rep_ms=50)


def graph_timed(fn, q, k, v, do) -> float:
    """fwd+bwd ms replayed from a CUDA graph: without the launch work that bounds n=4k."""
    return graph_time_ms(_fwdbwd(fn, q, k, v, do))


def tune(headdim: int, nheads: int) -> dict:
    """Time each pass's candidate tile configs at n=16k, all-factor butterfly; keep the fastest."""
    seqlen = 16384
    layout = butterfly_layout(seqlen, BLOCK).cuda()
    q, k, v, do = (
        torch.randn(1, seqlen, nheads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    fn = lambda q, k, v: block_sparse_attention(q, k, v, layout)  # noqa: E731
    d_key = min(d for d in block_sparse._GPU_CONFIGS["fwd"] if d >= headdim)
    best = {}
    log = []
    for pass_name in ("fwd", "dq", "dkdv"):
        times = {}
        for cfg in TUNE_CANDIDATES[pass_name]:
            block_sparse._GPU_CONFIGS[pass_name][d_key] = cfg
            try:
                fwd_ms, fwdbwd_ms = timed(fn, q, k, v, do)
                times[cfg] = fwd_ms if pass_name == "fwd" else fwdbwd_ms
            except Exception as exc:  # a config that does not fit (shared memory) is just skipped
                times[cfg] = None
                print(f"tune {pass_name} {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        ok = {c: t for c, t in times.items() if t is not None}
        best[pass_name] = min(ok, key=ok.get)
        block_sparse._GPU_CONFIGS[pass_name][d_key] = best[pass_name]
        log += [dict(pass_=pass_name, headdim=headdim, config=list(c), ms=t) for c, t in times.items()]
        print(f"tune d={headdim} {pass_name}: " + ", ".join(f"{c}: {t}" for c, t in times.items()))
    return {"best": {p: list(c) for p, c in best.items()}, "trials": log}


def bench_shape(
    seqlen: int, headdim: int, nheads: int, rows: list[dict], graphs: bool = False, portable: bool = False
) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from kernels.flash_attention import flash_attention

    shape = (1, seqlen, nheads, headdim)  # ours: (B, N, H, d)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    # PyTorch's backends get their native (B, H, N, d) layout, made contiguous outside the timing
    qh, kh, vh, doh = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, do))
    qh, kh, vh = (x.requires_grad_() for x in (qh, kh, vh))
    base = dict(seqlen=seqlen, headdim=headdim, nheads=nheads, batch=1, block=BLOCK)

    def record(impl, density, cfg, fn, args, portable=False):
        row = dict(base, impl=impl, density=density, layout=cfg)
        enabled = _block_sparse_hopper.ENABLED  # (read at each call, forward and backward)
        _block_sparse_hopper.ENABLED = enabled and not portable
        try:
            row["fwd_ms"], row["fwdbwd_ms"] = timed(fn, *args)
        except Exception as exc:  # one failing impl must not end the sweep: record it in its row
            row["error"] = error_note(exc)
        if graphs and "error" not in row:
            try:
                row["fwdbwd_graph_ms"] = graph_timed(fn, *args)
            except Exception as exc:  # not capturable: the eager figures stand alone
                row["graph_error"] = error_note(exc)
        _block_sparse_hopper.ENABLED = enabled
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in base})
        return row

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return scaled_dot_product_attention(q, k, v)

    record("ours_dense", 1.0, None, lambda q, k, v: flash_attention(q, k, v), (q, k, v, do))
    record("sdpa_flash", 1.0, None, sdpa, (qh, kh, vh, doh))
    full = BlockLayout(
        torch.ones(1, -(-seqlen // BLOCK), -(-seqlen // BLOCK), dtype=torch.bool), BLOCK
    ).cuda()
    record("ours_bs", 1.0, "all tiles", lambda q, k, v: block_sparse_attention(q, k, v, full), (q, k, v, do))
    flex = flex_fn()
    for cfg, layout in butterfly_points(seqlen):
        layout = layout.cuda()
        density = layout.density
        ours = lambda q, k, v, lay=layout: block_sparse_attention(q, k, v, lay)  # noqa: E731
        record("ours_bs", density, cfg, ours, (q, k, v, do))
        if portable and _block_sparse_hopper.usable_forward(q, k, v, layout, 0.0):
            record("ours_bs_portable", density, cfg, ours, (q, k, v, do), portable=True)
        block_mask = flex_block_mask(layout, seqlen)
        record(
            "flex",
            density,
            cfg,
            lambda q, k, v, bm=block_mask: flex(q, k, v, block_mask=bm),
            (qh, kh, vh, doh),
        )
    torch.cuda.empty_cache()


def summarize(rows: list[dict], copy_tb_per_s: float | None = None) -> list[dict]:
    """Per (n, d, density): ours vs flex and vs the ideal our-dense x density (eagerly and from graphs),
    and, given the device's copy bandwidth (TB/s, read + write), the time its fewest bytes take
    (`min_fwdbwd_bytes`) against ours from graphs."""
    out = []
    dense = {(r["seqlen"], r["headdim"]): r for r in rows if r["impl"] == "ours_dense" and "fwdbwd_ms" in r}
    for r in rows:
        if r["impl"] != "ours_bs" or r["layout"] == "all tiles" or "fwdbwd_ms" not in r:
            continue
        f = next((x for x in rows if x["impl"] == "flex" and x["seqlen"] == r["seqlen"]
                  and x["headdim"] == r["headdim"] and x["layout"] == r["layout"] and "fwdbwd_ms" in x), None)  # fmt: skip
        d = dense.get((r["seqlen"], r["headdim"]))
        s = dict(seqlen=r["seqlen"], headdim=r["headdim"], density_pct=100 * r["density"],
                 ours_fwd_ms=r["fwd_ms"], ours_fwdbwd_ms=r["fwdbwd_ms"])  # fmt: skip
        if f:
            s.update(flex_fwd_ms=f["fwd_ms"], flex_fwdbwd_ms=f["fwdbwd_ms"],
                     speedup_vs_flex_fwd=f["fwd_ms"] / r["fwd_ms"], speedup_vs_flex_fwdbwd=f["fwdbwd_ms"] / r["fwdbwd_ms"])  # fmt: skip
            if "fwdbwd_graph_ms" in r and "fwdbwd_graph_ms" in f:
                s.update(ours_fwdbwd_graph_ms=r["fwdbwd_graph_ms"], flex_fwdbwd_graph_ms=f["fwdbwd_graph_ms"],
                         speedup_vs_flex_fwdbwd_graph=f["fwdbwd_graph_ms"] / r["fwdbwd_graph_ms"])  # fmt: skip
        p = next((x for x in rows if x["impl"] == "ours_bs_portable" and x["seqlen"] == r["seqlen"]
                  and x["headdim"] == r["headdim"] and x["layout"] == r["layout"] and "fwdbwd_ms" in x), None)  # fmt: skip
        if p:
            s.update(portable_fwd_ms=p["fwd_ms"], portable_fwdbwd_ms=p["fwdbwd_ms"])
        if d:
            ideal = d["fwdbwd_ms"] * r["density"]
            s.update(ideal_fwdbwd_ms=ideal, ours_over_ideal=r["fwdbwd_ms"] / ideal)
            if "fwdbwd_graph_ms" in r and "fwdbwd_graph_ms" in d:
                ideal_graph = d["fwdbwd_graph_ms"] * r["density"]
                s.update(
                    ideal_fwdbwd_graph_ms=ideal_graph,
                    ours_over_ideal_graph=r["fwdbwd_graph_ms"] / ideal_graph,
                )
        if copy_tb_per_s and "fwdbwd_graph_ms" in r:
            floor = min_fwdbwd_bytes(r["batch"], r["seqlen"], r["nheads"], r["headdim"]) / copy_tb_per_s / 1e9
            s.update(bytes_floor_ms=floor, ours_over_bytes_floor=r["fwdbwd_graph_ms"] / floor)
        out.append(s)
    return out


def min_fwdbwd_bytes(batch: int, seqlen: int, nheads: int, headdim: int, elem_bytes: int = 2) -> int:
    """The fewest bytes one fwd+bwd must move to and from memory whatever the density: the forward reads
    q, k, v and writes o and lse; the backward reads q, k, v, o, dO and lse and writes dq, dk, dv. At low
    density these are what a call costs, not the tiles: the ideal `dense x density` scales the products
    only, and falls under this floor wherever a row holds few tiles (n = 4k)."""
    tensor = batch * seqlen * nheads * headdim * elem_bytes
    lse = batch * nheads * seqlen * 4  # float32
    return (4 + 8) * tensor + 2 * lse


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["seqlen"], r["headdim"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False)
    for ax, (n, d) in zip(axes[0], shapes, strict=True):
        sel = [r for r in rows if r["seqlen"] == n and r["headdim"] == d and "fwdbwd_ms" in r]
        dense = next((r["fwdbwd_ms"] for r in sel if r["impl"] == "ours_dense"), None)
        for impl, style in (("ours_bs", "o-"), ("flex", "s--")):
            pts = sorted(
                (r["density"], r["fwdbwd_ms"])
                for r in sel
                if r["impl"] == impl and r["layout"] != "all tiles"
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=f"{impl} fwd+bwd")
        if dense:
            xs = sorted({r["density"] for r in sel if r["impl"] == "ours_bs"})
            ax.plot(xs, [dense * x for x in xs], "k:", label="our dense x density")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tile density")
        ax.set_ylabel("ms")
        ax.set_title(f"n={n // 1024}k d={d}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--tune", action="store_true", help="pick tile configs at n=16k first")
    parser.add_argument(
        "--portable", action="store_true", help="also time the portable kernels where the Hopper path runs"
    )
    parser.add_argument(
        "--graph-upto", type=int, default=16384,
        help="also time fwd+bwd replayed from a CUDA graph (no launch work) up to this length; 0 = never",
    )  # fmt: skip
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/block_sparse_<gpu>.json)"
    )
    args = parser.parse_args()
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"block_sparse_{gpu_slug()}.json")

    tuning = {d: tune(d, args.nheads) for d in args.headdims} if args.tune else None
    bandwidth = copy_bandwidth()
    print(
        f"copy bandwidth {bandwidth['tb_per_s']:.2f} TB/s (read + write, {bandwidth['bytes_moved'] >> 30} GiB)"
    )
    rows = []
    for d in args.headdims:
        for n in args.seqlens:
            bench_shape(n, d, args.nheads, rows, graphs=n <= args.graph_upto, portable=args.portable)
            # rewritten after every shape, so a run cut short still leaves its numbers
            summary = summarize(rows, bandwidth["tb_per_s"])
            extra = dict(dtype="bfloat16", tile_configs=block_sparse._GPU_CONFIGS, tuning=tuning,
                         copy_bandwidth=bandwidth, summary=summary)  # fmt: skip
            write_results(out, rows, extra)
    cols = ["seqlen", "headdim", "density_pct", "ours_fwd_ms", "flex_fwd_ms", "portable_fwd_ms", "ours_fwdbwd_ms",
            "flex_fwdbwd_ms", "portable_fwdbwd_ms",
            "speedup_vs_flex_fwdbwd", "ideal_fwdbwd_ms", "ours_over_ideal", "ours_fwdbwd_graph_ms",
            "flex_fwdbwd_graph_ms", "speedup_vs_flex_fwdbwd_graph", "ideal_fwdbwd_graph_ms", "ours_over_ideal_graph",
            "bytes_floor_ms", "ours_over_bytes_floor"]  # fmt: skip
    table = markdown_table(summary, cols, floatfmt="{:.3g}")
    with open(out.replace(".json", ".md"), "w") as f:
        f.write(
            f"# Block-sparse attention, butterfly on {BLOCK}-blocks, bf16, batch 1, {args.nheads} heads\n\n"
        )
        f.write(table + "\n")
    plot(rows, out.replace(".json", ".png"))
    print(table)


if __name__ == "__main__":
    main()
