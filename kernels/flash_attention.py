"""FlashAttention in Triton: forward and backward for dense and packed (varlen) sequences.

Three layers, as in flash-attention: launchers (`_flash_fwd.flash_attn_forward`,
`_flash_bwd.flash_attn_backward`) -> the torch operators `flashtrain::flash_attn_fwd/bwd` and
`flash_attn_bwd_qkvpacked` (which torch.compile keeps in one graph) and their autograd.Function ->
`flash_attention` / `flash_attention_varlen` / `flash_attention_qkvpacked` (public, which check their
inputs). The kernels live in `_flash_fwd.py` and `_flash_bwd.py`; the pure-torch oracle in `reference.py`.
"""

from __future__ import annotations

import torch

from ._common import (
    check_causal,
    check_cu_seqlens,
    check_device,
    check_dropout,
    check_dtype,
    check_flag,
    check_heads,
    check_key_padding_mask,
    check_rank,
    check_window,
    draw_seed,
    inference_call,
    is_int,
    lse_to_natural,
    resolve_softmax_scale,
    unit_last_stride,
)
from ._flash_bwd import flash_attn_backward
from ._flash_fwd import flash_attn_forward
from .reference import dropout_mask, split_qkv

__all__ = ["flash_attention", "flash_attention_qkvpacked", "flash_attention_varlen", "dropout_mask"]


# Forward and backward are two torch operators (flashtrain::flash_attn_fwd / flash_attn_bwd) with fake
# kernels, so torch.compile keeps a model's graph whole around them (a Triton launch inside an
# autograd.Function broke the graph: two compiled pieces per transformer block). The ops are opaque to
# the compiler; autograd is `_FlashAttnFunc`, which Dynamo traces through to them. They are defined
# with the low-level `torch.library.Library` API, not `@torch.library.custom_op`: the latter wraps
# every call in Python (aliasing checks, default filling, its own autograd.Function), which took
# 0.5 ms of host time per call on an H200 machine (torch 2.11), 13 ms of a GPT-2 small step.
# Dense calls pass cu_seqlens None and max_seqlen 0; varlen calls pass all four.
_LIB = torch.library.Library("flashtrain", "FRAGMENT")
_LIB.define(
    "flash_attn_fwd(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float sm_scale, int? win_left, "
    "int? win_right, float dropout_p) -> (Tensor, Tensor, Tensor)"
)
_LIB.define(
    "flash_attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse2, "
    "Tensor? key_padding_mask, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float sm_scale, int? win_left, int? win_right, float dropout_p, Tensor seed, "
    "bool atomic_dq, Tensor? dlse2=None) -> (Tensor, Tensor, Tensor)"
)
# The packed-QKV backward returns one gradient shaped like qkv (see flash_attention_qkvpacked)
_LIB.define(
    "flash_attn_bwd_qkvpacked(Tensor dout, Tensor qkv, int nheads_kv, Tensor out, Tensor lse2, "
    "Tensor? key_padding_mask, float sm_scale, int? win_left, int? win_right, float dropout_p, Tensor seed, "
    "bool atomic_dq, Tensor? dlse2=None) -> Tensor"
)


def _fwd_impl(
    q, k, v, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale,
    win_left, win_right, dropout_p,
):  # fmt: skip
    """out, base-2 lse, and the dropout seed (a CPU int64 scalar the backward regenerates the mask
    from; drawn here from torch's CPU generator, whose state activation checkpointing restores for the
    recompute). Without dropout there is no seed: an empty tensor on q's device (no kernel, nothing to
    read). A CPU output would make torch.compile cut its CUDA graphs there, and torch 2.11's graph
    partitions fail on it (`bench_train.py --compile-mode reduce-overhead`)."""
    seed = draw_seed() if dropout_p > 0 else 0
    out, lse2 = flash_attn_forward(
        q, k, v, sm_scale=sm_scale, win_left=win_left, win_right=win_right,
        key_padding_mask=key_padding_mask, dropout_p=dropout_p, seed=seed, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
    )  # fmt: skip
    return out, lse2, _seed_tensor(seed, dropout_p, q.device)


