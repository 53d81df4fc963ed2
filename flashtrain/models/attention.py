"""Attention backends, chosen by name from config.

Every backend has the same signature, on the model's (batch, seqlen, nheads, headdim) layout:

    attn(q, k, v, *, causal, softmax_scale, dropout_p, window[, key_padding_mask]) -> out

key_padding_mask (batch, seqlen_k), True = keep, is passed only when the input has padding.
A backend may also have a packed form (`qkvpacked_backend`), called on the fused QKV projection's
output viewed as (batch, seqlen, nheads + 2 * nheads_kv, headdim); the model uses it when it has one.

- `reference`: plain torch, materialises the score matrix; the numerical oracle.
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention` (PyTorch picks flash / cuDNN /
  memory-efficient / math; pin one with `torch.nn.attention.sdpa_kernel` around the step, as
  benchmarks/bench_train.py does), but never cuDNN's for a tensor past 2**31 elements, where its dq
  was wrong (`sdpa_cudnn_wrong`).
- `triton`: our FlashAttention kernel from `kernels/`.
- `block_sparse`: our block-sparse kernel with a layout built from the model config.
- `auto` (default): on CUDA our kernel for long sequences, windows and padding, SDPA for short ones
  (the measured crossover) and wherever PyTorch would run cuDNN's attention, which is level with ours or
  faster (Hopper with cuDNN >= 9.15.1) but at head dim 128 without GQA on an H100/H200, and for tensors
  past 2**31 elements; SDPA on CPU, where the Triton interpreter is far too slow to train with.

Sequence parallelism does not add a branch here: the trainer enters `attention_override(fn)` around
the step and every attention call in the model goes to `fn` (ring or Ulysses) instead.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import _flash_bwd
from kernels._common import exceeds_extent_limit
from kernels.reference import split_qkv

AttentionFn = Callable[..., torch.Tensor]

# A plain stack, not a context variable: the backward of CUDA tensors runs on autograd's device
# threads, which do not see the training thread's context variables, and activation checkpointing
# re-runs the forward there. With a context variable the recomputed blocks silently fell back to the
# model's own backend (local attention on a sequence shard instead of the ring): finite loss, gradients
# of 1e23 (sp=2 on GPUs). `apply_ac` also re-enters the forward's override for the recompute.
_override: list[AttentionFn] = []


@contextlib.contextmanager
def attention_override(fn: AttentionFn) -> Iterator[None]:
    """Route every model attention call inside the block to `fn` (used for sequence parallelism)."""
    _override.append(fn)
    try:
        yield
    finally:
        _override.pop()


def current_override() -> AttentionFn | None:
    return _override[-1] if _override else None


def reference_attention(
    q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None
):
    from kernels.reference import attention_mask

    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    group = nheads // nheads_kv
    qh = q.transpose(1, 2)  # (B, H, T, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, S, D)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # (B, H, T, S)
    if causal or window is not None or key_padding_mask is not None:
        keep = attention_mask(seqlen_q, seqlen_k, causal=causal, window=window, device=q.device)
        if key_padding_mask is not None:
            keep = keep & key_padding_mask[:, None, None, :]  # (B, 1, T, S)
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    probs = torch.nan_to_num(probs)  # rows with no visible key give 0, as the kernels do
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return (probs @ vh).transpose(1, 2)  # (B, T, H, D)


# SDPA's cuDNN backend computed dq wrong where a tensor spans past 2**31 elements (torch 2.11.0+cu130,
# cuDNN 9.19.0, one H200, results/s73/call2-6: the last rows' dq 1.9e-3-2.5e-3 off float32 where its
# largest value is 8.1e-3, one sequence of 1.11M tokens x 16 heads of 128; 5.4e-3 of 2.3e-2 over 9
# sequences of 131k, each far under the limit), and right under it (512k tokens, or 1.11M at 8 heads:
# 2.6e-5-4.0e-5, as ours); its output was right throughout, as were ours and SDPA's flash kernel (55.5 s
# against 30.8 for ours and cuDNN at 1.11M).
SDPA_CUDNN_MAX_ELEMENTS = 2**31
_SDPA_BUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_cudnn_wrong(*tensors: torch.Tensor) -> bool:
    """Whether SDPA's cuDNN backend may compute this call wrong: one of the tensors (batch included, its
    strides counted) spans past SDPA_CUDNN_MAX_ELEMENTS elements (`exceeds_extent_limit` over the batch)."""
    compiling = torch.compiler.is_compiling()
    for t in tensors:
        if exceeds_extent_limit(t, t.shape[0], 0, compiling, limit=SDPA_CUDNN_MAX_ELEMENTS):
            return True
    return False


def sdpa_needs_mask(seqlen_q, seqlen_k, causal, window, key_padding_mask) -> bool:
    """Whether `sdpa_attention` passes SDPA a dense mask for this call (which leaves its fused kernels)."""
    return window is not None or key_padding_mask is not None or (causal and seqlen_q != seqlen_k)


def sdpa_attention(q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None):
    from kernels.reference import attention_mask

    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    mask = None
    # SDPA has no window or padding argument, and aligns is_causal top-left where ours is
    # bottom-right (kernels/reference.py); those cases get a boolean mask, which makes SDPA leave
    # its flash kernel for the memory-efficient or math one.
    if sdpa_needs_mask(q.shape[1], k.shape[1], causal, window, key_padding_mask):
        mask = attention_mask(q.shape[1], k.shape[1], causal=causal, window=window, device=q.device)
        if key_padding_mask is not None:
            mask = mask & key_padding_mask[:, None, None, :]  # (B, 1, T, S)
        causal = False
    gqa = kh.shape[1] != qh.shape[1]
    kw = dict(attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale, enable_gqa=gqa)
    with sdpa_kernel(_SDPA_BUT_CUDNN) if sdpa_cudnn_wrong(q, k, v) else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(qh, kh, vh, **kw)
    if key_padding_mask is not None:
        out = torch.nan_to_num(out)  # rows with no visible key: 0, as the kernels give
    return out.transpose(1, 2)  # (B, T, H, D)


# Traced by torch.compile without a graph break: the kernels' dense path is a pair of torch operators
# (kernels/flash_attention.py), which the compiled graph calls as opaque operators.
def triton_attention(
    q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None, **kernel_kw
):
    """Our kernel (kernels.flash_attention); kernel_kw: its further options (`triton_nondeterministic_attention`)."""
    from kernels import flash_attention

    return flash_attention(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        dropout_p=dropout_p,
        window=window,
        key_padding_mask=key_padding_mask,
        **kernel_kw,
    )


def triton_attention_qkvpacked(
    qkv,
    *,
    nheads_kv,
    causal,
    softmax_scale=None,
    dropout_p=0.0,
    window=None,
    key_padding_mask=None,
    **kernel_kw,
):
    """`triton_attention` on a packed qkv: the backward writes the projection's gradient in one
    buffer instead of three that autograd concatenates (kernels.flash_attention_qkvpacked)."""
    from kernels import flash_attention_qkvpacked

    return flash_attention_qkvpacked(
        qkv,
        nheads_kv=nheads_kv,
        causal=causal,
        softmax_scale=softmax_scale,
        dropout_p=dropout_p,
        window=window,
        key_padding_mask=key_padding_mask,
        **kernel_kw,
    )


def triton_nondeterministic_attention(q, k, v, **kw):
    """`triton_attention` with deterministic=False: on an H100/H200 at head dim 128 (full attention, causal
    from 4k tokens) the one-kernel backward, whose dq sums in a run-dependent order; other Hopper calls
    run as `triton` (kernels.flash_attention)."""
    return triton_attention(q, k, v, deterministic=False, **kw)


def triton_nondeterministic_attention_qkvpacked(qkv, **kw):
    """`triton_attention_qkvpacked` with deterministic=False."""
    return triton_attention_qkvpacked(qkv, deterministic=False, **kw)


# Shortest sequence for which `auto` picks our kernel over SDPA's flash kernel on CUDA. Measured end to
# end on an H200 (benchmarks/results/train_h200.json, GPT-2 small/medium, bf16, compiled blocks, one
# process per row): at 1k SDPA flash was as fast (medium, 0.98x) or faster (small, whose step is
# host-bound with our kernel); from 4k ours was 1.08-1.19x SDPA flash. Windows and key padding always
# take ours: SDPA handles them only through a dense mask, off its fused kernels.
AUTO_TRITON_MIN_SEQLEN = 4096
# With attention dropout, head dims up to this stay with SDPA at every length: GPT-2 small (head dim
# 64) with attention dropout 0.1 trained at 0.95-0.96x SDPA flash's tokens/s with ours at 4k and 8k
# (benchmarks/results/train_attn_dropout_h200.json; the kernels alone 0.95-0.98x), while at head dim
# 128 our dropout kernels run 1.16-1.17x SDPA flash's (attention_dropout_on_spans_h200.json).
AUTO_SDPA_DROPOUT_MAX_HEADDIM = 64
# Shortest sequence for which `auto` picks ours under torch.use_deterministic_algorithms(True). SDPA then
# runs no cuDNN kernel, and its flash and memory-efficient backwards switch to deterministic variants;
# ours is deterministic by default. fwd+bwd on one H200, ours ÷ SDPA flash's deterministic variant
# (speed), d64 and d128, causal and full: 1.23-1.73x at 512-2k (results/s44/call12), 1.52-2.70x at
# 4k-16k (results/s44/call2). Shorter calls were not timed.
AUTO_TRITON_MIN_SEQLEN_DETERMINISTIC = 512


def auto_picks_triton(
    on_cuda: bool,
    seqlen_k: int,
    head_dim: int,
    dropout_p: float,
    masked: bool,
    sdpa_runs_cudnn: bool = False,
    deterministic: bool = False,
    cudnn_wrong: bool = False,
) -> bool:
    """Whether `auto` runs our kernel (else SDPA) for a call; masked: a window or key padding;
    sdpa_runs_cudnn: unpinned SDPA would run cuDNN's kernel for this call (`sdpa_runs_cudnn`);
    deterministic: torch.use_deterministic_algorithms(True) is on; cudnn_wrong: a tensor past the
    size where cuDNN's backward was wrong (`sdpa_cudnn_wrong`): ours, right there and as fast (30.8 s
    fwd+bwd against cuDNN's 30.8 and SDPA flash's 55.5 at 1.11M tokens x 16 heads of 128, results/s73)."""
    if not on_cuda:
        return False
    if masked or cudnn_wrong:
        return True
    # PyTorch puts cuDNN first on sm90/sm100 with cuDNN >= 9.15.1, and cuDNN's kernels are level with
    # ours or faster at head dims 64 and 256 (torch 2.11, cuDNN 9.19; one H200): fwd+bwd ours ÷ cuDNN
    # 0.90-1.03 at 64 and 0.92-1.03 at 256 (1k-64k, results/s40/call1); GPT-2 medium (head dim 64) trains
    # level with it at 1k-8k and 0.96x at 16k (results/s33). At head dim 128 ours is level or a little
    # ahead since the ordered one-kernel backward: 0.96-1.06 at 1k-64k, causal and full (results/s48/call5,
    # call7, s49/call1, call3; 0.94-0.99 on the two kernels, s39/call4; 1.01-1.04 at causal 16k-64k and
    # full 16k-32k in five alternating rounds, s51/call3, call6; since its consumers only stage their dQ,
    # 1.02-1.06 at causal and full 4k-64k, s52/call4-6, s53/call3), and end to end too, so there the caller
    # takes ours before asking here (`ours_beats_cudnn`). When these were first set cuDNN was 1.12-1.40x
    # ours (results/sdpa_choice_h*).
    if sdpa_runs_cudnn:
        return False
    if dropout_p > 0.0 and head_dim <= AUTO_SDPA_DROPOUT_MAX_HEADDIM:
        return False
    return seqlen_k >= (AUTO_TRITON_MIN_SEQLEN_DETERMINISTIC if deterministic else AUTO_TRITON_MIN_SEQLEN)


# Sequence length the probe uses for calls longer than one token: the selector's cuDNN checks read
# the lengths only to refuse 1 (and, before cuDNN 9, lengths off a multiple of 64, a version PyTorch
# never puts first).
_PROBE_SEQLEN = 128


# Private PyTorch functions (in torch 2.11 and 2.13, the versions run here); a build without them gets
# the rules above alone.
_CAN_ASK_SDPA = hasattr(torch, "_fused_sdp_choice") and hasattr(torch._C, "_get_sdp_priority_order")


@functools.lru_cache(maxsize=256)
def _sdpa_choice(
    device, dtype, nheads, nheads_kv, head_dim, one_query, one_key, causal, dropout, flags
) -> int:
    """torch._fused_sdp_choice (the function SDPA dispatches through) on batch-1 tensors shaped and
    laid out like sdpa_attention's transposed views. The selector reads dropout_p only as zero or not;
    `flags` is only part of the cache key."""
    seqlen_q, seqlen_k = (1 if one else _PROBE_SEQLEN for one in (one_query, one_key))
    with torch.cuda.device(device):
        q, k, v = (
            torch.empty(1, n, h, head_dim, device=device, dtype=dtype).transpose(1, 2)
            for n, h in ((seqlen_q, nheads), (seqlen_k, nheads_kv), (seqlen_k, nheads_kv))
        )
        dropout_p = 0.1 if dropout else 0.0
        gqa = nheads != nheads_kv
        return int(torch._fused_sdp_choice(q, k, v, None, dropout_p, causal, scale=None, enable_gqa=gqa))


# A trace-time constant: compiled graphs do not call it (its arguments must be plain Python values).
@torch.compiler.assume_constant_result
def sdpa_runs_cudnn(device, dtype, nheads, nheads_kv, head_dim, one_query, one_key, causal, dropout) -> bool:
    """Whether unpinned SDPA would run cuDNN's kernel for an unmasked call, as PyTorch decides it
    (device generation, cuDNN version, dtype, head dim, dropout, the enabled backends and their
    priority, deterministic mode). one_query / one_key: a sequence of length 1; dropout: a nonzero
    dropout_p. Probed once per setting."""
    if device.type != "cuda" or not _CAN_ASK_SDPA:
        return False
    backends = torch.backends.cuda
    flags = (
        tuple(torch._C._get_sdp_priority_order()),
        backends.cudnn_sdp_enabled(),
        backends.flash_sdp_enabled(),
        backends.mem_efficient_sdp_enabled(),
        backends.math_sdp_enabled(),
        torch.are_deterministic_algorithms_enabled(),
    )
    key = (device, dtype, nheads, nheads_kv, head_dim, one_query, one_key, causal, dropout, flags)
    return _sdpa_choice(*key) == int(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)


# GQA calls `auto` gives ours over cuDNN start at this many keys (up to kernels._flash_bwd's
# ORDERED_GQA_EXPANDED_MAX_KEYS): from 8k ours led (1.007-1.031 at 8k-16k in both runs, 1.03-1.05 at 32k-64k,
# results/s74/call6); at 4k the two traded places (fwd+bwd at 32 query heads on 8, cuDNN ÷ ours 0.966-0.996
# causal, 0.997-1.017 full, s74-s76; end to end 0.994x and 0.979x, s75/call3, s76/call7) until the backward's
# route read K / V in place (session 77): causal / full 4k 1.069 / 1.059 (s77/call2), end to end 1.026x and
# 1.017x in two processes (s77/call3). Under 4k the kernels mostly lead (0.99-1.25x at 512-2k, s75/call1-2,
# s76/call3), but end to end at 1k ours ran 0.94-1.03x cuDNN's tokens/s over eight processes (five ahead),
# its steps paced by the host (s75/call2-6, s76/call4, call6). At 2k: 1.028x (s76/call4, the two kernels), and
# on the route from 2k keys with its sums kernel (session 78) 1.017x, 1.012x and 0.998x run after cuDNN in
# their processes (s78/call3, call6; rows whose first timed steps ran slow read 0.94x, the same kernels), the
# kernels 1.074-1.103x at causal 2k (s78/call2-4): level or a little ahead, so from 2k
AUTO_GQA_MIN_KEYS = 2048
# MHA calls `auto` gives ours over cuDNN start at this many keys: GPT-2 medium's width in 8 heads of 128 trained
# at 1.023x / 1.021x cuDNN's tokens/s at 1k and 1.016x / 1.029x at 2k (s75/call4, s76/call4); 512 was not
# timed end to end (our forward alone 0.956x cuDNN's there, causal, s76/call1). Until session 78 these calls
# went to cuDNN under 4k anyway: `auto_picks_triton`'s AUTO_TRITON_MIN_SEQLEN, set against SDPA flash, decided.
AUTO_MHA_MIN_KEYS = 1024


# A trace-time constant, as `sdpa_runs_cudnn`.
@torch.compiler.assume_constant_result
def ours_beats_cudnn(
    device,
    head_dim: int,
    nheads: int,
    nheads_kv: int,
    one_query: bool,
    same_length: bool,
    dropout: bool,
    keys_timed: bool = False,
) -> bool:
    """Whether ours trains at least as fast as cuDNN's attention for an unmasked call SDPA would give cuDNN:
    head dim 128, as many queries as keys (more than one; same_length: seqlen_q == seqlen_k), without
    dropout, on an H100/H200 (sm_90, where our Gluon kernels and the ordered one-kernel backward run), with
    its keys in the range where ours led (keys_timed, `_keys_timed`: without GQA from AUTO_MHA_MIN_KEYS, under
    GQA from AUTO_GQA_MIN_KEYS within `kernels._flash_bwd.gqa_route_at`'s range: the ordered one-kernel
    backward run as MHA).
    GPT-2 medium's width in 8 heads of 128, one H200, each row in a fresh process (results/s53/call3-5,
    s75/call4, s76/call4): ours ÷ cuDNN tokens/s 1.023 and 1.021 at 1k, 1.016 and 1.029 at 2k, 1.025 and 1.027
    at 4k, 1.028 and 1.024 at 8k, 1.000 and 1.002 at 16k; the kernels alone, fwd+bwd, 1.02-1.06x at causal and
    full 4k-64k in five alternating rounds (results/s52/call4-6, s53/call3), 1.006-1.042x at 1k-2k (s75/call4),
    1.031-1.054x on session 76's forward (s76/call3). The same model on 2 kv heads (results/s74/call3,
    s75/call3, call7, s77/call3): 1.017x and 1.026x at 4k, 1.015x at 8k, 1.000x at 16k, 1.007x at 32k, 1.020x at
    64k; the kernels alone at 32 query heads on 8, 1.007-1.031x at causal and full 8k-16k in two runs of three
    alternating rounds (s74/call2, call4), 1.03-1.05x at 32k-64k (call6), 1.037-1.080x at 4k-8k on the route
    reading K / V in place (s77/call2), 0.998-1.028x at 2k (s76/call4, s78/call3, call6). MHA calls under 1k
    keys stay with cuDNN (untimed end to end), GQA calls under 2k keys (AUTO_GQA_MIN_KEYS: end to end at 1k
    paced by the host) and past 64k (untimed, the route's limit); dropout runs the portable backward; a
    full-attention call on fewer queries than keys may run the two kernels too, and was not timed: those
    stay with cuDNN, as every other head dim (`auto_picks_triton`). Ours also repeats its
    gradients bit for bit, cuDNN's backward does not (results/s44/call1)."""
    timed = head_dim == 128 and same_length and not one_query and keys_timed and not dropout
    if device.type != "cuda" or not timed:
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def _keys_timed(seqlen_k: int, causal: bool, gqa: bool) -> bool:
    """Whether a call's key count is in the range `ours_beats_cudnn` timed, without GQA or under it (a plain
    bool under dynamo)."""
    if not gqa:
        return True if seqlen_k >= AUTO_MHA_MIN_KEYS else False
    return True if seqlen_k >= AUTO_GQA_MIN_KEYS and _flash_bwd.gqa_route_at(seqlen_k, causal) else False


def _auto_takes_ours(q, k, v, causal, dropout_p, window, key_padding_mask) -> bool:
    nheads_kv, seqlen_k = k.shape[2], k.shape[1]
    masked = window is not None or key_padding_mask is not None
    sdpa_cudnn = False
    # a call SDPA gets with a dense mask (causal with seqlen_q != seqlen_k too) never reaches cuDNN's fast path
    if not sdpa_needs_mask(q.shape[1], seqlen_k, causal, window, key_padding_mask):
        # plain ints and bools, as assume_constant_result needs: operator.index makes dynamo guard on a
        # symbolic head count / head dim; the lengths only as "is 1" (a guard dynamo keeps anyway)
        nheads, nheads_kv, head_dim = (
            operator.index(q.shape[2]),
            operator.index(nheads_kv),
            operator.index(q.shape[3]),
        )
        one_query = True if q.shape[1] == 1 else False  # a bool, not a SymBool, under dynamo
        one_key = True if seqlen_k == 1 else False
        same_length = True if q.shape[1] == seqlen_k else False
        dropout = True if dropout_p > 0.0 else False  # a float argument may be symbolic
        sdpa_cudnn = sdpa_runs_cudnn(
            q.device, q.dtype, nheads, nheads_kv, head_dim, one_query, one_key, bool(causal), dropout
        )
        # ours where it trains faster than the cuDNN kernel SDPA would run, at any length it was timed at
        # (auto_picks_triton's AUTO_TRITON_MIN_SEQLEN was set against SDPA flash)
        if sdpa_cudnn and ours_beats_cudnn(
            q.device, head_dim, nheads, nheads_kv, one_query, same_length, dropout,
            _keys_timed(seqlen_k, bool(causal), nheads != nheads_kv),
        ):  # fmt: skip
            return True
    deterministic = torch.are_deterministic_algorithms_enabled()
    wrong = sdpa_cudnn_wrong(q, k, v)
    return auto_picks_triton(
        q.is_cuda, seqlen_k, q.shape[-1], dropout_p, masked, sdpa_cudnn, deterministic, wrong
    )


def auto_attention(q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None):
    """The faster of our kernel and SDPA for this call on CUDA (`auto_picks_triton`); SDPA on CPU."""
    ours = _auto_takes_ours(q, k, v, causal, dropout_p, window, key_padding_mask)
    backend = triton_attention if ours else sdpa_attention
    return backend(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        dropout_p=dropout_p,
        window=window,
        key_padding_mask=key_padding_mask,
    )


def auto_attention_qkvpacked(
    qkv, *, nheads_kv, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None
):
    """`auto_attention` on a packed qkv: our packed kernel where auto picks ours, SDPA on the views otherwise."""
    kw = dict(causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p, window=window,
              key_padding_mask=key_padding_mask)  # fmt: skip
    q, k, v = split_qkv(qkv, nheads_kv)
    if _auto_takes_ours(q, k, v, causal, dropout_p, window, key_padding_mask):
        return triton_attention_qkvpacked(qkv, nheads_kv=nheads_kv, **kw)
    return sdpa_attention(q, k, v, **kw)


BACKENDS: dict[str, AttentionFn] = {
    "auto": auto_attention,
    "reference": reference_attention,
    "sdpa": sdpa_attention,
    "triton": triton_attention,
    "triton_nondeterministic": triton_nondeterministic_attention,
}


# Backends whose packed form saves work (the others gain nothing from one: the model splits qkv for them)
_QKVPACKED: dict[AttentionFn, AttentionFn] = {
    auto_attention: auto_attention_qkvpacked,
    triton_attention: triton_attention_qkvpacked,
    triton_nondeterministic_attention: triton_nondeterministic_attention_qkvpacked,
}


def qkvpacked_backend(attn: AttentionFn) -> AttentionFn | None:
    """The packed form of a backend (same options, plus nheads_kv; qkv in place of q, k, v), or None."""
    return _QKVPACKED.get(attn)


# Backends that run our Triton kernels: on a CPU only Triton's interpreter runs them (the tests).
TRITON_BACKENDS = ("triton", "triton_nondeterministic", "block_sparse")


def triton_runs_on(device: torch.device) -> bool:
    """Whether our Triton kernels run on device: CUDA, or anything under Triton's interpreter."""
    from kernels._common import INTERPRET

    return device.type == "cuda" or INTERPRET


def check_backend_device(name: str, device: torch.device) -> None:
    """Refuses a Triton backend on a device that cannot run it, naming the setting to change."""
    if name in TRITON_BACKENDS and not triton_runs_on(device):
        raise ValueError(
            f"model.attention={name} runs our Triton kernels, which need a CUDA device, and this run is on "
            f"{device}: use model.attention=auto (sdpa or reference) here, or a GPU"
        )


def get_backend(name: str) -> AttentionFn:
    if name == "block_sparse":
        raise ValueError(
            "the block_sparse backend is built from the model config; use make_block_sparse_backend"
        )
    try:
        return BACKENDS[name]
    except KeyError:
        valid = ", ".join(sorted([*BACKENDS, "block_sparse"]))
        raise ValueError(f"unknown attention backend {name!r}; choose one of: {valid}") from None
