"""Helpers shared by the attention kernels and their launchers; kernel-agnostic, reusable by other ops.

Host side (plain Python/torch): INTERPRET, LOG2E/LN2, next_power_of_2, padded_head_dim (tile width for a
head dim), dot_precision (ieee for fp32 tests), lse_to_natural, draw_seed (Philox seed from torch's CPU
generator), and input checks that raise one ValueError saying what to change: check_device,
check_dtype, check_heads, is_int, check_window, check_flag, check_causal, check_dropout, check_key_padding_mask,
check_cu_seqlens, resolve_softmax_scale, unit_last_stride, sm_count, compute_capability, sched_slots_for (the program-order argument).
Triton side (@triton.jit): load_tile/store_tile (masked only where needed), tile_program_ids (which tile,
head and batch a program takes: causal calls heaviest tiles first), varlen_bounds, visible_range (masked /
fully visible tile ranges for causal and windows), dropout_keep (Philox keep-mask from global positions)
and dropout_keep_tile (the same for a tile, one Philox call per eight entries).
Nothing here knows the tile sizes or a kernel's argument list.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os

import torch
import triton
import triton.language as tl

from . import reference
from ._launch import CompiledLaunch, specialize_argument

# The Triton interpreter is chosen when kernels are defined, so this is read once at import.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

LOG2E = 1.4426950408889634  # log2(e): scores are scaled by it so the kernels can use exp2
LN2 = 0.6931471805599453  # ln(2): converts the kernels' base-2 lse back to natural log

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


log = logging.getLogger(__name__)


# A config whose one run takes longer than this is timed from that run alone (see bench_config)
SLOW_KERNEL_MS = 10.0


def _cuda_time_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_config(fn, quantiles=None, *, time_ms=_cuda_time_ms, full_bench=None, sync=_sync):
    """The autotuner's timing of one config: [median, p20, p80] ms of `fn` (one launch).

    Triton's benchmarker runs a launch about eight times (five to estimate its length, then at least
    one warm-up and one timed repeat). A launch of seconds (a ring step of a million-token sequence
    tunes on its real shape: every length from 8k on shares one tuning key) then cost a minute per
    kernel. A launch longer than SLOW_KERNEL_MS is timed from one run after a warm-up run (which also
    compiles), since the configs differ by far more than one run's noise there; shorter ones get
    Triton's full benchmark (`full_bench`, by default `triton.testing.do_bench`).
    """
    fn()  # compile (on a config's first launch) and warm up, outside the timing
    sync()
    ms = time_ms(fn)
    if ms > SLOW_KERNEL_MS:
        return [ms] * len(quantiles) if quantiles else ms
    full_bench = full_bench or triton.testing.do_bench
    return full_bench(fn, quantiles=quantiles)


def autotune(fn, **kwargs):
    """`triton.autotune(**kwargs)(fn)` timed by `bench_config`, except that a config whose compile
    fails inside an MLIR pass counts as infinitely slow instead of ending the sweep (and the run).

    Triton's autotuner skips only configs that run out of resources or fail ptxas; Triton 3.6 on an
    H200 also failed one tile config of a dropout kernel in its TritonGPUOptimizeThreadLocality pass
    ("PassManager::run failed", a RuntimeError), which killed the sweep. Other errors still raise.
    """
    if not INTERPRET:  # the interpreter runs one fixed config and never times it
        kwargs.setdefault("do_bench", bench_config)
    tuned = triton.autotune(**kwargs)(fn)
    bench = tuned._bench

    def bench_or_skip(*args, config, **meta):
        try:
            return bench(*args, config=config, **meta)
        except RuntimeError as e:
            if "PassManager::run failed" not in str(e):
                raise
            log.warning("%s: config %s failed to compile and is skipped", fn.__name__, config)
            return [float("inf")] * 3

    tuned._bench = bench_or_skip
    # (the tuned keys' launches, `_cached_config_run`; with one config, as under the interpreter, unread)
    tuned.compiled_launch = CompiledLaunch(tuned.fn)
    if len(tuned.configs) > 1:
        tuned.run = _cached_config_run(tuned)
    return tuned


class _GridMeta(dict):
    """A grid function's argument as jit.py builds it, every argument by name with the constexprs and the
    config's values beside them, except that a plain argument is looked up only when the grid reads it: a
    dict of all ~40 per launch took ~6 us of host time against ~1.3 for this (this project's 2-core CPU machine,
    session 89), and the kernels' grids read only BLOCK_M or BLOCK_N."""

    def __init__(self, meta: dict, args: tuple, index: dict):
        super().__init__(meta)
        self.args, self.index = args, index

    def _passed(self, name) -> bool:  # (a parameter the launch gave positionally)
        return self.index.get(name, len(self.args)) < len(self.args)

    def __missing__(self, name):
        if not self._passed(name):
            raise KeyError(name)
        return self.args[self.index[name]]

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or self._passed(name)

    def get(self, name, default=None):
        return self[name] if name in self else default


