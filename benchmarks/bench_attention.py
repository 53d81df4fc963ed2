"""Attention benchmark: our Triton FlashAttention against PyTorch's backends, in one run.

Shapes follow the FlashAttention paper's benchmarks: batch * seqlen = 16k tokens, nheads * headdim =
2048, seqlen 512 .. 64k, headdim 64/128/256, causal and full, bf16. Reports fwd, bwd (= fwd+bwd - fwd)
and fwd+bwd time and TFLOP/s (fwd flops 4 * B * H * N^2 * d, halved when causal; bwd 2.5x fwd) and
the peak extra memory of one fwd+bwd.

    python benchmarks/bench_attention.py                         # full sweep, all impls
    python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 128 --impls triton sdpa_flash
    python benchmarks/bench_attention.py --impls triton triton_dropout sdpa_flash sdpa_flash_dropout  # dropout 0.1

Writes benchmarks/results/attention_<gpu>.json (and .md, .png) unless --out names another path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (
    error_note,
    gpu_slug,
    graph_time_ms,
    markdown_table,
    peak_memory_mib,
    time_ms,
    write_results,
)  # noqa: E402

IMPLS = ["eager", "sdpa_flash", "sdpa_cudnn", "sdpa_mem_eff", "flex", "triton", "triton_atomic"]
# attention dropout, on request only (--impls ... triton_dropout sdpa_flash_dropout): the cost of the mask
DROPOUT_IMPLS = ["triton_dropout", "sdpa_flash_dropout"]
DROPOUT_P = 0.1
# on request: ours on the GPT's packed QKV layout (per-kernel times; its timed call includes a concatenation)
PACKED_IMPLS = ["triton_qkvpacked"]
TOKENS = 16384
MODEL_DIM = 2048


def issue_shape(seqlen: int, headdim: int, nheads: int | None = None) -> tuple[int, int]:
    """(batch, nheads) of the issue's shapes: batch x seqlen = TOKENS (one sequence past it) and
    nheads x headdim = MODEL_DIM, or the given nheads with that batch (a model's shape, e.g. 8 heads of
    128)."""
    return max(TOKENS // seqlen, 1), nheads or MODEL_DIM // headdim


def fwd_flops(batch: int, nheads: int, seqlen: int, headdim: int, causal: bool) -> float:
    """The forward's FLOPs as the issue counts them: 4 B H N^2 d, halved when causal (the backward 2.5x
    that, fwd+bwd 3.5x)."""
    return 4 * batch * nheads * seqlen**2 * headdim / (2 if causal else 1)


def _eager(q, k, v, causal):
    """Materialised attention in (B, H, N, d): the N x N scores go through HBM."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)  # (B, H, N, N)
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)


def _sdpa(backend, dropout_p=0.0):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def run(q, k, v, causal):  # (B, H, N, d); K/V with fewer heads: GQA
        with sdpa_kernel(backend):
            gqa = k.shape[1] != q.shape[1]
            return scaled_dot_product_attention(
                q, k, v, is_causal=causal, dropout_p=dropout_p, enable_gqa=gqa
            )

    return run


_FLEX = {}


