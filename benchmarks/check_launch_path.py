"""Host cost of launching the Gluon forward kernel, piece by piece (GPU only).

Where do the ~50 us of host time per Hopper forward launch go, and what would a leaner path save?
On a problem too small for the GPU to set the pace ((1, 256, 16, 128) bf16), per call:

- `jit_launch`: `_attn_fwd_hopper[grid](...)` with fresh TMA descriptors (what the library does);
- `jit_launch_same_descriptors`: the same with descriptors built once (so their cost is the difference);
- `binder`: Triton's argument binding and specialization alone (part of every JIT launch);
- `compiled_run`: the compiled kernel's own launcher (`CompiledKernel.run`) with the bound arguments,
  skipping `JITFunction.run` (binding, cache key, hooks);
- `gluon_descriptors_x4` / `plain_descriptors_x4`: building the four descriptors as Gluon's validated
  `TensorDescriptor`, and as the plain record `kernels._launch.tma_view` makes (the fields the
  launcher reads). The runs in results/s28_h200/call1 and call2 built a record that also carried the
  block shape and the cached shared-memory layout.

    python benchmarks/check_launch_path.py --out launch_path.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402

from benchmarks.common import gpu_slug, write_results  # noqa: E402
from kernels import _flash_fwd_hopper as fh  # noqa: E402
from kernels import _hopper_pipeline as pipeline  # noqa: E402
from kernels._launch import tma_view  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return round(1e6 * elapsed / calls, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 256, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(1, 16, 256, device="cuda", dtype=torch.float32)
    cfg = fh.CONFIGS[128]
    grid = (triton.cdiv(256, cfg.block_m * cfg.consumers), 16, 1)
    kernel = fh._attn_fwd_hopper
    constexprs = dict(
        CAUSAL=True, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        PRODUCER_REGS=cfg.producer_regs, SPARSE=False, V_STAGES=cfg.v_stages, PINGPONG=cfg.pingpong,
        num_warps=4,
    )  # fmt: skip

    def descriptors(make=pipeline.descriptor):
        return make(q, cfg.block_m), make(k, cfg.block_n), make(v, cfg.block_n), make(out, cfg.block_m)

    def plain(t, rows):  # the record kernels/_launch.py passes (its block shape comes from the kernel)
        return tma_view(t)

    def runtime_args(descs):
        sched = pipeline.list_args(None, lse, q.device, True)
        return (*descs, lse, lse.stride(0), lse.stride(1), 256, 256, 1, 0.125 * fh.LOG2E, *sched)

    fixed = descriptors()
    compiled = kernel[grid](*runtime_args(fixed), **constexprs)
    binder = kernel.device_caches[torch.cuda.current_device()][4]
    bound, _, _ = binder(*runtime_args(fixed), **constexprs)
    stream = torch.cuda.current_stream().cuda_stream

    def compiled_run(descs):
        bound_values = list(bound.values())
        bound_values[:4] = descs
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None,
                     None, *bound_values)  # fmt: skip

    parts = {
        "jit_launch": lambda: kernel[grid](*runtime_args(descriptors()), **constexprs),
        "jit_launch_same_descriptors": lambda: kernel[grid](*runtime_args(fixed), **constexprs),
        "binder": lambda: binder(*runtime_args(fixed), **constexprs),
        "compiled_run": lambda: compiled_run(fixed),
        "compiled_run_plain_descriptors": lambda: compiled_run(descriptors(plain)),
        "gluon_descriptors_x4": descriptors,
        "plain_descriptors_x4": lambda: descriptors(plain),
    }
    # the plain records launch the same kernel: check their output against the JIT launch's
    kernel[grid](*runtime_args(fixed), **constexprs)
    expected = out.clone()
    out.zero_()
    compiled_run(descriptors(plain))
    torch.cuda.synchronize()
    same = bool(torch.equal(out, expected))
    result = {}
    for name, fn in parts.items():
        result[name] = per_call_us(fn, args.calls)
        print(f"{name:34s} {result[name]:8.2f} us", flush=True)
    print("plain descriptors give the same output:", same)
    write_results(args.out, [dict(part=k, host_us=v) for k, v in result.items()],
                  {"problem": "(1, 256, 16, 128) bf16 causal", "same_output": same, "gpu": gpu_slug()})  # fmt: skip


if __name__ == "__main__":
    main()