def _cached_config_run(tuned):
    """`tuned.run` with a fast path once a key is tuned: Triton 3.6's `Autotuner.run` rebuilds three
    dicts of all ~40 kernel arguments and formats every tensor's dtype on each launch, 60-90 us of host
    time per launch on an H200 machine, three launches per attention forward and backward. The key here
    holds that information (the tuning-key arguments, and Triton's specialization of every argument,
    which names each tensor's dtype), read straight from the arguments; an untuned key goes through
    Triton's own run, which tunes and records the config (a key it has tuned under another alignment or
    divisibility it only looks up). The recorded config then launches through `_launch.CompiledLaunch`
    (`tuned.compiled_launch`), given the same specialization for its own key: the compiled kernel's own
    launcher after its first launch, not the JIT binder's per-call argument specialization.

    A grid callable gets what jit.py gives it (`_GridMeta`)."""
    base_run = tuned.run
    positions = [(name, tuned.arg_names.index(name)) for name in tuned.keys if name in tuned.arg_names]
    index = {name: i for i, name in enumerate(tuned.arg_names)}
    chosen = {}

    def run(*args, **kwargs):
        # (one pass over the ~40 arguments serves both keys: the dtype pass it replaces took about as long, session 89)
        specialization = tuple(map(specialize_argument, args))
        key = specialization + tuple(
            kwargs[n] if n in kwargs else args[i] for n, i in positions if n in kwargs or i < len(args)
        )
        config = chosen.get(key) if len(tuned.configs) > 1 else None
        if config is None or config.pre_hook is not None:  # tune, or run a config's hook: Triton's path
            ret = base_run(*args, **kwargs)
            chosen[key] = tuned.best_config
            return ret
        tuned.best_config = config
        # (kwargs: the constexprs, and `kernel[grid]`'s grid and warmup)
        grid, meta = kwargs["grid"], {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        meta.update(config.all_kwargs())
        if callable(grid):
            grid = grid(_GridMeta(meta, args, index))
        tuned.compiled_launch(grid, (), args, meta, specialization=specialization)

    return run


# Host-side integer helpers: Triton 3.6's triton.cdiv and triton.next_power_of_2 are constexpr functions,
# ~2 us a host call (each argument unwrapped through Triton's constexpr machinery), and a short eager
# attention call made ~17 of them (results/s63/call8's profiles)
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def padded_head_dim(headdim: int) -> int:
    """Tile width for a head dim: the next power of two, at least 16 (tl.dot's smallest K)."""
    return max(16, next_power_of_2(headdim))


def token_strides(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, token, head) strides of t as the attention kernels index it. A packed varlen tensor
    (T, H, D) has batch stride 0: each program adds its sequence's start instead."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs are for tests: ask tl.dot for exact fp32 rather than Triton's default tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def lse_to_natural(lse2: torch.Tensor) -> torch.Tensor:
    """Kernel lse (log2 units, of scores pre-multiplied by log2(e)) -> natural log. -inf stays -inf."""
    return lse2 * LN2


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A Philox seed from torch's CPU generator, so torch.manual_seed makes dropout reproducible.

    Drawing on the CPU generator costs no device sync (a CUDA generator's .item() would sync).
    """
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())


def inference_call(*tensors) -> bool:
    """Whether no gradient can flow from an attention call on these tensors (grad mode off, or none
    requiring one) outside a torch.compile trace (which keeps the autograd Function and op, so that the
    compiled graph stays whole): the call may then run its forward's launcher directly, without the
    autograd Function and the op's dispatch, with the same kernels and results (a prompt's prefill in
    `flashtrain.generate`, evaluation)."""
    if torch.compiler.is_compiling():
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


def check_rank(name: str, t, ndim: int, layout: str) -> None:
    """t is a tensor of ndim dims laid out as `layout`; a list or a tensor of another rank says so."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-d tensor {layout}, got shape {tuple(t.shape)}")


