"""Sequence-parallel attention throughput: contiguous ring, zigzag ring, Ulysses, hybrid, and PyTorch's
own experimental context parallel, each as a percentage of the ideal.

ideal = single-GPU kernel time on the full sequence / P (perfect scaling, zero communication), with
our kernel for our modes and PyTorch's SDPA for its context parallel (`ideal_impl`);
% of ideal = ideal / measured. Each time is measured twice, the slowest rank's figure counting:
isolated (`fwd_ms`, `fwdbwd_ms`: the median rep, every rep started on an idle device after a barrier,
so the host's launch latency and the ranks' skew are in it) and back-to-back (`*_stream_ms`: the mean
of the reps queued one after another, then one synchronize, as a training step runs attention and as
ring-flash-attention's benchmark times it). The ideal is measured both ways too.

    torchrun --nproc-per-node 4 benchmarks/bench_ring.py --tokens-per-rank 8192 32768 131072
    torchrun --nproc-per-node 2 benchmarks/bench_ring.py --device cpu --tokens-per-rank 256   # smoke test
    torchrun --nproc-per-node 4 benchmarks/bench_ring.py --mask docs butterfly dropout --modes zigzag ulysses

--mask adds the masks whose ring steps run through other kernels, each against its own one-GPU kernel:
packed documents of --doc-len tokens (varlen), a causal butterfly block layout on 128-token blocks
(block-sparse, whose ring steps with empty tiles are skipped) and attention dropout 0.1.

Anchors: ring-flash-attention reports zigzag 90.2% of ideal fwd+bwd on 8 x H800 at 8k tokens/GPU.
Raw rows go to benchmarks/results/ring_<gpu>_x<P>.json (device, torch, triton, date, rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import gpu_slug, profile_table, write_results  # noqa: E402
from flashtrain.distributed import (  # noqa: E402
    hybrid_attention,
    ring_attention,
    set_gradient_group,
    shard_positions,
    ulysses_attention,
)

MODES = ("contiguous", "zigzag", "ulysses", "hybrid", "torch_cp")
MASKS = ("none", "docs", "butterfly", "dropout")
BLOCK = 128  # butterfly block size


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # host-device sync: timing boundary


def timed(fn, device: str, warmup: int, reps: int) -> tuple[float, float]:
    """(isolated, back-to-back) milliseconds of fn, each the slowest rank's: the median of reps that
    each start after a barrier on an idle device, and the mean of reps queued back to back. Blocks."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    stream = (time.perf_counter() - t0) * 1e3 / reps
    both = torch.tensor([statistics.median(times), stream], dtype=torch.float64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    isolated, stream = both.tolist()
    return isolated, stream


def fwd_and_fwdbwd(
    attn, q, k, v, device, warmup, reps, profile: str | None = None, trace: bool = False
) -> tuple[tuple[float, float], tuple[float, float]]:
    """((fwd ms isolated, back-to-back), (fwd+bwd ms isolated, back-to-back)) of attn(q, k, v) on leaf tensors. With `profile` (a path; every rank must
    pass one, rank 0 writes it) the fwd+bwd is also run under the profiler afterwards."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            attn(q, k, v)

    def fwdbwd():
        out = attn(q, k, v)
        out.backward(dout)

    times = timed(fwd, device, warmup, reps), timed(fwdbwd, device, warmup, reps)
    if profile:
        dist.barrier()
        title = f"rank 0 of {dist.get_world_size()}: fwd+bwd, q {tuple(q.shape)} {q.dtype}"
        profile_table(fwdbwd, profile if dist.get_rank() == 0 else None, title=title, trace=trace)
    return times


def mask_kwargs(mask: str, seqlen: int, device: str, doc_len: int) -> dict:
    """The attention keywords of one mask, shared by the one-GPU baseline and the sequence-parallel run."""
    if mask == "docs":
        return dict(cu_seqlens=torch.arange(0, seqlen + 1, doc_len, device=device, dtype=torch.int32))
    if mask == "butterfly":
        from kernels.layouts import butterfly_layout

        return dict(
            block_layout=butterfly_layout(seqlen, BLOCK, causal=True).mask.to(device), block_size=BLOCK
        )
    if mask == "dropout":
        return dict(dropout_p=0.1)
    return {}


def single_device_attention(device: str, mask_kw: dict):
    """The one-GPU kernel for the mask (the ideal's numerator); the torch reference on CPU."""
    if device != "cuda":  # Ulysses without a group: one process, the torch reference with the masks
        return lambda q, k, v: ulysses_attention(q, k, v, None, causal=True, layout="contiguous", **mask_kw)
    from kernels import block_sparse_attention, flash_attention, flash_attention_varlen
    from kernels.layouts import BlockLayout

    if "cu_seqlens" in mask_kw:
        cu = mask_kw["cu_seqlens"]
        longest = int((cu[1:] - cu[:-1]).max())

        def varlen(q, k, v):
            out = flash_attention_varlen(q[0], k[0], v[0], cu, cu, longest, longest, causal=True)
            return out[None]  # batch 1

        return varlen
    if "block_layout" in mask_kw:
        layout = BlockLayout(mask_kw["block_layout"], mask_kw["block_size"])
        return lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True)
    return lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=mask_kw.get("dropout_p", 0.0))