def _seed_tensor(seed: int, dropout_p: float, device: torch.device) -> torch.Tensor:
    """With dropout, the seed as a CPU int64 scalar; without, an empty int64 tensor on `device`."""
    if dropout_p > 0:
        return torch.tensor(seed, dtype=torch.int64)
    return torch.empty(0, dtype=torch.int64, device=device)


def _seed_value(seed: torch.Tensor, dropout_p: float) -> int:
    return int(seed) if dropout_p > 0 else 0


def _bwd_impl(
    dout, q, k, v, out, lse2, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    sm_scale, win_left, win_right, dropout_p, seed, atomic_dq, dlse2=None,
):  # fmt: skip
    return flash_attn_backward(
        dout, q, k, v, out, lse2, sm_scale=sm_scale, win_left=win_left, win_right=win_right,
        key_padding_mask=key_padding_mask, dropout_p=dropout_p, seed=_seed_value(seed, dropout_p), atomic_dq=atomic_dq,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, dlse2=dlse2,
    )  # fmt: skip


def _bwd_qkvpacked_impl(
    dout, qkv, nheads_kv, out, lse2, key_padding_mask, sm_scale, win_left, win_right, dropout_p, seed,
    atomic_dq, dlse2=None,
):  # fmt: skip
    dqkv = torch.empty_like(qkv)
    flash_attn_backward(
        dout, *split_qkv(qkv, nheads_kv), out, lse2, sm_scale=sm_scale, win_left=win_left, win_right=win_right,
        key_padding_mask=key_padding_mask, dropout_p=dropout_p, seed=_seed_value(seed, dropout_p), atomic_dq=atomic_dq,
        dlse2=dlse2, grads_out=split_qkv(dqkv, nheads_kv),
    )  # fmt: skip
    return dqkv


for _device in ("CPU", "CUDA"):  # CPU runs the kernels under the Triton interpreter
    _LIB.impl("flash_attn_fwd", _fwd_impl, _device)
    _LIB.impl("flash_attn_bwd", _bwd_impl, _device)
    _LIB.impl("flash_attn_bwd_qkvpacked", _bwd_qkvpacked_impl, _device)


@torch.library.register_fake("flashtrain::flash_attn_fwd", lib=_LIB)
def _(q, k, v, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, win_left,
      win_right, dropout_p):  # fmt: skip
    if cu_seqlens_q is None:  # dense (B, H, Sq)
        lse2 = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:  # varlen (H, Tq)
        lse2 = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return torch.empty_like(q), lse2, _seed_tensor(0, dropout_p, q.device)


@torch.library.register_fake("flashtrain::flash_attn_bwd", lib=_LIB)
def _(dout, q, k, v, *_):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("flashtrain::flash_attn_bwd_qkvpacked", lib=_LIB)
def _(dout, qkv, *_):
    return torch.empty_like(qkv)


