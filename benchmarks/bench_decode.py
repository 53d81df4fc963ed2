"""Decoding: one new token's attention against a long KV cache, ours (Flash-Decoding) against PyTorch's.

A decode step reads the whole cache once and does ~2 flops per byte, so it is bound by memory
bandwidth: the figure of merit is the K/V bytes read per second (H200 HBM: ~4.8 TB/s), and at small
batch the launch overhead, so each point is timed both as launched (`ms`) and replayed from a CUDA
graph (`graph_ms`, how a serving loop runs it). Impls: `triton` (kernels.flash_decode, the KV length
split across programs and merged through log-sum-exps), SDPA pinned to flash / memory-efficient /
cuDNN (GQA through enable_gqa), and `eager` (materialised scores, `kernels.reference.attention_reference`
on the full caches). Every row records its max error against the float32 reference on the same inputs.

With `--layout butterfly|random` the impl `triton_layout` is kernels.flash_decode through a block-sparse
model's layout over the cache (`BlockLayout`, 128-blocks by default; `random` is a pattern per head at
`--density`): the new query at the cache's last position reads only the key blocks its row keeps
(`read_fraction` of the cache; the kernel skips a block only when no query head of a kv group keeps it).

    python benchmarks/bench_decode.py                                  # the GPU sweep
    python benchmarks/bench_decode.py --device cpu --batches 1 --cache-lens 96 --nheads 4 \\
        --nheads-kv 2 --headdim 16 --impls triton eager                # smoke (interpreter)
    python benchmarks/bench_decode.py --layout random --impls triton triton_layout sdpa_cudnn
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined

import torch  # noqa: E402

from benchmarks.common import error_note, gpu_slug, graph_time_ms, markdown_table, time_ms, write_results  # noqa: E402
from kernels import decode, flash_decode  # noqa: E402
from kernels.layouts import make_layout  # noqa: E402
from kernels.reference import attention_reference, decode_reference  # noqa: E402

IMPLS = ("triton", "triton_layout", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn", "eager")
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_mem_eff": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}


def make_call(impl: str, q, k, v, seqlens, layout=None, num_splits=None):
    """A no-argument function computing (batch, 1, nheads, headdim) attention of q over the caches
    (`triton_layout`: through `layout`, as a block-sparse model's decode step; ours in num_splits splits,
    None: the kernel's choice)."""
    if impl == "triton":
        return lambda: flash_decode(q, k, v, seqlens, num_splits=num_splits)
    if impl == "triton_layout":
        return lambda: flash_decode(q, k, v, seqlens, causal=True, layout=layout, num_splits=num_splits)
    if impl == "eager":
        return lambda: attention_reference(q, k, v)  # the caches are full: no per-sequence lengths
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (batch, heads, seqlen, headdim)
    gqa = q.shape[2] != k.shape[2]

    def call():
        with sdpa_kernel(backend):  # only that backend: a refusal raises instead of falling back
            return scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa).transpose(1, 2)

    return call


@contextlib.contextmanager
def launch_shape(text: str | None):
    """Our split kernel launched as 'SPLITS_PER_SM,WARPS,STAGES[,BLOCK_N[,MIN_TILES]]' inside the block, that
    many programs per SM whatever the work, splits of at least MIN_TILES key tiles (None: the kernel's own
    choice)."""
    if text in (None, "default"):
        yield
        return
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (3, 4, 5) or min(values) < 1:
        raise SystemExit(
            f"--launch {text!r}: write SPLITS_PER_SM,WARPS,STAGES[,BLOCK_N[,MIN_TILES]], e.g. 4,4,3 or "
            "2,4,2,128 or 4,4,2,64,2"
        )
    names = ("SPLITS_PER_SM", "SPLITS_PER_SM_SMALL_WORK", "SPLITS_PER_SM_SMALL_WORK_D64", "SPLIT_WARPS",
             "SPLIT_STAGES", "SPLIT_BLOCK_N", "MIN_SPLIT_TILES")  # fmt: skip
    values = [values[0], values[0], *values]
    saved = [getattr(decode, n) for n in names]
    for n, v in zip(names, values, strict=False):  # (BLOCK_N, MIN_TILES left as they are when not given)
        setattr(decode, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, saved, strict=True):
            setattr(decode, n, v)


