"""Launching the Gluon (Hopper) kernels, and the plain Triton ones (the backward's delta preprocess, the
decode kernels, the portable kernels' tuned configs), with less host work than `kernel[grid](...)`.

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
  (rows and head dim: until session 55 the head dim was left out, so a d64 and a d128 launch of one
  kernel with the same rows shared the first one's compiled kernel), and Triton's own specialization of
  every other argument (`native_specialize_impl`: dtype and 16-byte alignment of a pointer, width,
  divisibility by 16 and == 1 of an int).
- Later launches with that key call the compiled kernel's C launcher itself, the one Triton's
  `wrap_handle_tensordesc` wraps, with each TMA descriptor already encoded: Triton encodes the 128-byte
  CUtensorMap from the tensor's address, its (batch, heads, seqlen, headdim) view's shape and strides,
  and the compiled kernel's block shape and swizzle, on every launch; here it is encoded once per
  (descriptor, address, shape, strides) and kept (a tensor freed and another allocated at the same
  address with the same shape gets the same encoding, which is all the descriptor holds).
- Where the compiled kernel's launcher is not the one this was written against (Triton other than
  3.6's wrapper, scratch memory to allocate, a descriptor without its metadata), later launches call
  the compiled kernel's `run` with `TmaView`s instead: the fields Triton's launcher reads to build the
  descriptor, shared between the launches of one call.
- With a launch hook set (a profiler such as proton), every launch takes the JIT path, which calls it;
  FLASHTRAIN_COMPILED_LAUNCH=0 sends every launch there (A/B measurements, a safety valve).

Encoding once, against the `run` path, alternating in one process on one H200 (results/s35/call3,
benchmarks/check_launch_encoding.py): host time of one eager fwd+bwd 1.06-1.26x less (block-sparse d128
n4k 0.64 against 0.77 ms), of a forward 1.17-1.26x less.

A plain Triton kernel (no descriptors) goes the same way, its C launcher called directly (Triton's
descriptor wrapper returns it unwrapped): with cdiv off Triton's constexpr functions, one eager fwd+bwd on
the one-kernel backward took 1.08-1.12x less host time in three runs, a decode call 1.40-1.44x less,
generation in GPT-2 medium's shape ran 1.13-1.16x faster, a windowed (portable) fwd+bwd 1.17x less
(results/s64/call1-8; benchmarks/ab_host_trims.py --trims s64). Under Triton's interpreter (CPU tests)
every launch is Triton's own.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.backends.nvidia.driver import make_tensordesc_arg

ENABLED = os.environ.get("FLASHTRAIN_COMPILED_LAUNCH", "1") != "0"
MAX_ENCODED = 1024  # encoded descriptors kept per compiled kernel; past it the cache starts afresh
# False (FLASHTRAIN_ENCODE_ONCE=0): the `run` path on every launch (benchmarks/check_launch_encoding.py's A/B)
ENCODE_ONCE = os.environ.get("FLASHTRAIN_ENCODE_ONCE", "1") != "0"


class TmaView(NamedTuple):
    """A view of a tensor as Triton's launcher reads a host tensor descriptor (`base`, `shape`, `strides`,
    `padding`): `tma_view`'s (batch, heads, seqlen, headdim) view of a (batch, seqlen, heads, headdim)
    tensor, or one given whole with the `block` its descriptor copies (a launch's descriptors may be such
    views instead of tensors: the one-kernel backward's dq, `_flash_bwd_fused_hopper.dq_view`)."""

    base: torch.Tensor
    shape: list
    strides: list
    padding: str = "zero"
    block: tuple | None = None  # (a view given whole: its descriptor's block shape)


def tma_view(t: torch.Tensor) -> TmaView:
    batch, seqlen, heads, headdim = t.shape
    return TmaView(t, [batch, heads, seqlen, headdim], [t.stride(0), t.stride(2), t.stride(1), 1])


def _descriptor_key(t, rows: int) -> tuple:
    """What a descriptor's kernel is specialized on: its dtype and block (a tensor's: rows x head dim; a
    TmaView given whole: its own block)."""
    if isinstance(t, TmaView):
        return t.base.dtype, tuple(t.block)
    return t.dtype, rows, t.shape[-1]


def _current_device() -> int:
    return torch.cuda.current_device()  # (the device Triton's JIT launch compiles and launches for)


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _launch_hooks_set() -> bool:
    # Triton 3.6 keeps each hook as a HookChain, empty unless a tool added to it
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and (not isinstance(hook, knobs.HookChain) or hook.calls) for hook in hooks)