def _flex(q, k, v, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        # each new seqlen recompiles; past the default limit dynamo silently falls back to the unfused path
        # and dynamic=False: after the first recompile dynamo would otherwise make the sequence length
        # dynamic, and the dynamic-shape kernel runs up to ~25% slower than the one a user compiling for
        # one shape gets (measured 2026-11-23, benchmarks/NOTES_attention.md "FlexAttention baseline")
        torch._dynamo.config.cache_size_limit = 256
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 256
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if causal:
        n = q.shape[-2]
        key = ("mask", n)
        if key not in _FLEX:
            _FLEX[key] = create_block_mask(
                lambda b, h, qi, ki: qi >= ki, B=None, H=None, Q_LEN=n, KV_LEN=n, device=q.device
            )
        block_mask = _FLEX[key]
    return _FLEX["fn"](q, k, v, block_mask=block_mask)


def _triton(q, k, v, causal):
    from kernels import flash_attention

    return flash_attention(q, k, v, causal=causal)


def _triton_qkvpacked(q, k, v, causal):
    """Ours on one (B, N, H + 2 Hkv, D) tensor, as the GPT calls it (rows strided by the packed width).
    The concatenation runs inside the timed call: use it for per-kernel times (profile_attention.py)."""
    from kernels import flash_attention_qkvpacked

    return flash_attention_qkvpacked(torch.cat([q, k, v], dim=2), nheads_kv=k.shape[2], causal=causal)


def _triton_atomic(q, k, v, causal):
    """Ours with deterministic=False: dq by fp32 atomics inside the dk/dv kernel (on Hopper at d128 the
    one-kernel backward, `kernels._flash_bwd_fused_hopper`, where its rule takes the call)."""
    from kernels import flash_attention

    return flash_attention(q, k, v, causal=causal, deterministic=False)


def _triton_dropout(q, k, v, causal):
    from kernels import flash_attention

    return flash_attention(q, k, v, causal=causal, dropout_p=DROPOUT_P)


def _triton_configs(impl):
    """The tile configs the autotuners picked for the last call (for the notes)."""
    from kernels import _flash_bwd, _flash_fwd

    tuners = {"fwd": _flash_fwd._attn_fwd_tuned}
    if impl in ("triton", "triton_dropout"):
        tuners.update(dkdv=_flash_bwd._bwd_dkdv_tuned, dq=_flash_bwd._bwd_dq_tuned)
    else:
        tuners.update(dkdv=_flash_bwd._bwd_dkdv_atomic_tuned)
    out = {}
    for name, tuner in tuners.items():
        cfg = getattr(tuner, "best_config", None)
        if cfg is not None:
            out[name] = f"{cfg.kwargs} w{cfg.num_warps} s{cfg.num_stages}"
    return out


def make_impl(name):
    from torch.nn.attention import SDPBackend

    return {
        "eager": _eager,
        "sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_mem_eff": _sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "flex": _flex,
        "triton": _triton,
        "triton_atomic": _triton_atomic,
        "triton_qkvpacked": _triton_qkvpacked,
        "triton_dropout": _triton_dropout,
        "sdpa_flash_dropout": _sdpa(SDPBackend.FLASH_ATTENTION, DROPOUT_P),
    }[name]


def native_shape(impl: str, batch: int, seqlen: int, nheads: int, headdim: int) -> tuple:
    """The shape q, k and v are made in for impl: ours (and our block-sparse impls, "bs:...") take
    (B, N, H, d), PyTorch's backends (B, H, N, d); each is timed in its native layout."""
    ours = impl.startswith(("triton", "bs:"))
    return (batch, seqlen, nheads, headdim) if ours else (batch, nheads, seqlen, headdim)


def bench_one(impl, batch, seqlen, nheads, headdim, causal, dtype, eager_max, graphs=False):
    row = dict(impl=impl, batch=batch, seqlen=seqlen, nheads=nheads, headdim=headdim, causal=causal,
               dtype=str(dtype).replace("torch.", ""))  # fmt: skip
    if impl == "eager" and seqlen > eager_max:
        gib = batch * nheads * seqlen * seqlen * 4 / 2**30
        row["skipped"] = f"eager materialises {gib:.0f} GiB of fp32 scores above n={eager_max}"
        return row
    flops = fwd_flops(batch, nheads, seqlen, headdim, causal)
    shape = native_shape(impl, batch, seqlen, nheads, headdim)
    try:
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        do = torch.randn(shape, device="cuda", dtype=dtype)
        fn = make_impl(impl)

        def fwd():
            with torch.no_grad():
                return fn(q, k, v, causal)

        def fwdbwd():
            out = fn(q, k, v, causal)
            return torch.autograd.grad(out, (q, k, v), do)

        fwdbwd()  # compile / autotune outside the timed region
        fwd()
        row["fwd_ms"] = time_ms(fwd)
        row["fwdbwd_ms"] = time_ms(fwdbwd)
        row["bwd_ms"] = row["fwdbwd_ms"] - row["fwd_ms"]
        row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
        row["bwd_tflops"] = 2.5 * flops / row["bwd_ms"] / 1e9 if row["bwd_ms"] > 0 else None
        row["fwdbwd_tflops"] = 3.5 * flops / row["fwdbwd_ms"] / 1e9
        row["peak_mem_mib"] = peak_memory_mib(fwdbwd)
        if impl.startswith("triton"):
            row["configs"] = _triton_configs(impl)
        if graphs:  # device time alone: one eager call of a short problem can be bound by the host
            try:
                row["fwd_graph_ms"] = graph_time_ms(fwd)
                row["fwdbwd_graph_ms"] = graph_time_ms(fwdbwd)
                row["fwd_graph_tflops"] = flops / row["fwd_graph_ms"] / 1e9
                row["fwdbwd_graph_tflops"] = 3.5 * flops / row["fwdbwd_graph_ms"] / 1e9
            except Exception as exc:  # noqa: BLE001  (a backend that cannot be captured keeps its eager row)
                row["graph_error"] = error_note(exc)
    except Exception as exc:  # one failing backend must not end the sweep: record it in its row
        row["error"] = error_note(exc)
    finally:
        q = k = v = do = None
        torch.cuda.empty_cache()
    return row


def summary_rows(rows):
    """One line per shape: fwd+bwd TFLOP/s per impl and our ratios to the anchors."""
    shapes = sorted({(r["headdim"], r["causal"], r["seqlen"]) for r in rows})
    out = []
    for d, causal, n in shapes:
        line = {"headdim": d, "causal": causal, "seqlen": n}
        by_impl = {r["impl"]: r for r in rows if (r["headdim"], r["causal"], r["seqlen"]) == (d, causal, n)}
        for impl, r in by_impl.items():
            if "fwdbwd_tflops" in r:
                line[impl] = f"{r['fwd_tflops']:.0f} / {r['fwdbwd_tflops']:.0f}"
        ours = by_impl.get("triton", {}).get("fwdbwd_tflops")
        ours_dropout = by_impl.get("triton_dropout", {}).get("fwdbwd_tflops")
        theirs_dropout = by_impl.get("sdpa_flash_dropout", {}).get("fwdbwd_tflops")
        if ours_dropout and theirs_dropout:
            line["dropout_xsdpa_flash"] = f"{ours_dropout / theirs_dropout:.2f}"
        for anchor in ("sdpa_flash", "flex", "sdpa_cudnn", "triton_atomic"):
            theirs = by_impl.get(anchor, {}).get("fwdbwd_tflops")
            if ours and theirs:
                line[f"x{anchor}"] = f"{ours / theirs:.2f}"
        out.append(line)
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    combos = sorted({(r["headdim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(2, len(combos), figsize=(4.5 * len(combos), 7), squeeze=False)
    colors = dict(
        zip(IMPLS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False)
    )  # one color per impl everywhere
    for j, (d, causal) in enumerate(combos):
        for impl in IMPLS:
            pts = sorted((r["seqlen"], r["fwdbwd_ms"], r["peak_mem_mib"]) for r in rows
                         if r["impl"] == impl and (r["headdim"], r["causal"]) == (d, causal) and "fwdbwd_ms" in r)  # fmt: skip
            if pts:
                n, ms, mem = zip(*pts, strict=True)
                axes[0][j].plot(n, ms, marker="o", label=impl, color=colors[impl])
                # a peak of 0 (the allocator reused cached blocks) has no place on a log axis
                kept = [(x, m) for x, m in zip(n, mem, strict=True) if m > 0]
                if kept:
                    axes[1][j].plot(*zip(*kept, strict=True), marker="o", label=impl, color=colors[impl])
        axes[0][j].set_title(f"d={d} {'causal' if causal else 'full'}")
        for ax, ylabel in ((axes[0][j], "fwd+bwd ms"), (axes[1][j], "peak extra memory (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(ylabel)
    handles = [plt.Line2D([], [], color=colors[i], marker="o", label=i) for i in IMPLS]
    fig.legend(handles=handles, loc="upper center", ncol=len(IMPLS), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)


def write_outputs(out, rows, impls):
    """Markdown table and PNG beside the JSON; returns the table."""
    summary = summary_rows(rows)
    cols = ["headdim", "causal", "seqlen", *[i for i in IMPLS + DROPOUT_IMPLS if i in impls]]
    cols += ["xsdpa_flash", "xflex", "xsdpa_cudnn", "xtriton_atomic"]
    if "triton_dropout" in impls:
        cols.append("dropout_xsdpa_flash")
    table = markdown_table(summary, cols)
    base = os.path.splitext(out)[0]
    with open(base + ".md", "w") as f:
        f.write(
            "TFLOP/s fwd / fwd+bwd (bf16, batch x seqlen = 16k tokens, nheads x headdim = 2048); "
            "x<impl> = our (deterministic) fwd+bwd TFLOP/s over that impl's; dropout_xsdpa_flash = ours with "
            "dropout 0.1 over SDPA flash with dropout 0.1.\n\n" + table + "\n"
        )
    try:
        plot(rows, base + ".png")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"plot failed: {exc}")
    return table


def merge(paths, out):
    """Concatenate the rows of several runs (same device) into one results file."""
    records = []
    for p in paths:
        with open(p) as f:
            records.append(json.load(f))
    devices = {r["device"] for r in records}
    if len(devices) != 1:
        raise SystemExit(f"refusing to merge runs from different devices: {devices}")
    merged = {key: val for key, val in records[0].items() if key != "rows"}
    merged["date"] = ", ".join(sorted({r["date"] for r in records}))
    merged["rows"] = [row for r in records for row in r["rows"]]
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)
    print(write_outputs(out, merged["rows"], {row["impl"] for row in merged["rows"]}))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    )
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--causal", choices=["both", "causal", "full"], default="both")
    parser.add_argument("--impls", nargs="+", choices=IMPLS + DROPOUT_IMPLS + PACKED_IMPLS, default=IMPLS)
    parser.add_argument(
        "--graphs", action="store_true", help="also time CUDA-graph replays (device time without the host)"
    )
    parser.add_argument("--eager-max", type=int, default=8192, help="skip eager above this seqlen (memory)")
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/attention_<gpu>.json)"
    )
    parser.add_argument(
        "--merge", nargs="+", default=None, help="merge these result JSONs into --out and exit"
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA device")

    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"attention_{gpu_slug()}.json")
    causals = {"both": [True, False], "causal": [True], "full": [False]}[args.causal]
    rows = []
    for d in args.headdims:
        for causal in causals:
            for n in args.seqlens:
                batch, nheads = issue_shape(n, d)
                for impl in args.impls:
                    row = bench_one(
                        impl, batch, n, nheads, d, causal, torch.bfloat16, args.eager_max, args.graphs
                    )
                    rows.append(row)
                    msg = (
                        row.get("error")
                        or row.get("skipped")
                        or (
                            f"fwd {row['fwd_tflops']:.0f} fwd+bwd {row['fwdbwd_tflops']:.0f} TFLOP/s, "
                            f"{row['peak_mem_mib']:.0f} MiB {row.get('configs', '')}"
                            + (
                                f" graphs: fwd {row['fwd_graph_tflops']:.0f} fwd+bwd {row['fwdbwd_graph_tflops']:.0f}"
                                if "fwdbwd_graph_ms" in row
                                else row.get("graph_error", "")
                            )
                        )
                    )
                    print(f"d={d} causal={causal} n={n} {impl}: {msg}", flush=True)
                    write_results(out, rows, {"tokens": TOKENS, "model_dim": MODEL_DIM})  # survive a time-out
    print(write_outputs(out, rows, args.impls))


if __name__ == "__main__":
    main()