def cpu_time_ms(fn, reps: int = 3) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def layout_for(kind: str, cache_len: int, block: int, nheads: int, density: float, device):
    """The layout a block-sparse model over `cache_len` positions would decode through (causal): a butterfly
    with a band of one block, or random tiles at `density`, a pattern per head."""
    params = {"local_blocks": 1} if kind == "butterfly" else {"density": density, "seed": 0}
    return make_layout(kind, cache_len, block, nheads=nheads, causal=True, **params).to(device)


def last_row_mask(layout, cache_len: int) -> torch.Tensor:
    """(1, nheads or 1, 1, cache_len) keys the query at position cache_len - 1 keeps (its block row)."""
    row = layout.mask[:, (cache_len - 1) // layout.block_m]  # (heads, col blocks)
    return row.repeat_interleave(layout.block_n, dim=-1)[None, :, None, :cache_len]


def read_fraction(layout, cache_len: int, nheads_kv: int) -> float:
    """Fraction of the cache's K/V a decode step reads: a key block is read for a kv head when any of its
    query heads keeps it (a shared layout: when the row keeps it)."""
    keep = layout.mask[:, (cache_len - 1) // layout.block_m].float()  # (heads or 1, col blocks)
    if keep.shape[0] > 1:
        keep = keep.view(nheads_kv, -1, keep.shape[-1]).amax(dim=1)
    n_blocks = -(-cache_len // layout.block_n)
    return keep[:, :n_blocks].mean().item()


def cache_tensor(batch, cache_len, nheads_kv, headdim, order, **kw) -> torch.Tensor:
    """A (batch, cache_len, nheads_kv, headdim) cache: stored so (order "positions", a position's heads
    side by side, as flashtrain.generate's KVCache), or head-major ("heads": each head's positions
    contiguous, viewed in the same shape), which keeps a kv head's key tile in one stretch of memory."""
    if order == "positions":
        return torch.randn(batch, cache_len, nheads_kv, headdim, **kw)
    return torch.randn(batch, nheads_kv, cache_len, headdim, **kw).transpose(1, 2)


def split_kernel_resources() -> list[dict]:
    """Registers a thread and shared memory a program of each split kernel compiled so far (what bounds
    the programs an SM holds at once)."""
    return [
        dict(n_regs=c.compiled.n_regs, shared=c.compiled.metadata.shared, n_spills=c.compiled.n_spills)
        for c in decode._launch_split._compiled.values()
        if hasattr(c.compiled, "n_regs")
    ]


def bench_point(
    impl,
    batch,
    cache_len,
    nheads,
    nheads_kv,
    headdim,
    device,
    layout_args=None,
    cache_order="positions",
    num_splits=None,
) -> dict:
    row = dict(
        impl=impl, batch=batch, cache_len=cache_len, nheads=nheads, nheads_kv=nheads_kv, headdim=headdim,
        cache_order=cache_order,
    )  # fmt: skip
    layout = None
    if impl == "triton_layout":
        kind, block, density = layout_args
        layout = layout_for(kind, cache_len, block, nheads, density, device)
        row.update(layout=kind, block=block, read_fraction=read_fraction(layout, cache_len, nheads_kv))
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, 1, nheads, headdim, device=device, dtype=dtype, generator=gen)
    k, v = (cache_tensor(batch, cache_len, nheads_kv, headdim, cache_order, device=device, dtype=dtype,
                         generator=gen) for _ in range(2))  # fmt: skip
    seqlens = torch.full((batch,), cache_len, device=device, dtype=torch.int32)  # full caches
    row["kv_gb"] = 2 * k.numel() * k.element_size() / 1e9
    try:
        call = make_call(impl, q, k, v, seqlens, layout, num_splits)
        mask = {} if layout is None else {"attn_mask": last_row_mask(layout, cache_len)}
        # float32, one sequence at a time: GQA's repeated K/V of the whole batch would not fit
        want = torch.cat([decode_reference(*(t[b : b + 1].float() for t in (q, k, v)), seqlens[b : b + 1],
                                           **mask) for b in range(batch)])  # fmt: skip
        row["max_err"] = (call().float() - want).abs().max().item()
        if device == "cuda":
            row["ms"] = time_ms(call)
            row["graph_ms"] = graph_time_ms(call)
            row["graph_tb_s"] = row["kv_gb"] * row.get("read_fraction", 1.0) / row["graph_ms"]  # GB/ms = TB/s
        else:
            row["ms"] = cpu_time_ms(call)
        row["tb_s"] = row["kv_gb"] * row.get("read_fraction", 1.0) / row["ms"]
    except Exception as e:  # a refused backend or an OOM is a row, not the end of the sweep
        row["error"] = error_note(e)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--cache-lens", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    parser.add_argument("--nheads", type=int, default=32)
    parser.add_argument("--nheads-kv", type=int, nargs="+", default=[32, 8], help="32: MHA, 8: GQA")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument(
        "--impls", nargs="+", choices=IMPLS, default=None,
        help="default: all, triton_layout only with --layout",
    )  # fmt: skip
    parser.add_argument(
        "--layout", choices=["butterfly", "random"], default=None,
        help="the block-sparse layout triton_layout decodes through (random: a pattern per head)",
    )  # fmt: skip
    parser.add_argument("--block", type=int, default=128, help="the layout's block size (positions)")
    parser.add_argument("--density", type=float, default=0.1, help="a random layout's share of kept blocks")
    parser.add_argument("--max-kv-gb", type=float, default=40.0, help="skip points whose K/V exceed this")
    parser.add_argument(
        "--launch", nargs="+", default=None, metavar="SPLITS_PER_SM,WARPS,STAGES[,BLOCK_N[,MIN_TILES]]",
        help="sweep our split kernel's launch shape (kernels.decode's SPLITS_PER_SM, SPLIT_WARPS, "
        "SPLIT_STAGES, SPLIT_BLOCK_N, MIN_SPLIT_TILES), one triton / triton_layout row per value ('default': the kernel's "
        "own choice, as without --launch)",
    )  # fmt: skip
    parser.add_argument(
        "--cache-orders", nargs="+", choices=["positions", "heads"], default=["positions"],
        help="how the caches are stored: positions (a position's heads side by side, generation's KVCache) "
        "or heads (each head's positions contiguous); one row per order",
    )  # fmt: skip
    parser.add_argument(
        "--num-splits", nargs="+", default=None, metavar="N",
        help="our calls in N splits ('default': the kernel's choice), one row per value",
    )  # fmt: skip
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run on a GPU machine, or pass --device cpu for a smoke test")
    for hk in args.nheads_kv:
        if hk < 1 or args.nheads % hk:
            raise SystemExit(f"--nheads-kv {hk}: must divide --nheads {args.nheads}")
    if args.impls is None:
        args.impls = [i for i in IMPLS if i != "triton_layout" or args.layout]
    if "triton_layout" in args.impls and not args.layout:
        raise SystemExit(
            "--impls triton_layout: give the layout to decode through, --layout butterfly|random"
        )
    layout_args = (args.layout, args.block, args.density)
    out = args.out or f"benchmarks/results/decode_{gpu_slug()}.json"
    rows = []
    for hk in args.nheads_kv:
        for batch in args.batches:
            for cache_len in args.cache_lens:
                if 4 * batch * cache_len * hk * args.headdim / 1e9 > args.max_kv_gb:
                    continue
                ours = [impl for impl in args.impls if impl.startswith("triton")] if args.launch else []
                runs = [(impl, launch) for impl in ours for launch in args.launch]
                runs += [(impl, None) for impl in args.impls if impl not in ours]
                runs = [(impl, launch, order) for impl, launch in runs for order in args.cache_orders]
                splits = [None if n == "default" else int(n) for n in args.num_splits or ["default"]]
                runs = [
                    (*run, n) for run in runs for n in (splits if run[0].startswith("triton") else [None])
                ]
                for impl, launch, order, n in runs:
                    with launch_shape(launch):
                        row = bench_point(
                            impl, batch, cache_len, args.nheads, hk, args.headdim, args.device, layout_args,
                            order, n,
                        )  # fmt: skip
                    if launch:
                        row["launch"] = launch
                    if n is not None:
                        row["num_splits"] = n
                    rows.append(row)
                    print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
                    write_results(out, rows, extra={"seqlen_q": 1, "dtype": "bfloat16"})
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    if args.device == "cuda":
        print("split kernels compiled (registers a thread, shared bytes, spills):", split_kernel_resources())
    cols = [
        "nheads_kv",
        "batch",
        "cache_len",
        "impl",
        "cache_order",
        "launch",
        "num_splits",
        "read_fraction",
        "ms",
        "graph_ms",
        "graph_tb_s",
        "max_err",
        "error",
    ]
    table = markdown_table(rows, cols, floatfmt="{:.4f}")
    with open(out.replace(".json", ".md"), "w") as f:
        f.write(
            f"Decode: 1 query token, {args.nheads} query heads, head dim {args.headdim}, full caches; "
            "graph_tb_s = K/V bytes read per CUDA-graph replay time.\n\n" + table + "\n"
        )
    print(table)


if __name__ == "__main__":
    main()