# The kernels offset each sequence's start in 64 bits, but rows, heads and features inside one sequence in 32
# (an int32 row times its stride) unless built WIDE. Past this many elements in one sequence (1.11M tokens x
# 16 heads of 128 on an H200) the windowed forward read out of bounds (benchmarks/check_large_offsets.py,
# results/s71/call8/), so a call with such a tensor takes the WIDE builds (`wide_offsets`, `widen`).
SEQUENCE_EXTENT_LIMIT = 2**31


def sequence_extent(t: torch.Tensor, rows: int, row_dim: int) -> int:
    """Elements one sequence of t spans: `rows` rows along row_dim, and every dim after it."""
    if rows < 1 or t.numel() == 0:
        return 0
    shape, stride = t.shape, t.stride()
    extent = (rows - 1) * stride[row_dim] + 1
    for i in range(row_dim + 1, len(shape)):
        extent += (shape[i] - 1) * stride[i]
    return extent


def exceeds_extent_limit(
    t: torch.Tensor, rows: int, row_dim: int, compiling: bool | None = None, limit: int | None = None
) -> bool:
    """Whether one sequence of t spans past `limit` (SEQUENCE_EXTENT_LIMIT) elements. A tensor whose storage
    holds no more elements than that cannot: the common case, ~0.4 us of host time against ~1.3 for the
    strides' sum (a decode call's host time is ~85 us). Under torch.compile's trace (fake storages;
    `compiling`, when the caller has asked already) the sum decides."""
    limit = SEQUENCE_EXTENT_LIMIT if limit is None else limit
    if not (torch.compiler.is_compiling() if compiling is None else compiling):
        if t.untyped_storage().nbytes() <= limit * t.element_size():
            return False
    return sequence_extent(t, rows, row_dim) > limit


def wide_offsets(tensors, varlen_rows: int | None = None) -> bool:
    """Whether a launch on these tensors (None entries skipped) needs the kernels' WIDE build: one
    sequence of one of them spans past SEQUENCE_EXTENT_LIMIT elements (`exceeds_extent_limit`). Dense
    tensors are (batch, seqlen, ...); varlen ones (total, ...) with sequences of up to varlen_rows rows.
    A loop, not any() over a generator: ~0.25 us a tensor (a backward passes nine)."""
    compiling = torch.compiler.is_compiling()
    row_dim = 1 if varlen_rows is None else 0
    for t in tensors:
        if t is None:
            continue
        if exceeds_extent_limit(t, t.shape[1] if varlen_rows is None else varlen_rows, row_dim, compiling):
            return True
    return False


@triton.jit
def widen(stride, WIDE: tl.constexpr):
    """A row or head stride as the kernels multiply it: int64 in a WIDE build (one sequence past 2**31
    elements, where an int32 row x stride wraps), else as passed (the usual builds' code unchanged)."""
    if WIDE:
        stride = tl.cast(stride, tl.int64)
    return stride


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device, and that device CUDA unless the Triton interpreter is on."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on the same device, got {sorted(str(d) for d in devices)}")
    device = tensors[0].device
    if device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"inputs are on {device}; move tensors to CUDA or set TRITON_INTERPRET=1 (before importing kernels)"
        )
    if device.type == "cuda" and INTERPRET:
        raise ValueError("TRITON_INTERPRET=1 runs kernels on the CPU: move tensors to the CPU or unset it")