def specialize_argument(arg) -> tuple:
    """Triton's own specialization of one plain argument (dtype and 16-byte alignment of a pointer; width,
    divisibility by 16 and == 1 of an int): jit.py's binder calls the same function per argument, with the
    CUDA backend, which in Triton 3.6 keeps BaseBackend's specialization hooks."""
    return native_specialize_impl(BaseBackend, arg, False, True, True)


class _CLauncher(NamedTuple):
    """What the compiled kernel's `run` would do, taken apart: its C launcher and the metadata of each
    descriptor it encodes."""

    launch: object
    descriptor_metas: tuple
    cooperative: bool
    pdl: bool


def _c_launcher(compiled, n_descriptors: int) -> _CLauncher | None:
    """The C launcher below Triton 3.6's `wrap_handle_tensordesc`, if the compiled kernel's launcher is
    that wrapper over descriptors 0..n_descriptors-1, each with its metadata, and needs no scratch
    memory; with no descriptors, the C launcher itself (the wrapper returns it unwrapped then); else None
    (the `run` path)."""
    runner = compiled.run
    if getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1):
        return None
    wrapper = getattr(runner, "launch", None)
    if n_descriptors == 0:  # (a Python function there is not the C launcher this was written against)
        if not callable(wrapper) or hasattr(wrapper, "__code__"):
            return None
        return _CLauncher(wrapper, (), runner.launch_cooperative_grid, runner.launch_pdl)
    code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is None or cells is None:
        return None
    free = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells), strict=True))
    launch, indices, metas = (
        free.get(name) for name in ("launcher", "tensordesc_indices", "tensordesc_meta")
    )
    if not callable(launch) or indices != set(range(n_descriptors)):
        return None
    if not metas or len(metas) != n_descriptors or any(meta is None for meta in metas):
        return None
    return _CLauncher(launch, tuple(metas), runner.launch_cooperative_grid, runner.launch_pdl)


class _Compiled:
    """One specialization's compiled kernel, its constexprs' values in parameter order, its C launcher
    (None: the `run` path) and the descriptors encoded for it."""

    def __init__(self, compiled, constexpr_values: tuple, n_descriptors: int):
        self.compiled = compiled
        self.constexpr_values = constexpr_values
        self.c_launcher = _c_launcher(compiled, n_descriptors)
        self.encoded = {}  # (descriptor index, address, shape, strides) -> launcher arguments


