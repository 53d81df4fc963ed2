"""Host cost of one attention call: how long the Python side of our dense and block-sparse kernels
takes to issue a forward and backward, against how long the GPU needs for them.

At small sizes (a 4k-token sequence, a short-context GPT step) the host, not the GPU, sets the pace:
the wrappers, torch's dispatch and autograd, Triton's launcher and autotuner lookup. For each path,
on a (1, n, 16, d) bf16 problem:

- `fwdbwd_host_ms`: mean wall time per fwd+bwd call, issued back to back without synchronising
  (the host's rate when it cannot keep ahead of nothing but itself);
- `fwdbwd_synced_ms`: the same with a device sync after every call (host and device in series);
- `fwd_host_ms`: the forward alone under no_grad;
- `host_top`: cProfile's top functions by own time per fwd+bwd call (`common.host_profile`, 100 calls),
  autograd's backward run on the calling thread so that the profile sees it (it runs on autograd's
  device thread otherwise); `host_top_fwd`: the same of the forward under no_grad.

`parts` (dense path, on a (1, --parts-seqlen, 16, d) problem small enough that the GPU never sets the
pace): host time per call of each layer alone, from a bare Triton launch of as many arguments as our
kernels take up to the public fwd+bwd, so the difference between two layers is what the upper one adds.

    python benchmarks/bench_host_overhead.py --out benchmarks/results/host_overhead_<gpu>.json
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.bench_block_sparse import butterfly_config  # noqa: E402
from benchmarks.common import gpu_slug, host_profile, profile_top, write_results  # noqa: E402
from kernels import flash_attention  # noqa: E402
from kernels._flash_bwd import backward_delta, flash_attn_backward  # noqa: E402
from kernels._flash_fwd import flash_attn_forward  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402
from kernels.flash_attention import _FlashAttnFunc  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402


def per_call_ms(fn, calls: int, sync_each: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1000 * elapsed / calls


def alternating_host_ms(ways: dict, fns: dict, batches: int, calls: int) -> dict:
    """Host time of several ways of running the same calls, in one process: per (way, fn's name), the
    `per_call_ms` of fn (calls issued back to back) in each of `batches` batches. ways maps a name to the
    function that switches to that way; a batch runs every way in turn, the order reversed every other
    batch, since host time moves by a third between processes (results/s35/call1, s50/call2). Every fn
    first runs 10 calls each way (compiles, warm-up)."""
    for switch in ways.values():
        switch()
        for fn in fns.values():
            for _ in range(10):
                fn()
    times = {(way, name): [] for way in ways for name in fns}
    for batch in range(batches):
        for way in list(ways) if batch % 2 == 0 else list(ways)[::-1]:
            ways[way]()
            for name, fn in fns.items():
                times[way, name].append(per_call_ms(fn, calls, sync_each=False))
    return times


@triton.jit
def _noop(X, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
          a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37,
          C0: tl.constexpr, C1: tl.constexpr):  # fmt: skip
    """A kernel that does nothing, with as many runtime arguments (~40) as the dense backward's."""
    pass


_NOOP_INTS = tuple(range(1, 39))  # _noop's a0..a37


def _launch_noop(x: torch.Tensor) -> None:
    _noop[(1,)](x, *_NOOP_INTS, C0=1, C1=2)


def host_parts(seqlen: int, headdim: int, calls: int) -> dict[str, float]:
    """Host ms per call of each layer of the dense path, issued back to back (see the module doc)."""
    shape = (1, seqlen, 16, headdim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = headdim**-0.5
    opts = dict(sm_scale=scale, win_left=None, win_right=0, key_padding_mask=None, dropout_p=0.0, seed=0)
    out, lse2 = flash_attn_forward(q, k, v, **opts)
    seed = torch.tensor(0, dtype=torch.int64)
    x = torch.randn(16, device="cuda", requires_grad=True)
    gx = torch.ones_like(x)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    fwd_op = torch.ops.flashtrain.flash_attn_fwd.default
    bwd_op = torch.ops.flashtrain.flash_attn_bwd.default
    parts = {
        "triton_launch_40_args": lambda: _launch_noop(q),
        "torch_empty_like_x3": lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)),
        "autograd_grad_of_one_mul": lambda: torch.autograd.grad(x * 2, x, gx),
        "fwd_launcher": lambda: flash_attn_forward(q, k, v, **opts),
        "delta_launcher": lambda: backward_delta(out, do, lse2),
        "bwd_launcher": lambda: flash_attn_backward(do, q, k, v, out, lse2, **opts),
        "fwd_op": lambda: fwd_op(q, k, v, None, None, None, 0, 0, scale, None, 0, 0.0),
        "bwd_op": lambda: bwd_op(do, q, k, v, out, lse2, None, None, None, 0, 0, scale, None, 0, 0.0, seed, False),
        "api_fwd_no_grad": lambda: torch.no_grad()(flash_attention)(q, k, v, causal=True),
        "api_fwd_with_graph": lambda: flash_attention(qg, kg, vg, causal=True),
        "api_fwd_bwd": lambda: torch.autograd.grad(flash_attention(qg, kg, vg, causal=True), (qg, kg, vg), do),
    }  # fmt: skip
    for name, launches in (("autograd_fn_same_arity_no_kernels", 0), ("autograd_fn_three_launches", 3)):
        parts[name] = lambda launches=launches: torch.autograd.grad(
            _AutogradOnly.apply(qg, kg, vg, None, None, None, 0, 0, scale, None, 0, 0.0, False, launches)[0],
            (qg, kg, vg),
            do,
        )

    def fwd_bwd_one_thread():  # autograd runs the backward on this thread instead of its device thread
        with torch.autograd.set_multithreading_enabled(False):
            return parts["api_fwd_bwd"]()

    parts["api_fwd_bwd_on_calling_thread"] = fwd_bwd_one_thread
    result = {}
    for name, fn in parts.items():
        for _ in range(5):  # compile, autotune, warm up
            fn()
        result[name] = round(per_call_ms(fn, calls, sync_each=False), 4)
        print(f"  part {name:28s} {result[name]:.4f} ms", flush=True)
    # of api_fwd_bwd: the time spent inside our autograd.Function's backward (the rest is the engine's),
    # and a profile of it there (autograd runs it on its own device thread) against the same op called
    # from this thread
    inner, prof = [], cProfile.Profile()
    backward = _FlashAttnFunc.backward

    def timed_backward(ctx, *grads):
        start = time.perf_counter()
        grads = backward(ctx, *grads)
        inner.append(time.perf_counter() - start)
        return grads

    def profiled_backward(ctx, *grads):
        prof.enable()
        try:
            return backward(ctx, *grads)
        finally:
            prof.disable()

    _FlashAttnFunc.backward = staticmethod(timed_backward)
    try:
        total = per_call_ms(parts["api_fwd_bwd"], calls, sync_each=False)
        _FlashAttnFunc.backward = staticmethod(profiled_backward)
        for _ in range(100):
            parts["api_fwd_bwd"]()
    finally:
        _FlashAttnFunc.backward = staticmethod(backward)
    torch.cuda.synchronize()
    result["api_fwd_bwd_again"] = round(total, 4)
    result["inside_function_backward"] = round(1000 * sum(inner) / len(inner), 4)
    print(
        f"  fwd+bwd {total:.4f} ms, of which inside the Function's backward {result['inside_function_backward']:.4f}"
    )
    result["inside_backward_top"] = profile_top(prof, 100, top=16)
    result["bwd_op_top"] = host_profile(parts["bwd_op"], steps=100, top=16)
    for title, top in (
        ("inside autograd's backward", result["inside_backward_top"]),
        ("bwd_op called here", result["bwd_op_top"]),
    ):
        print(f"  profile, {title}:")
        for entry in top:
            print(
                f"    {entry['own_ms']:8.4f} ms own  {entry['cum_ms']:8.4f} ms cum  {entry['calls']:4d}  {entry['function']}"
            )
    return result


