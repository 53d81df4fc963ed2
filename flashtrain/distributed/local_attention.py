"""The per-step local attention of the ring (and of Ulysses): one adapter over two backends.

- "reference" (CPU tensors, and any mask the kernels cannot express): `kernels.reference`, which
  materialises the score matrix. Masks that depend on global positions (documents, block layouts,
  dropout) are built here from the positions of the rows and columns involved.
- "triton" (CUDA tensors): the FlashAttention launchers of `kernels.flash_attention`, called with
  signed window bounds, which is how the ring expresses a shard-against-shard causal/window mask.

Semantics are those of `kernels/reference.py`: q (batch, seqlen_q, nheads, headdim), k/v
(batch, seqlen_k, nheads_kv, headdim), causal/window aligned bottom-right, lse natural log float32
(batch, nheads, seqlen_q), -inf (and out = 0) on rows that see no key.

Dropout keeps an entry according to a counter-based hash of (seed, batch, global head, global row,
global column), so the mask does not depend on how the sequence is sharded.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from kernels.reference import attention_backward_reference, attention_reference

log = logging.getLogger(__name__)

BACKENDS = ("auto", "reference", "triton")
_LN2 = math.log(2.0)
_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class PositionMask:
    """Masks defined on global positions for one local call.

    q_pos (m,), k_pos (n,): global positions of the call's query rows and key rows.
    doc_ids: (global_seqlen,) document index per global position (packed varlen), or None.
    block_layout: bool (nheads_global or 1, n_row_blocks, n_col_blocks) over global positions, or None.
    head_offset: global index of the call's first head (Ulysses shards heads).
    dropout_p, dropout_seed: dropout on the probabilities, keyed by global coordinates.
    """

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    doc_ids: torch.Tensor | None = None
    block_layout: torch.Tensor | None = None
    block_size: int = 1
    head_offset: int = 0
    dropout_p: float = 0.0
    dropout_seed: int = 0

    @property
    def has_element_mask(self) -> bool:
        return self.doc_ids is not None or self.block_layout is not None

    def element_mask(self, nheads: int) -> torch.Tensor | None:
        """Bool keep-mask (1, nheads or 1, m, n), or None when documents and blocks are absent."""
        keep = None
        if self.doc_ids is not None:
            docs = self.doc_ids.to(self.q_pos.device)
            keep = (docs[self.q_pos][:, None] == docs[self.k_pos][None, :])[None, None]  # (1, 1, m, n)
        if self.block_layout is not None:
            lay = self.block_layout.to(self.q_pos.device)
            if lay.shape[0] > 1:
                lay = lay[self.head_offset : self.head_offset + nheads]
            rows = lay.index_select(1, self.q_pos // self.block_size)  # (h, m, ncb)
            blocks = rows.index_select(2, self.k_pos // self.block_size)[None]  # (1, h, m, n)
            keep = blocks if keep is None else keep & blocks
        return keep

    def dropout_mask(self, batch: int, nheads: int) -> torch.Tensor | None:
        if self.dropout_p == 0.0:
            return None
        heads = torch.arange(self.head_offset, self.head_offset + nheads, device=self.q_pos.device)
        return dropout_keep_mask(self.dropout_seed, batch, heads, self.q_pos, self.k_pos, self.dropout_p)


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding 32-bit values (products stay < 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def dropout_keep_mask(
    seed: int, batch: int, heads: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """Bool keep-mask (batch, len(heads), len(q_pos), len(k_pos)) from a hash of global coordinates.

    Counter-based: entry (b, h, i, j) depends only on (seed, b, h, i, j), never on the shard that
    computes it, so sequence-parallel runs drop exactly what the single-process run drops.
    """
    dev = q_pos.device
    b = torch.arange(batch, device=dev, dtype=torch.int64)[:, None, None, None]
    h = heads.to(dev, torch.int64)[None, :, None, None]
    x = _fmix32((int(seed) & _M32) ^ ((b * 0x27D4EB2F + h * 0x165667B1 + 0x9E3779B9) & _M32))
    x = _fmix32(x ^ ((q_pos.to(torch.int64)[None, None, :, None] * 0x61C88647) & _M32))
    x = _fmix32(x ^ ((k_pos.to(torch.int64)[None, None, None, :] * 0x7FEB352D) & _M32))  # (B, H, m, n)
    return (x.to(torch.float64) * (1.0 / 2**32)) >= dropout_p


def _resolve(backend: str, q: torch.Tensor, mask: PositionMask | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "triton" if q.is_cuda else "reference"
    if backend == "triton" and mask is not None and (mask.has_element_mask or mask.dropout_p > 0):
        # WIRING POINT (lead): documents map onto flash_attention_varlen's cu_seqlens, block layouts
        # onto kernels.block_sparse_attention, dropout onto a kernel seed with global row/column
        # offsets. Until then these masks run through the materialised reference: exact, but
        # O(seqlen_q * seqlen_k) memory per step.
        log.debug("ring step with a position mask runs through the reference attention")
        return "reference"
    return backend


def _window_bounds(causal: bool, window) -> tuple[int | None, int | None]:
    """Kernel (win_left, win_right); signed, because a past shard's window starts after its first key."""
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def local_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    window: tuple[int | None, int | None] | None,
    mask: PositionMask | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse (batch, nheads, seqlen_q) in max(q.dtype, float32)) of one local call.

    window bounds may be negative (a band that starts right of the diagonal); None is unbounded.
    """
    if _resolve(backend, q, mask) == "triton":
        from kernels._flash_fwd import flash_attn_forward

        win_left, win_right = _window_bounds(causal, window)
        out, lse2 = flash_attn_forward(
            q, k, v, sm_scale=softmax_scale, win_left=win_left, win_right=win_right,
            key_padding_mask=None, dropout_p=0.0, seed=0,
        )  # fmt: skip
        return out, lse2 * _LN2  # the kernel keeps lse in base 2
    batch, nheads = q.shape[0], q.shape[2]
    attn_mask = mask.element_mask(nheads) if mask is not None else None
    drop = mask.dropout_mask(batch, nheads) if mask is not None else None
    out, lse = attention_reference(
        q, k, v, causal=causal, softmax_scale=softmax_scale, window=window, attn_mask=attn_mask,
        dropout_p=mask.dropout_p if drop is not None else 0.0, dropout_mask=drop, return_lse=True,
    )  # fmt: skip
    return out, lse  # float32, or float64 for float64 inputs (the tests' ground truth)


def local_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    window: tuple[int | None, int | None] | None,
    mask: PositionMask | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one local call, recomputed from the GLOBAL out and lse of the rows of q, so
    the calls' partial gradients add up to the full ones."""
    if _resolve(backend, q, mask) == "triton":
        from kernels._flash_bwd import flash_attn_backward

        win_left, win_right = _window_bounds(causal, window)
        return flash_attn_backward(
            dout, q, k, v, out, (lse / _LN2).contiguous(), sm_scale=softmax_scale, win_left=win_left,
            win_right=win_right, key_padding_mask=None, dropout_p=0.0, seed=0,
        )  # fmt: skip
    batch, nheads = q.shape[0], q.shape[2]
    attn_mask = mask.element_mask(nheads) if mask is not None else None
    drop = mask.dropout_mask(batch, nheads) if mask is not None else None
    return attention_backward_reference(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, window=window,
        attn_mask=attn_mask, dropout_mask=drop, dropout_p=mask.dropout_p if drop is not None else 0.0,
    )  # fmt: skip