def check_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; use one of float16, bfloat16 or float32")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_heads(nheads: int, nheads_kv: int, headdim: int, headdim_k: int, headdim_v: int) -> None:
    if headdim_k != headdim or headdim_v != headdim:
        raise ValueError(f"q, k, v must share one head dim, got {headdim}, {headdim_k}, {headdim_v}")
    if not 1 <= headdim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {headdim} is not supported; use 1..{MAX_HEAD_DIM}")
    if nheads < 1 or nheads_kv < 1:
        raise ValueError(f"q and k need at least one head each, got nheads={nheads}, nheads_kv={nheads_kv}")
    if nheads % nheads_kv != 0:
        raise ValueError(
            f"nheads ({nheads}) must be a multiple of nheads_kv ({nheads_kv}) for grouped-query attention"
        )


def unit_last_stride(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Kernels take any strides except a non-unit last one; only those tensors are copied."""
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def is_int(value) -> bool:
    """An integral number that is not a bool (True is an int to Python, not a count to a caller)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_window(window) -> tuple[int | None, int | None]:
    """window=(left, right) with None meaning unbounded on that side; None means no window."""
    if window is None:
        return None, None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be a pair (left, right), got {window!r}")
    left, right = window
    for name, val in (("left", left), ("right", right)):
        if val is not None and (not is_int(val) or val < 0):
            raise ValueError(f"window {name} must be a non-negative int or None, got {val!r}")
    return (None if left is None else int(left)), (None if right is None else int(right))


def check_flag(name: str, value) -> bool:
    """A bool option: a truthy string, None or tensor would otherwise pass for True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def check_causal(causal) -> bool:
    return check_flag("causal", causal)


def resolve_softmax_scale(softmax_scale, headdim: int) -> float:
    """The scale of the scores: 1/sqrt(headdim) for None.

    The forward kernels take each row's max over unscaled scores and scale it after (one FMA per score,
    not two), which needs a scale > 0: a negative one would turn the max into the min, and 0 times a
    masked score (-inf) is NaN."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise ValueError(f"softmax_scale must be a number or None, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(
            f"softmax_scale must be finite and > 0 (or None for 1/sqrt(headdim)), got {softmax_scale!r}"
        )
    return float(softmax_scale)


def check_dropout(dropout_p: float) -> float:
    if not (isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p < 1.0) or math.isnan(dropout_p):
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    return float(dropout_p)


def check_key_padding_mask(mask: torch.Tensor | None, batch: int, seqlen_k: int, device) -> None:
    if mask is None:
        return
    check_rank("key_padding_mask", mask, 2, "(batch, seqlen_k) of bool")
    if mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask must be bool (True = keep), got {mask.dtype}")
    if tuple(mask.shape) != (batch, seqlen_k):
        raise ValueError(
            f"key_padding_mask must have shape (batch, seqlen_k) = {(batch, seqlen_k)}, got {tuple(mask.shape)}"
        )
    if mask.device != device:
        raise ValueError(f"key_padding_mask is on {mask.device}, the inputs on {device}")