class _FlashAttnFunc(torch.autograd.Function):
    """Autograd of the ops: the forward saves (q, k, v, out, lse, seed) and the options; the backward
    passes them to flash_attn_bwd.

    lse_grad: the caller returns lse to the user, so lse is differentiable and its gradient goes into
    the backward (d lse_i / d s_ij = p_ij: it joins dS through delta). Otherwise lse is marked
    non-differentiable, and the backward gets no zero-filled gradient for it.
    nheads_kv: set for a packed call (dense only): q is then the (batch, seqlen, nheads + 2 * nheads_kv,
    headdim) qkv, k and v are None, and the backward returns one gradient shaped like qkv
    (flash_attn_bwd_qkvpacked)."""

    @staticmethod
    def forward(ctx, q, k, v, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                sm_scale, win_left, win_right, dropout_p, atomic_dq, lse_grad, nheads_kv=None):  # fmt: skip
        qkv = (q, k, v) if nheads_kv is None else split_qkv(q, nheads_kv)
        out, lse2, seed = torch.ops.flashtrain.flash_attn_fwd.default(
            *qkv, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale,
            win_left, win_right, dropout_p,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse2, seed, key_padding_mask, cu_seqlens_q, cu_seqlens_k)
        ctx.options = (max_seqlen_q, max_seqlen_k, sm_scale, win_left, win_right, dropout_p)
        ctx.atomic_dq, ctx.lse_grad, ctx.nheads_kv = atomic_dq, lse_grad, nheads_kv
        if not lse_grad:
            ctx.mark_non_differentiable(lse2)
        # an output the loss does not use gets None, not zeros: a returned lse that the loss ignores then
        # keeps the backward on its plain route (delta inside the dq kernel, the Hopper kernels)
        ctx.set_materialize_grads(False)
        return out, lse2

    @staticmethod
    def backward(ctx, dout, dlse2):
        q, k, v, out, lse2, seed, key_padding_mask, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        if dout is None:  # only lse reaches the loss
            dout = torch.zeros_like(out)
        max_seqlen_q, max_seqlen_k, sm_scale, win_left, win_right, dropout_p = ctx.options
        dlse2 = dlse2 if ctx.lse_grad else None
        if ctx.nheads_kv is not None:  # q is the packed qkv
            dqkv = torch.ops.flashtrain.flash_attn_bwd_qkvpacked.default(
                dout, q, ctx.nheads_kv, out, lse2, key_padding_mask, sm_scale, win_left, win_right, dropout_p,
                seed, ctx.atomic_dq, dlse2,
            )  # fmt: skip
            return dqkv, *([None] * 14)
        dq, dk, dv = torch.ops.flashtrain.flash_attn_bwd.default(
            dout, q, k, v, out, lse2, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, sm_scale, win_left, win_right, dropout_p, seed, ctx.atomic_dq, dlse2,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 12)


def _forward(
    q, k, v, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, win_left,
    win_right, dropout_p, deterministic, return_lse, nheads_kv=None,
):  # fmt: skip
    """The checked call's forward, through the autograd Function, or straight to the launcher where no
    gradient can flow (`_common.inference_call`); out, and with return_lse the natural-log lse. nheads_kv:
    q is a packed qkv (k and v None), as in `_FlashAttnFunc`."""
    check_flag("return_lse", return_lse)
    check_flag("deterministic", deterministic)
    args = (key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, win_left,
            win_right, dropout_p)  # fmt: skip
    if inference_call(q, k, v):
        qkv = (q, k, v) if nheads_kv is None else split_qkv(q, nheads_kv)
        out, lse2, _ = _fwd_impl(*qkv, *args)
    else:
        out, lse2 = _FlashAttnFunc.apply(q, k, v, *args, not deterministic, return_lse, nheads_kv)
    return (out, lse_to_natural(lse2)) if return_lse else out


def _window_bounds(causal: bool, window) -> tuple[int | None, int | None]:
    """causal is a window with right = 0 (bottom-right aligned), so the kernels only know windows."""
    left, right = check_window(window)
    if check_causal(causal):
        right = 0 if right is None else min(right, 0)
    return left, right


def _check_common(q, k, v, dropout_p):
    check_device(q, k, v)
    check_dtype(q, k, v)
    check_heads(q.shape[-2], k.shape[-2], q.shape[-1], k.shape[-1], v.shape[-1])
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[-2]} and {v.shape[-2]}")
    return check_dropout(dropout_p)


