"""Launching the Gluon (Hopper) kernels with less host work than `kernel[grid](...)`.

A short attention call is host-bound: one eager d128 fwd+bwd at 4k tokens needs ~0.13 ms of GPU time
and ~0.8-1.2 ms of host time. Per Gluon forward launch, on the host of an H200 machine
(benchmarks/check_launch_path.py; two machines, results/s28_h200/call1 and call2): 53-60 us through
`kernel[grid](...)`, of which Triton's argument binding (every argument specialized in Python, the
descriptors' layouts mangled into strings) took 13-23 us and the four validated `TensorDescriptor`s
15-25 us; the compiled kernel's own launcher, given plain descriptor records, 19-33 us in all.

`CompiledLaunch` keeps that cheaper path and stays exactly as specialized as Triton:

- The first launch of each specialization goes through `kernel[grid](...)` (compile or Triton's
  cache) with Gluon's `TensorDescriptor`s, and keeps the compiled kernel it returns.
- Its key is what Triton specializes on: the device, the constexprs, each descriptor's dtype and block
  rows, and Triton's own specialization of every other argument (`native_specialize_impl`: dtype and
  16-byte alignment of a pointer, width, divisibility by 16 and == 1 of an int).
- Later launches with that key call the compiled kernel's launcher directly with `TmaView`s: the
  fields Triton's launcher reads to build the TMA descriptor (base, global shape, strides). The block
  shape and swizzle come from the compiled kernel, so one view serves every launch of a call that reads
  the same tensor, whatever its tile rows.
- With a launch hook set (a profiler such as proton), every launch takes the JIT path, which calls it;
  FLASHTRAIN_COMPILED_LAUNCH=0 sends every launch there (A/B measurements, a safety valve).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

ENABLED = os.environ.get("FLASHTRAIN_COMPILED_LAUNCH", "1") != "0"


class TmaView(NamedTuple):
    """A (batch, heads, seqlen, headdim) view of a (batch, seqlen, heads, headdim) tensor, as Triton's
    launcher reads a host tensor descriptor (`base`, `shape`, `strides`, `padding`)."""

    base: torch.Tensor
    shape: list
    strides: list
    padding: str = "zero"


def tma_view(t: torch.Tensor) -> TmaView:
    batch, seqlen, heads, headdim = t.shape
    return TmaView(t, [batch, heads, seqlen, headdim], [t.stride(0), t.stride(2), t.stride(1), 1])


def _current_device() -> int:
    return torch.cuda.current_device()  # (the device Triton's JIT launch compiles and launches for)


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _launch_hooks_set() -> bool:
    # Triton 3.6 keeps each hook as a HookChain, empty unless a tool added to it
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and (not isinstance(hook, knobs.HookChain) or hook.calls) for hook in hooks)


def _specialization(arg) -> tuple:
    # Triton's own per-argument specialization: jit.py's binder calls the same function per argument,
    # with the CUDA backend, which in Triton 3.6 keeps BaseBackend's specialization hooks
    return native_specialize_impl(BaseBackend, arg, False, True, True)


class CompiledLaunch:
    """Launches one kernel whose parameters are its TMA descriptors, then plain arguments, then its
    constexprs, in that order (checked at the first launch)."""

    def __init__(self, kernel, make_descriptor):
        self.kernel = kernel
        self.make_descriptor = make_descriptor  # (tensor, rows) -> Gluon TensorDescriptor
        self._compiled = {}  # key -> (compiled kernel, its constexprs' values in parameter order)
        self.fast_launches = 0  # (tests count them)

    def __call__(self, grid, descriptors, args, kwargs: dict, views: dict | None = None):
        """kernel[grid](*descriptors, *args, **kwargs). grid: 1 to 3 program counts; descriptors: (tensor,
        block rows) pairs; kwargs: the constexprs, then launch options (num_warps); views: TmaViews by id
        of their tensor, shared between the launches of one call."""
        grid = (*grid, 1, 1)[:3]  # (the compiled launcher takes all three)
        device = _current_device()
        key = (
            device,
            *kwargs.items(),
            *((t.dtype, rows) for t, rows in descriptors),
            *map(_specialization, args),
        )
        entry = self._compiled.get(key)
        if entry is None or not ENABLED or _launch_hooks_set():
            self._jit_launch(key, grid, descriptors, args, kwargs)
            return
        compiled, constexpr_values = entry
        if views is None:
            views = {}
        tma = []
        for t, _ in descriptors:
            view = views.get(id(t))
            if view is None:
                view = views[id(t)] = tma_view(t)
            tma.append(view)
        compiled.run(
            grid[0], grid[1], grid[2], _current_stream(device), compiled.function,
            compiled.packed_metadata, None, None, None, *tma, *args, *constexpr_values,
        )  # fmt: skip
        self.fast_launches += 1

    def _jit_launch(self, key, grid, descriptors, args, kwargs):
        """Triton's own launch, with Gluon descriptors; keeps the compiled kernel under key."""
        names = self.kernel.arg_names
        constexprs = names[len(descriptors) + len(args) :]
        if sorted(constexprs) != sorted(name for name in kwargs if name in names):
            raise TypeError(
                f"{self.kernel.__name__}: CompiledLaunch needs the parameters ordered descriptors, arguments, "
                f"constexprs; after {len(descriptors)} + {len(args)} come {constexprs}, the keyword arguments "
                f"are {list(kwargs)}"
            )
        gluon_descs = [self.make_descriptor(t, rows) for t, rows in descriptors]
        compiled = self.kernel[grid](*gluon_descs, *args, **kwargs)
        self._compiled[key] = (compiled, tuple(kwargs[name] for name in constexprs))