def mode_fn(mode: str, world: int, rank: int, groups: dict, backend: str, mask_kw: dict):
    """(attention on local shards, positions of this rank's shard) for one of our modes."""
    # a fixed dropout seed: every rank must draw the same mask
    common = dict(causal=True, backend=backend, validate=False, dropout_seed=1234, **mask_kw)
    if mode in ("contiguous", "zigzag"):
        return (
            lambda q, k, v: ring_attention(q, k, v, dist.group.WORLD, layout=mode, **common),
            dict(layout=mode, ring_size=world, ring_rank=rank),
        )
    if mode == "ulysses":
        return (
            lambda q, k, v: ulysses_attention(q, k, v, dist.group.WORLD, layout="contiguous", **common),
            dict(layout="contiguous", ring_size=world, ring_rank=rank),
        )
    u_size = groups["U"]
    return (
        lambda q, k, v: hybrid_attention(
            q, k, v, groups["ulysses"], groups["ring"], layout="zigzag", **common
        ),
        dict(
            layout="zigzag",
            ring_size=world // u_size,
            ring_rank=rank // u_size,
            ulysses_size=u_size,
            ulysses_rank=rank % u_size,
        ),  # fmt: skip
    )


def single_device_sdpa(q, k, v):
    """PyTorch's SDPA (its default backend choice) on one GPU: the ideal's numerator for torch_cp."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    return out.transpose(1, 2)


def torch_cp(q, k, v, device, warmup, reps) -> tuple[tuple[float, float], tuple[float, float]]:
    """PyTorch's experimental context parallel around SDPA (its own sharding and load balancing)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    # SDPA layout (B, H, S, D); context_parallel shards these full buffers in place along dim 2
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    dout = torch.randn_like(qt)
    with context_parallel(mesh, buffers=[qt, kt, vt, dout], buffer_seq_dims=[2, 2, 2, 2]):
        for t in (qt, kt, vt):  # sharded in place on entry, which a leaf that requires grad forbids
            t.requires_grad_()

        # looked up at each call: the context swaps F.scaled_dot_product_attention for its ring version
        # (an alias taken before entering it ran plain local SDPA on the shard: "260% of ideal")
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        def fwdbwd():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(dout)

        try:
            return timed(fwd, device, warmup, reps), timed(fwdbwd, device, warmup, reps)
        finally:
            for t in (qt, kt, vt):  # the context restores the buffers on exit: same restriction
                t.grad = None
                t.requires_grad_(False)