class _AutogradOnly(torch.autograd.Function):
    """_FlashAttnFunc's arity and saved tensors without its kernels: what autograd itself costs per call.
    launches (in lse_grad's place) > 0: one empty Triton launch in the forward and that many in the
    backward, to see whether launching from autograd's device thread costs more than from the caller's."""

    @staticmethod
    def forward(ctx, q, k, v, kpm, cu_q, cu_k, max_q, max_k, scale, left, right, p, atomic, launches):
        if launches:
            _launch_noop(q)
        out, lse = torch.empty_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse, torch.tensor(0), kpm, cu_q, cu_k)
        ctx.options = (max_q, max_k, scale, left, right, p)
        ctx.launches = launches
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, *_ = ctx.saved_tensors
        for _ in range(ctx.launches):
            _launch_noop(q)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), *([None] * 11)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--parts-seqlen", type=int, default=256, help="problem size of the `parts` breakdown")
    parser.add_argument("--butterfly", type=butterfly_config, default=None, metavar="F:L",
                        help="the block-sparse layout: butterfly n_factors:local_blocks on 128-blocks (default: all "
                        "factors); also times FlexAttention on the same block mask")  # fmt: skip
    parser.add_argument("--no-parts", action="store_true", help="skip the dense path's `parts` breakdown")
    parser.add_argument("--top", type=int, default=22, help="host_top's length (functions by own time)")
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/host_overhead_<gpu>.json)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_host_overhead.py measures CUDA launches; no CUDA device is visible")
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"host_overhead_{gpu_slug()}.json")
    shape = (1, args.seqlen, 16, args.headdim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    butterfly = args.butterfly or {}
    layout = butterfly_layout(args.seqlen, 128, **butterfly).cuda()
    paths = {
        "block_sparse": lambda: block_sparse_attention(q, k, v, layout),
        "dense": lambda: flash_attention(q, k, v),
    }
    if args.butterfly:  # FlexAttention's host path on the same block mask, (B, H, N, d) views of the inputs
        from benchmarks.bench_block_sparse import flex_block_mask, flex_fn

        block_mask, flex = flex_block_mask(layout, args.seqlen), flex_fn()
        paths["flex_block_sparse"] = lambda: flex(
            *(x.transpose(1, 2) for x in (q, k, v)), block_mask=block_mask
        ).transpose(1, 2)
    rows = []
    for name, forward in paths.items():
        fwdbwd = lambda forward=forward: torch.autograd.grad(forward(), (q, k, v), do)  # noqa: E731
        for _ in range(10):  # compile, autotune, warm up (both ways: under no_grad Flex compiles again)
            fwdbwd()
            with torch.no_grad():
                forward()
        row = dict(path=name, seqlen=args.seqlen, headdim=args.headdim, nheads=16, batch=1, **butterfly)
        row["fwdbwd_host_ms"] = per_call_ms(fwdbwd, args.calls, sync_each=False)
        row["fwdbwd_synced_ms"] = per_call_ms(fwdbwd, args.calls, sync_each=True)
        with torch.no_grad():
            row["fwd_host_ms"] = per_call_ms(forward, args.calls, sync_each=False)
        with torch.autograd.set_multithreading_enabled(False):  # (the backward on this thread: profiled)
            row["host_top"] = host_profile(fwdbwd, steps=100, top=args.top)
        with torch.no_grad():
            row["host_top_fwd"] = host_profile(forward, steps=100, top=args.top)
        rows.append(row)
        print({key: val for key, val in row.items() if not key.startswith("host_top")}, flush=True)
        for key in ("host_top", "host_top_fwd"):
            print(f" {key}:")
            for entry in row[key]:
                print(f"  {entry['own_ms']:8.3f} ms own  {entry['cum_ms']:8.3f} ms cum  {entry['function']}")
    parts = None if args.no_parts else host_parts(args.parts_seqlen, args.headdim, args.calls)
    write_results(out, rows, extra=dict(dtype="bfloat16", parts_seqlen=args.parts_seqlen, parts=parts))


if __name__ == "__main__":
    main()