def check_cu_seqlens(cu: torch.Tensor, total: int, name: str) -> None:
    """cu_seqlens: int32 (batch + 1,), starting at 0, non-decreasing, ending at the packed length.

    The monotonicity check reads the tensor on the host: a device sync, paid once per call.
    """
    check_rank(name, cu, 1, "(batch + 1,) of int32")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {cu.dtype}")
    if cu.numel() < 2:
        raise ValueError(f"{name} must have shape (batch + 1,), got {tuple(cu.shape)}")
    host = cu.cpu()  # host-device sync
    if int(host[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(host[0])}")
    if bool((host[1:] < host[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {host.tolist()}")
    if int(host[-1]) != total:
        raise ValueError(f"{name}[-1] = {int(host[-1])} must equal the packed length {total}")


# ---------------------------------------------------------------------------------------------------
# Triton helpers shared by the forward, backward and decode kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def mask_scores(
    qk, offs_n, pos_m, seqlen_k, win_left, win_right, KPM, stride_kpmn,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr,
):  # fmt: skip
    """Scores (queries at positions pos_m x keys offs_n) with -inf where a key is past seqlen_k or outside the
    window (MASKED tiles only), or padding (key_padding_mask KPM, every tile)."""
    if MASKED:
        keep = offs_n[None, :] < seqlen_k
        if HAS_RIGHT:
            keep = keep & (offs_n[None, :] <= pos_m[:, None] + win_right)
        if HAS_LEFT:
            keep = keep & (offs_n[None, :] >= pos_m[:, None] - win_left)
        qk = tl.where(keep, qk, float("-inf"))
    if HAS_KPM:
        kpm = tl.load(KPM + offs_n * stride_kpmn, mask=offs_n < seqlen_k, other=0)
        qk = tl.where(kpm[None, :] != 0, qk, float("-inf"))
    return qk


@triton.jit
def load_tile(
    ptrs, offs_r, offs_d, n_rows, HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, PAD_D: tl.constexpr
):
    """Load a (rows, BLOCK_D) tile; rows past n_rows and head-dim padding read as 0.

    Interior tiles of an unpadded head dim take the unmasked load, which is what makes the fast loop fast.
    """
    if MASK_ROWS:
        if PAD_D:
            x = tl.load(ptrs, mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        else:
            x = tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
    else:
        if PAD_D:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def rowsum_do_o(o_ptrs, do, offs_m, offs_d, seqlen_q, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta = rowsum(dO * O) in fp32 of one query tile, given its loaded dO and O's tile pointers: the
    backward's dS = P * (dP - delta) (the preprocess kernel and the dq kernels that compute it themselves)."""
    o = load_tile(o_ptrs, offs_m, offs_d, seqlen_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit
def varlen_bounds(CU, off_b):
    """(start, length) of packed sequence off_b from its cu_seqlens: int64 start, int32 length."""
    start = tl.load(CU + off_b).to(tl.int64)
    return start, (tl.load(CU + off_b + 1) - start).to(tl.int32)


@triton.jit
def store_tile(ptrs, x, offs_r, offs_d, n_rows, HEAD_DIM: tl.constexpr):
    tl.store(ptrs, x, mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def store_or_add_tile(ptrs, x, offs_r, offs_d, n_rows, HEAD_DIM: tl.constexpr, ACCUMULATE: tl.constexpr):
    """Store an fp32 tile in the pointers' dtype, or with ACCUMULATE add it to what they hold (each
    tile belongs to one program, so this read-modify-write needs no atomics)."""
    mask = (offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    if ACCUMULATE:
        x = x + tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


# Program order of the attention kernels. Their grid is (tiles, heads, batch) and the GPU starts programs
# in grid order, x fastest. Under a causal mask a tile's work grows with its distance from the diagonal,
# and taking each head's tiles heaviest first is not enough: the last head's heaviest tiles then start when
# little else is left and form a tail (GPT-2 medium at 8k, batch 2 x 16 heads: 6-13% of a kernel in a
# list-scheduling model). Taking the tiles heaviest first across all heads (tile-major order) removes the
# tail but, with many short heads, leaves one program per head in flight and the next tile of that head
# far behind, so K/V stop being shared in L2 (measured on an H200: 9-10% slower at batch 16 x 16-32 heads
# x 1k). So the heads go in chunks, tile-major inside a chunk: a chunk holds about four waves of programs
# (which bounds the tail to a fraction of a wave) and at most slots/4 heads (so each has >= 4 programs in
# flight, reading the same K/V). slots (programs resident at once) = 0 keeps the plain grid order.
def sched_slots_for(device: torch.device, heavy_first: bool) -> int:
    """The kernels' `sched_slots` argument: 0 (grid order) unless the call's tiles differ in work
    (heavy_first: causal-like); then two programs per SM (`sm_count`: in the interpreter, where only
    the mapping is tested, tests/kernels/test_grid_order.py, 8 slots)."""
    return 2 * sm_count(device) if heavy_first else 0


# What the interpreter (CPU tensors) counts as SMs, so that launch arithmetic sized by SMs runs there too.
INTERPRETER_SMS = 4


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device's GPU (INTERPRETER_SMS for a CPU tensor)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def compute_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, read once per device (every forward call
    asks, to choose its kernel)."""
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@triton.jit
def tile_program_ids(sched_slots):
    """(tile, number of tiles, head, batch) of this program in the (tiles, heads, batch) grid, in the
    chunked tile-major order described above (the plain grid order when sched_slots is 0)."""
    n_tiles = tl.num_programs(0)
    nheads = tl.num_programs(1)
    n_groups = nheads * tl.num_programs(2)
    pid = tl.program_id(0) + n_tiles * (tl.program_id(1) + nheads * tl.program_id(2))
    return tile_ids(pid, n_tiles, nheads, n_groups, sched_slots)


@triton.jit
def tile_ids(pid, n_tiles, nheads, n_groups, sched_slots):
    """`tile_program_ids` of work item pid (0 .. n_tiles * n_groups - 1, in launch order) of n_tiles
    tiles of each of n_groups (batch x nheads) heads: what a persistent program, which walks several
    items, asks for each of them."""
    chunk = tl.minimum(tl.cdiv(4 * sched_slots, n_tiles), sched_slots // 4)  # heads per chunk
    chunk = tl.minimum(tl.maximum(chunk, 1), n_groups)
    first = (pid // (chunk * n_tiles)) * chunk  # first head (of batch x heads) of this program's chunk
    in_chunk = tl.minimum(chunk, n_groups - first)  # the last chunk may be short
    within = pid - first * n_tiles
    tile = within // in_chunk
    group = first + within - tile * in_chunk
    return tile, n_tiles, group % nheads, group // nheads


@triton.jit
def visible_range(
    y_lo, y_hi, n, off_lo, off_hi, BLOCK: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr
):
    """Tiles of the other axis that a block sees, when index x is visible from y iff y+off_lo <= x <= y+off_hi.

    [y_lo, y_hi] are the block's first and last valid indices, n the length of the other axis. Returns
    (lo, full_lo, full_hi, hi): tiles in [lo, full_lo) and [full_hi, hi) need element masks, tiles in
    [full_lo, full_hi) are fully visible to every row of the block and fully in bounds. lo, full_lo and
    full_hi are multiples of BLOCK (or equal hi), so every tile starts aligned.
    """
    lo = 0
    hi = n
    full_lo = 0
    full_hi = (n // BLOCK) * BLOCK
    if HAS_LO:
        lo = (tl.maximum(y_lo + off_lo, 0) // BLOCK) * BLOCK
        full_lo = tl.cdiv(tl.maximum(y_hi + off_lo, 0), BLOCK) * BLOCK
    if HAS_HI:
        hi = tl.minimum(tl.maximum(y_hi + off_hi + 1, 0), n)
        full_hi = tl.minimum(full_hi, (tl.maximum(y_lo + off_hi + 1, 0) // BLOCK) * BLOCK)
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _philox_block(seed, groups, rows):
    """Philox4x32 (PHILOX_ROUNDS rounds) keyed by the seed with counter (group, low and high words of the
    int64 row id, 0).

    groups: uint32, rows: int64, broadcastable; returns the four uint32 words at their common shape. The
    row id fills two 32-bit counter words, so 32-bit Philox covers any length without 64-bit multiplies.
    """
    row_lo = (rows & 0xFFFFFFFF).to(tl.uint32)
    row_hi = (rows >> 32).to(tl.uint32)
    c0 = groups + row_lo * 0  # the full shape
    zero = c0 * 0
    return tl.philox(seed, c0, row_lo + zero, row_hi + zero, zero, PHILOX_ROUNDS)


# Seven rounds, as FlashAttention-2's dropout uses: Philox4x32-7 passes TestU01's BigCrush (Salmon et
# al. 2011, "Parallel random numbers: as easy as 1, 2, 3"); ten is Random123's default safety margin.
# (Constexpr values, not just annotated, or the GPU compiler refuses the globals.)
PHILOX_ROUNDS = tl.constexpr(reference.PHILOX_ROUNDS)

# Each 32-bit Philox word gives two 16-bit draws, so one call serves eight entries of a row. A draw h in
# [0, 65536) keeps its entry when h >= ceil(p * 65536): dropout_p acts at 2^-16 resolution (the keep
# rate is off by less than 1.6e-5; the kept entries are still scaled by 1 / (1 - p)).
# Which eight: the columns of a 32-column span are dealt to its four calls the way a GPU's matmul
# accumulators hold them (Hopper wgmma and Ampere mma give each thread the column pair 2k, 2k + 1 of
# every 8-column chunk): column 32s + 8t + 2k + h takes half h of word t of call 4s + k. A tile's draws
# then land in the registers that hold its scores, with no exchange between threads.
SPAN = tl.constexpr(32)

# Values of the kernels' DROPOUT meta-parameter: off, on with every key tile starting on a 32-column
# span (so the kernel is built without the path for tiles that start inside one: its registers cost
# the dk/dv kernel spills even when it never runs), or on with any column offset (varlen, whose keys are
# numbered by packed position, and ring shards that start off a span).
DROPOUT_OFF, DROPOUT_ON_SPANS, DROPOUT_ANY_OFFSET = (tl.constexpr(v) for v in range(3))


def dropout_mode(dropout_p: float, col0: int = 0, varlen: bool = False) -> int:
    """The DROPOUT meta-parameter of a launch whose key j has dropout column col0 + j (the key tiles
    starting at multiples of their width)."""
    if dropout_p == 0.0:
        return DROPOUT_OFF.value
    return (DROPOUT_ANY_OFFSET if varlen or col0 % SPAN.value else DROPOUT_ON_SPANS).value


@triton.jit
def _keep_threshold(dropout_p):
    return tl.math.ceil(dropout_p * 65536.0).to(tl.int32)


@triton.jit
def _half_keep(halves, dropout_p):
    """halves: int32 draws in [0, 65536)."""
    return halves >= _keep_threshold(dropout_p)


@triton.jit
def _low_half(word):
    return (word & 0xFFFF).to(tl.int32)


@triton.jit
def _high_half(word):
    return (word >> 16).to(tl.int32)


@triton.jit
def dropout_keep(seed, row_ids, col_ids, dropout_p):
    """Keep-mask of entries (row id, column), any broadcastable shapes: the definition of our dropout.

    Column c = 32s + 8t + 2k + h (t, k in 0..3, h in 0..1) takes 16-bit half h (low half first) of word t
    of the Philox4x32-7 block with counter (4s + k, row id); the entry is kept when that half is
    >= ceil(dropout_p * 65536). row_ids: int64 (dense kernels: (batch * nheads + head) * seqlen_q +
    query, the lse index; callers may offset it to global coordinates); col_ids: key index >= 0.
    `dropout_keep_tile` draws a tile this way with one call per eight entries;
    `kernels.reference.dropout_keep_reference` is this in torch.
    """
    rows = row_ids.to(tl.int64)
    cols = col_ids.to(tl.int64)
    call = (cols // SPAN) * 4 + (cols % 8) // 2
    w0, w1, w2, w3 = _philox_block(seed, call.to(tl.uint32), rows)
    word = ((cols % SPAN) // 8) + rows * 0
    bits = tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3)))
    high = (cols % 2) + rows * 0
    halves = tl.where(high == 1, _high_half(bits), _low_half(bits))
    return _half_keep(halves, dropout_p)


@triton.jit
def _join_halves(word, threshold):
    """(R, S, 4) words -> (R, S, 4, 2) keep decisions: [..., h] = half h (0 low, 1 high) >= threshold."""
    return tl.join(_low_half(word) >= threshold, _high_half(word) >= threshold)


@triton.jit
def _span_keep(seed, span0, rows, dropout_p, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS) keep decisions of columns 32 * span0 .. 32 * span0 + COLS - 1 (COLS a multiple of 32)."""
    # call 4s + k sits at index 4 (s - span0) + k
    calls = (span0 * 4 + tl.arange(0, COLS // 8)[None, :]).to(tl.uint32)
    w0, w1, w2, w3 = _philox_block(seed, calls, rows)
    # compared before they are spread over the tile: where the tile's layout needs the decisions moved
    # between threads (the dk/dv kernel's transposed tile), bytes move, not 32-bit words
    threshold = _keep_threshold(dropout_p)
    x0 = _join_halves(tl.reshape(w0, (ROWS, COLS // SPAN, 4)), threshold)
    x1 = _join_halves(tl.reshape(w1, (ROWS, COLS // SPAN, 4)), threshold)
    x2 = _join_halves(tl.reshape(w2, (ROWS, COLS // SPAN, 4)), threshold)
    x3 = _join_halves(tl.reshape(w3, (ROWS, COLS // SPAN, 4)), threshold)
    # [row, s, k, h, t1, t0] = half h of word t0 + 2 t1 of call 4s + k; column 32s + 16 t1 + 8 t0 + 2k + h.
    # t0 is joined last: of the three it is the one the dk/dv kernel's transposed tile also holds in
    # registers, so no exchange between threads follows that join (sm_90 build: 6 conversions per tile
    # there instead of 7; the forward's and dq's tiles need none)
    x = tl.join(tl.join(x0, x2), tl.join(x1, x3))
    return tl.reshape(tl.permute(x, (0, 1, 4, 5, 2, 3)), (ROWS, COLS))


@triton.jit
def _shifted_keep(
    seed, span0, shift, rows, dropout_p, BM: tl.constexpr, BN: tl.constexpr, WIDE: tl.constexpr
):
    """(BM, BN) keep decisions of columns 32 * span0 + shift + (0 .. BN - 1): the WIDE columns from
    32 * span0 (WIDE >= BN, a multiple of 32) and the next span, picked with `tl.gather`."""
    # drawn here again rather than passed in: a tile that starts on a span then keeps its draws in the
    # matmul's register layout; sharing them with the gather would compute them twice, once per layout
    head = _span_keep(seed, span0, rows, dropout_p, BM, WIDE).to(tl.int8)
    tail = _span_keep(seed, span0 + WIDE // SPAN, rows, dropout_p, BM, SPAN).to(tl.int8)
    entry = shift + tl.arange(0, BN)[None, :] + (rows * 0).to(tl.int32)
    head = tl.gather(head, tl.minimum(entry, WIDE - 1), 1)
    tail = tl.gather(tail, tl.maximum(entry - WIDE, 0), 1)
    return tl.where(entry < WIDE, head, tail) != 0


@triton.jit
def dropout_keep_tile(seed, row_ids, col0, dropout_p, BN: tl.constexpr, MODE: tl.constexpr):
    """`dropout_keep` of the (BM, BN) tile of rows row_ids ((BM,) int64) and columns col0 .. col0 + BN - 1.

    One Philox call per eight entries. Keys are numbered by global or packed position, so a tile need not
    start at a multiple of 32 (nor be 32 wide): then its columns are entries shift .. shift + BN - 1 of
    the spans it overlaps (shift = col0 % 32), picked with `tl.gather`. MODE: the kernel's DROPOUT; with
    DROPOUT_ON_SPANS, col0 is a multiple of 32 whenever BN >= 32, and that path is left out.
    """
    BM: tl.constexpr = row_ids.shape[0]
    rows = row_ids.to(tl.int64)[:, None]
    col0 = col0.to(tl.int64)
    span0 = col0 // SPAN
    shift = (col0 - span0 * SPAN).to(tl.int32)
    if BN < SPAN:
        keep = _shifted_keep(seed, span0, shift, rows, dropout_p, BM, BN, SPAN)
    elif MODE == DROPOUT_ON_SPANS:
        keep = _span_keep(seed, span0, rows, dropout_p, BM, BN)
    elif shift == 0:
        keep = _span_keep(seed, span0, rows, dropout_p, BM, BN)
    else:
        keep = _shifted_keep(seed, span0, shift, rows, dropout_p, BM, BN, BN)
    return keep