def _attend(
    tensors, nheads_kv, seqlen_k, causal, softmax_scale, dropout_p, window, key_padding_mask, return_lse,
    deterministic,
):  # fmt: skip
    """The dense call after its shape checks, shared by flash_attention (tensors (q, k, v)) and its
    packed form (tensors (qkv,) and nheads_kv): mask and window checks, the autograd call, natural lse."""
    check_key_padding_mask(key_padding_mask, tensors[0].shape[0], seqlen_k, tensors[0].device)
    win_left, win_right = _window_bounds(causal, window)
    tensors = unit_last_stride(*tensors)
    scale = resolve_softmax_scale(softmax_scale, tensors[0].shape[-1])
    q, k, v = tensors if nheads_kv is None else (tensors[0], None, None)
    return _forward(
        q, k, v, key_padding_mask, None, None, 0, 0, scale, win_left, win_right, dropout_p, deterministic,
        return_lse, nheads_kv,
    )  # fmt: skip


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    window: tuple[int | None, int | None] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    deterministic: bool = True,
):
    """softmax(q k^T * scale) v, fused, with its backward.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim) with nheads a
    multiple of nheads_kv (GQA/MQA; K/V are never repeated in memory). Any strides with a unit last
    stride. headdim 1..256; float16/bfloat16 (float32 accepted, for tests).
    causal: query i sees keys j <= i + seqlen_k - seqlen_q (diagonal aligned bottom-right).
    window: (left, right), query i sees keys in [i' - left, i' + right] with i' its aligned position;
        None on a side is unbounded.
    key_padding_mask: bool (batch, seqlen_k), True = keep.
    dropout_p: dropout on the attention probabilities; the Philox seed comes from torch's CPU
        generator, so torch.manual_seed makes it reproducible. Entry (b, h, i, j), j = 32s + 8t + 2k + c
        (t, k in 0..3, c in 0..1), is kept when 16-bit half c of word t of Triton's Philox4x32-7 keyed by
        the seed, at counter (4s + k, (b * nheads + h) * seqlen_q + i), is >= ceil(dropout_p * 65536)
        (one Philox call serves eight keys; dropout_p acts at 2^-16 resolution); the backward
        regenerates it, and `kernels.reference.dropout_mask` draws the same mask in torch.
    deterministic: True (default) gives bitwise reproducible gradients: dq in its own kernel, without
        atomics, or on an H100/H200 at head dim 128 with full attention (at least as many queries, over
        a GQA group, as keys; up to 128 keys per SM, 16896 on 132 SMs, with at most 2 query heads a key
        head, past that in the convoy order with any) or causal on as many queries as keys, 2048 to 65536
        (with 2 query heads a key head up to 16896 on 132 SMs), one Gluon kernel adding dQ in fp32 in a
        fixed order
        (`kernels._flash_bwd_fused_hopper`, `supports_ordered`). False
        computes dq inside the dk/dv kernel with fp32 atomic adds
        (FA2-style), which skips recomputing QK^T and dO V^T but sums in a run-dependent order. On an
        H100/H200 at head dim 128 that is one Gluon kernel adding each step's dQ through TMA reduce-adds
        (`kernels._flash_bwd_fused_hopper`: full attention, causal from 4k queries, where it measured
        faster than the deterministic kernels; causal calls and full ones from 4k queries that the
        ordered kernel takes run that one instead, faster there at the GPU's power cap,
        `ordered_is_faster`, and so reproducible); the other calls the Hopper dK/dV kernel takes (other
        head dims, shorter causal calls) keep the deterministic kernels, faster there than the atomic
        variant, so they stay reproducible. With `torch.use_deterministic_algorithms(True)` on when the
        backward runs, False runs the deterministic kernels too (torch's rule where an op has them).
    Returns out (batch, seqlen_q, nheads, headdim) in q's dtype, and with return_lse=True also lse
    (batch, nheads, seqlen_q) float32, natural log. Rows that see no key give out = 0, lse = -inf.
    lse is differentiable: a loss on it (a z-loss, a merge of partial attentions) reaches q and k.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t, 4, "(batch, seqlen, nheads, headdim)")
    dropout_p = _check_common(q, k, v, dropout_p)
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"q, k, v must share the batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"k and v must have the same seqlen, got {k.shape[1]} and {v.shape[1]}")
    return _attend(
        (q, k, v), None, k.shape[1], causal, softmax_scale, dropout_p, window, key_padding_mask, return_lse,
        deterministic,
    )  # fmt: skip


def flash_attention_qkvpacked(
    qkv: torch.Tensor,
    *,
    nheads_kv: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    window: tuple[int | None, int | None] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    deterministic: bool = True,
):
    """flash_attention on the output of a fused QKV projection, with the gradient in one tensor.

    qkv: (batch, seqlen, nheads + 2 * nheads_kv, headdim): the query heads, then the key heads, then
    the value heads, i.e. a `Linear(d, (nheads + 2 * nheads_kv) * headdim)` output viewed as heads
    (GPT-2's c_attn). nheads_kv: None for multi-head attention (qkv.shape[2] = 3 * nheads); set it for
    GQA/MQA. Options, outputs and numerics are flash_attention's on the three views of qkv; the
    difference is the backward, which stores dq, dk, dv straight into one tensor shaped like qkv.
    flash_attention on the views returns three gradients that autograd then concatenates into the
    projection's gradient: one more read and write of it per layer (~2% of a GPT-2 medium step).
    """
    check_rank("qkv", qkv, 4, "(batch, seqlen, nheads + 2 * nheads_kv, headdim)")
    heads = qkv.shape[2]
    if nheads_kv is None:
        if heads % 3:
            raise ValueError(
                f"qkv has {heads} heads, not a multiple of 3: pass nheads_kv for grouped-query attention"
            )
        nheads_kv = heads // 3
    elif not is_int(nheads_kv) or nheads_kv < 1:
        raise ValueError(f"nheads_kv must be a positive int or None, got {nheads_kv!r}")
    elif heads - 2 * nheads_kv < 1:
        raise ValueError(
            f"qkv has {heads} heads, too few for 2 * nheads_kv = {2 * nheads_kv} key/value heads and "
            "at least one query head"
        )
    nheads_kv = int(nheads_kv)
    dropout_p = _check_common(*split_qkv(qkv, nheads_kv), dropout_p)
    return _attend(
        (qkv,), nheads_kv, qkv.shape[1], causal, softmax_scale, dropout_p, window, key_padding_mask,
        return_lse, deterministic,
    )  # fmt: skip


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    window: tuple[int | None, int | None] | None = None,
    return_lse: bool = False,
    deterministic: bool = True,
):
    """Attention over packed sequences, each attended independently (same options as flash_attention).

    q: (total_q, nheads, headdim), k, v: (total_k, nheads_kv, headdim); sequence b owns rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and likewise of k/v. cu_seqlens_*: int32 (batch + 1,),
    starting at 0, non-decreasing, ending at total. max_seqlen_*: the longest sequence (sizes the grid).
    Causal/window alignment is bottom-right per sequence. Dropout numbers entries by packed position:
    entry (head h, query row r, key row c) of the packed tensors is `kernels._common.dropout_keep` at
    row id h * total_q + r and column c, so `kernels.reference.dropout_keep_reference` reproduces the
    mask.
    Returns out (total_q, nheads, headdim) and, with return_lse=True, lse (nheads, total_q) float32
    natural log, differentiable as in flash_attention.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t, 3, "(total, nheads, headdim) for varlen")
    dropout_p = _check_common(q, k, v, dropout_p)
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have the same total length, got {k.shape[0]} and {v.shape[0]}")
    check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    check_device(q, cu_seqlens_q, cu_seqlens_k)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same batch, got {cu_seqlens_q.numel() - 1} "
            f"and {cu_seqlens_k.numel() - 1} sequences"
        )
    for name, cu, given in (
        ("max_seqlen_q", cu_seqlens_q, max_seqlen_q),
        ("max_seqlen_k", cu_seqlens_k, max_seqlen_k),
    ):
        if not is_int(given):
            raise ValueError(f"{name} must be an int (the longest sequence's length), got {given!r}")
        longest = int((cu[1:] - cu[:-1]).max())  # host-device sync
        if int(given) < longest:
            raise ValueError(f"{name} = {given} is shorter than the longest sequence ({longest})")
    win_left, win_right = _window_bounds(causal, window)
    q, k, v = unit_last_stride(q, k, v)
    scale = resolve_softmax_scale(softmax_scale, q.shape[-1])
    return _forward(
        q, k, v, None, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale, win_left,
        win_right, dropout_p, deterministic, return_lse,
    )  # fmt: skip