class CompiledLaunch:
    """Launches one kernel whose parameters are its TMA descriptors (none for a plain Triton kernel),
    then plain arguments, then its constexprs, in that order (checked at the first launch)."""

    def __init__(self, kernel, make_descriptor=None):
        self.kernel = kernel
        self.make_descriptor = make_descriptor  # (tensor, rows) -> Gluon TensorDescriptor (None: none)
        # (a kernel defined under Triton's interpreter, as the CPU tests run: no compiled kernel, no device)
        self.interpreted = knobs.runtime.interpret
        self._compiled = {}  # key -> _Compiled
        self.fast_launches = 0  # (tests count them)
        self.encodings = 0  # descriptors encoded on the fast path (tests count them)

    def __call__(
        self,
        grid,
        descriptors,
        args,
        kwargs: dict,
        views: dict | None = None,
        specialization: tuple | None = None,
    ):
        """kernel[grid](*descriptors, *args, **kwargs). grid: 1 to 3 program counts; descriptors: (tensor,
        block rows) pairs, a tensor's place possibly taken by a TmaView with its block; kwargs: the constexprs,
        then launch options (num_warps); views: TmaViews by id of their tensor, shared between the launches of
        one call (on the `run` path); specialization: `specialize_argument` of each of args, where the caller
        has it already (None: computed here)."""
        grid = (*grid, 1, 1)[:3]  # (the compiled launcher takes all three)
        if self.interpreted:  # (only plain Triton kernels: Gluon kernels do not run there)
            if descriptors:
                raise RuntimeError(
                    f"{self.kernel.__name__} takes TMA descriptors: Triton's interpreter cannot run it"
                )
            self.kernel[grid](*args, **kwargs)
            return
        device = _current_device()
        key = (
            device,
            *kwargs.items(),
            # (a descriptor's block is (rows, head dim): two head dims with the same rows are two kernels)
            *(_descriptor_key(t, rows) for t, rows in descriptors),
            *(map(specialize_argument, args) if specialization is None else specialization),
        )
        entry = self._compiled.get(key)
        if entry is None or not ENABLED or _launch_hooks_set():
            self._jit_launch(key, grid, descriptors, args, kwargs)
            return
        compiled, c_launcher = entry.compiled, entry.c_launcher
        if c_launcher is not None and ENCODE_ONCE:
            encoded = self._encoded(entry, descriptors)
            c_launcher.launch(
                grid[0], grid[1], grid[2], _current_stream(device), compiled.function, c_launcher.cooperative,
                c_launcher.pdl, None, None, compiled.packed_metadata, None, None, None,
                *encoded, *args, *entry.constexpr_values,
            )  # fmt: skip
        else:
            compiled.run(
                grid[0], grid[1], grid[2], _current_stream(device), compiled.function,
                compiled.packed_metadata, None, None, None, *self._views(descriptors, views), *args,
                *entry.constexpr_values,
            )  # fmt: skip
        self.fast_launches += 1

    def _encoded(self, entry: _Compiled, descriptors) -> list:
        """The launcher arguments of every descriptor, encoded once per tensor address, shape and strides."""
        encoded, cache = [], entry.encoded
        for index, (t, _) in enumerate(descriptors):
            given = isinstance(t, TmaView)
            if given:
                key = (index, t.base.data_ptr(), tuple(t.shape), tuple(t.strides))
            else:
                key = (index, t.data_ptr(), t.shape, t.stride())
            arguments = cache.get(key)
            if arguments is None:
                if len(cache) >= MAX_ENCODED:  # (many short-lived buffers: start afresh)
                    cache.clear()
                # Triton's own encoding: [CUtensorMap, *shape, *strides] of the view
                arguments = cache[key] = make_tensordesc_arg(
                    t if given else tma_view(t), entry.c_launcher.descriptor_metas[index]
                )
                self.encodings += 1
            encoded += arguments
        return encoded

    @staticmethod
    def _views(descriptors, views: dict | None) -> list:
        views = {} if views is None else views
        tma = []
        for t, _ in descriptors:
            if isinstance(t, TmaView):
                tma.append(t)
                continue
            view = views.get(id(t))
            if view is None:
                view = views[id(t)] = tma_view(t)
            tma.append(view)
        return tma

    def check_parameters(self, descriptors, args, kwargs) -> list:
        """The kernel's constexpr names (its parameters after the descriptors and arguments); a TypeError
        unless kwargs gives each of them (a constexpr left at its default would leave the compiled
        launcher's constexpr values short)."""
        names = self.kernel.arg_names
        constexprs = names[len(descriptors) + len(args) :]
        if sorted(constexprs) != sorted(name for name in kwargs if name in names):
            raise TypeError(
                f"{self.kernel.__name__}: CompiledLaunch needs the parameters ordered descriptors, arguments, "
                f"constexprs; after {len(descriptors)} + {len(args)} come {constexprs}, the keyword arguments "
                f"are {list(kwargs)}"
            )
        return constexprs

    def _jit_launch(self, key, grid, descriptors, args, kwargs):
        """Triton's own launch, with Gluon descriptors; keeps the compiled kernel under key."""
        constexprs = self.check_parameters(descriptors, args, kwargs)
        gluon_descs = [self.make_descriptor(t, rows) for t, rows in descriptors]
        compiled = self.kernel[grid](*gluon_descs, *args, **kwargs)
        constexpr_values = tuple(kwargs[name] for name in constexprs)
        self._compiled[key] = _Compiled(compiled, constexpr_values, len(descriptors))
