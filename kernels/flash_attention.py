"""FlashAttention in Triton: forward and backward for dense and packed (varlen) sequences.

Three layers, as in flash-attention: launchers (`_flash_fwd.flash_attn_forward`,
`_flash_bwd.flash_attn_backward`) -> autograd (the custom ops `flashtrain::flash_attn_fwd/bwd`,
which torch.compile keeps in one graph) ->
`flash_attention` / `flash_attention_varlen` (public, which check their inputs). The kernels live in `_flash_fwd.py` and
`_flash_bwd.py`; the pure-torch oracle in `reference.py`.
"""

from __future__ import annotations

import math

import torch

from ._common import (
    check_cu_seqlens,
    check_device,
    check_dropout,
    check_dtype,
    check_heads,
    check_key_padding_mask,
    check_window,
    draw_seed,
    lse_to_natural,
    unit_last_stride,
)
from ._flash_bwd import flash_attn_backward
from ._flash_fwd import flash_attn_forward
from .reference import dropout_mask

__all__ = ["flash_attention", "flash_attention_varlen", "dropout_mask"]


# Forward and backward are a pair of torch custom ops, so torch.compile keeps a model's graph whole
# around them (an autograd.Function with Triton launches inside broke the graph: two compiled pieces
# per transformer block, each with its own guards and runtime wrappers). The ops are opaque to the
# compiler. Dense calls pass cu_seqlens None and max_seqlen 0; varlen calls pass all four.
@torch.library.custom_op("flashtrain::flash_attn_fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    sm_scale: float,
    win_left: int | None,
    win_right: int | None,
    dropout_p: float,
    atomic_dq: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out, base-2 lse, and the dropout seed (a CPU int64 scalar the backward regenerates the mask
    from; drawn here from torch's CPU generator, whose state activation checkpointing restores for the
    recompute)."""
    seed = draw_seed() if dropout_p > 0 else 0
    out, lse2 = flash_attn_forward(
        q, k, v, sm_scale=sm_scale, win_left=win_left, win_right=win_right,
        key_padding_mask=key_padding_mask, dropout_p=dropout_p, seed=seed, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
    )  # fmt: skip
    return out, lse2, torch.tensor(seed, dtype=torch.int64)


@_fwd_op.register_fake
def _(q, k, v, key_padding_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *_):
    if cu_seqlens_q is None:  # dense (B, H, Sq)
        lse2 = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:  # varlen (H, Tq)
        lse2 = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return torch.empty_like(q), lse2, torch.empty((), dtype=torch.int64, device="cpu")


@torch.library.custom_op("flashtrain::flash_attn_bwd", mutates_args=())
def _bwd_op(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse2: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    sm_scale: float,
    win_left: int | None,
    win_right: int | None,
    dropout_p: float,
    seed: torch.Tensor,
    atomic_dq: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_attn_backward(
        dout, q, k, v, out, lse2, sm_scale=sm_scale, win_left=win_left, win_right=win_right,
        key_padding_mask=key_padding_mask, dropout_p=dropout_p, seed=int(seed), atomic_dq=atomic_dq,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
    )  # fmt: skip


@_bwd_op.register_fake
def _(dout, q, k, v, *_):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fwd_op_setup_context(ctx, inputs, output):
    q, k, v, *options = inputs  # key_padding_mask .. atomic_dq, in _fwd_op's order
    out, lse2, seed = output
    ctx.save_for_backward(q, k, v, out, lse2, seed)
    ctx.options = options
    ctx.mark_non_differentiable(lse2, seed)  # lse is for inspection and merging; it carries no gradient


def _fwd_op_backward(ctx, dout, _dlse2, _dseed):
    q, k, v, out, lse2, seed = ctx.saved_tensors
    *options, atomic_dq = ctx.options
    dq, dk, dv = _bwd_op(dout, q, k, v, out, lse2, *options, seed, atomic_dq)
    return dq, dk, dv, *([None] * len(ctx.options))


_fwd_op.register_autograd(_fwd_op_backward, setup_context=_fwd_op_setup_context)


def _window_bounds(causal: bool, window) -> tuple[int | None, int | None]:
    """causal is a window with right = 0 (bottom-right aligned), so the kernels only know windows."""
    left, right = check_window(window)
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def _check_common(q, k, v, dropout_p):
    check_device(q, k, v)
    check_dtype(q, k, v)
    check_heads(q.shape[-2], k.shape[-2], q.shape[-1], k.shape[-1], v.shape[-1])
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[-2]} and {v.shape[-2]}")
    return check_dropout(dropout_p)


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
        generator, so torch.manual_seed makes it reproducible. Entry (b, h, i, j) is kept when 16-bit half
        j % 2 of word (j % 8) // 2 of Triton's Philox keyed by the seed, at counter
        (j // 8, (b * nheads + h) * seqlen_q + i), is >= ceil(dropout_p * 65536) (one Philox call serves
        eight keys; dropout_p acts at 2^-16 resolution); the backward regenerates it, and
        `kernels.reference.dropout_mask` draws the same mask in torch.
    deterministic: True (default) computes dq in its own kernel, without atomics, so gradients are
        bitwise reproducible; False computes dq inside the dk/dv kernel with fp32 atomic adds
        (FA2-style), which skips recomputing QK^T and dO V^T but sums in a run-dependent order.
    Returns out (batch, seqlen_q, nheads, headdim) in q's dtype, and with return_lse=True also lse
    (batch, nheads, seqlen_q) float32, natural log. Rows that see no key give out = 0, lse = -inf.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, seqlen, nheads, headdim), got shape {tuple(t.shape)}")
    dropout_p = _check_common(q, k, v, dropout_p)
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"q, k, v must share the batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"k and v must have the same seqlen, got {k.shape[1]} and {v.shape[1]}")
    check_key_padding_mask(key_padding_mask, q.shape[0], k.shape[1], q.device)
    win_left, win_right = _window_bounds(causal, window)
    q, k, v = unit_last_stride(q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse2, _ = _fwd_op(
        q, k, v, key_padding_mask, None, None, 0, 0, scale, win_left, win_right, dropout_p, not deterministic
    )  # fmt: skip
    lse = lse_to_natural(lse2)
    return (out, lse) if return_lse else out


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
    head h, query row r and key row c (of the packed tensors) take half c % 2 of word (c % 8) // 2 of
    Philox at counter (c // 8, h * total_q + r), so `kernels.reference.dropout_keep_reference`
    reproduces the mask.
    Returns out (total_q, nheads, headdim) and, with return_lse=True, lse (nheads, total_q) float32
    natural log.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(
                f"{name} must be (total, nheads, headdim) for varlen, got shape {tuple(t.shape)}"
            )
    dropout_p = _check_common(q, k, v, dropout_p)
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have the same total length, got {k.shape[0]} and {v.shape[0]}")
    check_device(q, cu_seqlens_q, cu_seqlens_k)
    check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same batch, got {cu_seqlens_q.numel() - 1} "
            f"and {cu_seqlens_k.numel() - 1} sequences"
        )
    for name, cu, given in (
        ("max_seqlen_q", cu_seqlens_q, max_seqlen_q),
        ("max_seqlen_k", cu_seqlens_k, max_seqlen_k),
    ):
        longest = int((cu[1:] - cu[:-1]).max())  # host-device sync
        if int(given) < longest:
            raise ValueError(f"{name} = {given} is shorter than the longest sequence ({longest})")
    win_left, win_right = _window_bounds(causal, window)
    q, k, v = unit_last_stride(q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse2, _ = _fwd_op(
        q, k, v, None, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        scale, win_left, win_right, dropout_p, not deterministic,
    )  # fmt: skip
    lse = lse_to_natural(lse2)
    return (out, lse) if return_lse else out