def _ideal(fwd: tuple[float, float], fwdbwd: tuple[float, float], world: int) -> dict:
    """The ideal per-rank times: one device's times on the whole sequence / P, both ways of timing."""
    return dict(
        ideal_fwd_ms=fwd[0] / world, ideal_fwdbwd_ms=fwdbwd[0] / world,
        ideal_fwd_stream_ms=fwd[1] / world, ideal_fwdbwd_stream_ms=fwdbwd[1] / world,
    )  # fmt: skip


def measure_modes(args, q, k, v, mask, mask_kw, world, rank, groups, backend, dtype) -> list[dict]:
    """Rows of every mode for one mask; the ideal is the one-GPU kernel on the whole sequence / P."""
    device, seqlen = args.device, q.shape[1]
    tokens = seqlen // world
    # every rank measures its own device; the slowest counts
    ideal_fwd, ideal_fb = fwd_and_fwdbwd(single_device_attention(device, mask_kw), q, k, v, device,
                                         args.warmup, args.reps)  # fmt: skip
    base = dict(world=world, tokens_per_rank=tokens, seqlen=seqlen, batch=args.batch, nheads=args.nheads,
                headdim=args.headdim, dtype=str(dtype).removeprefix("torch."), causal=True, mask=mask,
                ideal_impl="ours", **_ideal(ideal_fwd, ideal_fb, world))  # fmt: skip
    if mask == "docs":
        base["doc_len"] = args.doc_len
    rows = []
    for mode in args.modes:
        row = dict(base, mode=mode)
        try:
            if mode == "hybrid" and not groups:
                raise ValueError(f"hybrid needs an even world size >= 4, got {world}")
            if mode == "torch_cp":
                if mask != "none":
                    raise ValueError("torch_cp is measured without masks")
                fwd_ms, fb_ms = torch_cp(q, k, v, device, args.warmup, args.reps)
                # its ideal is its own kernel's: SDPA on the whole sequence on one GPU, / P
                sdpa_fwd, sdpa_fb = fwd_and_fwdbwd(
                    single_device_sdpa, q, k, v, device, args.warmup, args.reps
                )
                row.update(ideal_impl="sdpa", **_ideal(sdpa_fwd, sdpa_fb, world))
            else:
                attn, layout = mode_fn(mode, world, rank, groups, backend, mask_kw)
                pos = shard_positions(seqlen, device=device, **layout)
                profile = None
                if args.profile and mode in args.profile_modes and tokens == args.tokens_per_rank[0]:
                    profile = os.path.join(args.profile, f"ring_profile_{mode}_{mask}_{tokens}_x{world}.txt")
                fwd_ms, fb_ms = fwd_and_fwdbwd(attn, *(t.index_select(1, pos) for t in (q, k, v)), device,
                                               args.warmup, args.reps, profile, args.trace)  # fmt: skip
            for kind, ms in (("fwd", fwd_ms), ("fwdbwd", fb_ms)):
                for suffix, value in (("", ms[0]), ("_stream", ms[1])):
                    row[f"{kind}{suffix}_ms"] = value
                    row[f"{kind}{suffix}_pct_ideal"] = 100 * row[f"ideal_{kind}{suffix}_ms"] / value
            row["tokens_per_s_fwdbwd"] = args.batch * seqlen / (fb_ms[0] / 1e3)
            log(f"{mode:>10} {mask:>9} {tokens:>7} tok/rank: fwd {fwd_ms[0]:9.2f} ms ({row['fwd_pct_ideal']:5.1f}% "
                f"ideal)  fwd+bwd {fb_ms[0]:9.2f} ms ({row['fwdbwd_pct_ideal']:5.1f}% ideal); back to back: "
                f"fwd {row['fwd_stream_pct_ideal']:5.1f}%, fwd+bwd {fb_ms[1]:9.2f} ms "
                f"({row['fwdbwd_stream_pct_ideal']:5.1f}%)")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a mode that cannot run here is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{mode:>10} {mask:>9} {tokens:>7} tok/rank: {row['error']}")
            dist.barrier()
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens-per-rank", type=int, nargs="+", default=[8192, 16384, 32768, 65536, 131072])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--mask", nargs="+", default=["none"], choices=MASKS)
    p.add_argument("--doc-len", type=int, default=4096, help="tokens per packed document (--mask docs)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--nheads", type=int, default=32)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument(
        "--out", default=None, help="results JSON (default benchmarks/results/ring_<gpu>_x<P>.json)"
    )
    p.add_argument(
        "--profile", default=None, help="folder: profile tables of --profile-modes at the first size"
    )
    p.add_argument("--profile-modes", nargs="+", default=["zigzag"], choices=MODES[:-1])
    p.add_argument("--trace", action="store_true", help="with --profile: the Chrome trace (timeline) too")
    p.add_argument(
        "--high-priority", action=argparse.BooleanOptionalAction, default=None,
        help="NCCL communicators on high-priority streams, so the ring's transfers get SMs ahead of queued "
        "compute (default on CUDA, as the trainer's sequence-parallel groups: flashtrain.distributed.ParallelDims)",
    )  # fmt: skip
    p.add_argument(
        "--grad-group", action="store_true",
        help="the ring backward's dK/dV over a second communicator of the same ranks (set_gradient_group)",
    )  # fmt: skip
    args = p.parse_args()

    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    pg_options = None
    if args.high_priority is None:
        args.high_priority = device == "cuda"
    if args.high_priority:
        if device != "cuda":
            raise SystemExit("--high-priority sets an NCCL option: run it with --device cuda")
        pg_options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", pg_options=pg_options)
    world, rank = dist.get_world_size(), dist.get_rank()
    # bf16 with the Triton kernels on GPU; on CPU the reference runs in fp32 (a smoke test, not a measurement)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    backend = "triton" if device == "cuda" else "reference"

    groups = {}
    if world >= 4 and world % 2 == 0:  # hybrid: Ulysses pairs inside a ring of world / 2
        u_size = 2
        ulysses = [
            dist.new_group([r * u_size + u for u in range(u_size)], pg_options=pg_options)
            for r in range(world // u_size)
        ]
        ring = [dist.new_group(list(range(u, world, u_size)), pg_options=pg_options) for u in range(u_size)]
        groups = dict(ulysses=ulysses[rank // u_size], ring=ring[rank % u_size], U=u_size)
    if args.grad_group:  # every rank creates every group, in one order (new_group is collective)
        set_gradient_group(dist.group.WORLD, dist.new_group(list(range(world)), pg_options=pg_options))
        if groups:
            twins = [
                dist.new_group(list(range(u, world, groups["U"])), pg_options=pg_options)
                for u in range(groups["U"])
            ]
            set_gradient_group(groups["ring"], twins[rank % groups["U"]])

    rows = []
    for tokens in args.tokens_per_rank:
        seqlen = tokens * world
        gen = torch.Generator(device=device).manual_seed(0)  # same full tensors on every rank
        q, k, v = (
            torch.randn(
                args.batch, seqlen, args.nheads, args.headdim, generator=gen, device=device, dtype=dtype
            )
            for _ in range(3)
        )
        for mask in args.mask:
            if mask == "docs" and (args.batch != 1 or seqlen % args.doc_len):
                log(
                    f"--mask docs needs --batch 1 and a sequence that is a multiple of --doc-len; skipped at {seqlen}"
                )
                continue
            mask_kw = mask_kwargs(mask, seqlen, device, args.doc_len)
            rows += measure_modes(args, q, k, v, mask, mask_kw, world, rank, groups, backend, dtype)
        del q, k, v

    if rank == 0:
        out = args.out or os.path.join(
            os.path.dirname(__file__), "results", f"ring_{gpu_slug()}_x{world}.json"
        )
        write_results(
            out,
            rows,
            extra=dict(
                benchmark="bench_ring",
                world=world,
                backend=backend,
                grad_group=args.grad_group,
                high_priority=args.high_priority,
            ),  # fmt: skip
        )
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
