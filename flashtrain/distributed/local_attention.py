"""The per-step local attention of the ring (and of Ulysses): one adapter over two backends.

- "reference" (CPU tensors, and any mask the kernels cannot express): `kernels.reference`, which
  materialises the score matrix. Masks that depend on global positions (documents, block layouts,
  dropout) are built here from the positions of the rows and columns involved.
- "triton" (CUDA tensors): the Triton kernels, which never materialise the scores.
  - no position mask: the FlashAttention launchers, with signed window bounds (how the ring
    expresses a shard-against-shard causal/window mask);
  - documents: the varlen launchers, the call's rows and columns cut by document (cu_seqlens built on
    the host from the call's runs of global positions);
  - a block layout: the block-sparse launchers, over the layout's rows and columns of the call;
  each when the call's own mask survives the cut: the call is a shard against the same positions
  (so causal/window per document or per layout is the global one) or is fully visible (no causal,
  no window). Dropout runs in the FlashAttention kernels (given the row ids of the whole sequence),
  with documents too when the batch is 1. Dropout with a block layout or with documents at batch > 1,
  documents with a block layout, positions out of order (the ring and Ulysses never pass them), and
  block layouts whose blocks the call's runs cut, or that are not powers of two >= 16, or with a
  window, go to the reference, in chunks of query rows so its memory stays bounded
  (`REFERENCE_CHUNK_ELEMENTS`) on any length.

Semantics are those of `kernels/reference.py`: q (batch, seqlen_q, nheads, headdim), k/v
(batch, seqlen_k, nheads_kv, headdim), causal/window aligned bottom-right, lse natural log float32
(batch, nheads, seqlen_q), -inf (and out = 0) on rows that see no key.

Dropout keeps entry (b, h, i, j) by the kernels' Philox draw for (seed, (b * H + h) * S + i, j),
with h, i, j global (H heads, S tokens in all): the mask of `kernels.flash_attention` on the whole
sequence, whatever the sharding, on both backends.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels.reference import attention_backward_reference, attention_reference, dropout_keep_mask

log = logging.getLogger(__name__)

BACKENDS = ("auto", "reference", "triton")
_LN2 = math.log(2.0)

_TENSOR_CACHES: dict[int, dict] = {}


def tensor_cache(t: torch.Tensor) -> dict:
    """A dict that lives as long as tensor `t`, for what is derived from it and reused every call (a
    model's block layout is one tensor for the whole run: its host copy and per-call sub-layouts are
    built once instead of in every forward and backward of every layer)."""
    key = id(t)
    if key not in _TENSOR_CACHES:
        _TENSOR_CACHES[key] = {}
        weakref.finalize(t, _TENSOR_CACHES.pop, key, None)  # ids are reused once t is gone
    return _TENSOR_CACHES[key]


@dataclass(frozen=True)
class PositionMask:
    """Masks defined on global positions for one local call.

    q_pos (m,), k_pos (n,): global positions of the call's query rows and key rows.
    doc_ids: (global_seqlen,) document index per global position (packed varlen), or None.
    block_layout: bool (nheads_global or 1, n_row_blocks, n_col_blocks) over global positions, or None.
    head_offset: global index of the call's first head (Ulysses shards heads).
    dropout_p, dropout_seed: dropout on the probabilities, keyed by global coordinates;
    nheads_total, seqlen: the global head count and sequence length that number them (needed with dropout).
    q_runs, k_runs: host-side (global start, length) runs of q_pos / k_pos, in local order; the
    kernel routes need them (without them a masked call runs through the reference).
    doc_starts: host-side cu_seqlens of the global documents (with doc_ids).
    """

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    doc_ids: torch.Tensor | None = None
    block_layout: torch.Tensor | None = None
    block_size: int = 1
    head_offset: int = 0
    dropout_p: float = 0.0
    dropout_seed: int = 0
    nheads_total: int | None = None
    seqlen: int | None = None
    q_runs: tuple[tuple[int, int], ...] | None = None
    k_runs: tuple[tuple[int, int], ...] | None = None
    doc_starts: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.dropout_p > 0.0 and (self.nheads_total is None or self.seqlen is None):
            raise ValueError("PositionMask with dropout needs nheads_total and seqlen (they number the mask)")

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
        return dropout_keep_mask(
            self.dropout_seed, batch, heads, self.q_pos, self.k_pos, self.dropout_p,
            nheads_total=self.nheads_total, seqlen=self.seqlen,
        )  # fmt: skip

    def dropout_rows(self, varlen: bool) -> tuple[int, int, int, int]:
        """The kernels' dropout numbering (drop_sb, drop_sh, drop_row0, drop_col0) for a call whose
        rows and columns are one run each: row ids of the whole sequence, columns by global position.
        varlen: the kernel's batch index is then the document (batch 1 only), so it must add nothing."""
        (q0, _), (k0, _) = self.q_runs[0], self.k_runs[0]
        per_batch = 0 if varlen else self.nheads_total * self.seqlen
        return per_batch, self.seqlen, self.head_offset * self.seqlen + q0, k0


def _resolve(backend: str, q: torch.Tensor) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "triton" if q.is_cuda else "reference"
    return backend


def _route(backend: str, q: torch.Tensor, mask: PositionMask | None, causal: bool, window) -> str:
    """Which implementation serves one call: "reference", "dense", "varlen" or "block_sparse"."""
    if _resolve(backend, q) == "reference":
        return "reference"
    if mask is None or (not mask.has_element_mask and mask.dropout_p == 0.0):
        return "dense"
    why = None
    if mask.q_runs is None or mask.k_runs is None:
        why = "the call's runs of positions are unknown"
    elif mask.dropout_p > 0.0 and (len(mask.q_runs) != 1 or len(mask.k_runs) != 1):
        why = "dropout numbers rows and columns from one run each"
    elif mask.dropout_p > 0.0 and mask.block_layout is not None:
        why = "dropout together with a block layout"
    elif mask.dropout_p > 0.0 and mask.doc_ids is not None and q.shape[0] != 1:
        why = "dropout with documents numbers packed rows globally only for batch 1"
    elif mask.dropout_p > 0.0 and mask.doc_ids is None:
        return "dense"
    elif mask.doc_ids is not None and mask.block_layout is not None:
        why = "documents and a block layout together"
    else:
        # per document or per layout block, the call's causal/window mask must be the global one:
        # true for a shard against the same positions, and for a fully visible call
        if not (mask.q_runs == mask.k_runs or (not causal and window is None)):
            why = "the call's causal/window mask is shifted against the documents or blocks"
        elif mask.doc_ids is not None:
            if mask.doc_starts is None:
                why = "the document starts are unknown"
            elif not (_increasing(mask.q_runs) and _increasing(mask.k_runs)):
                why = "the call's positions are not increasing"
            else:
                return "varlen"
        elif window is not None:
            why = "the block-sparse kernel has no window"
        elif not (_tileable(mask.block_size) and _block_aligned(mask.q_runs, mask.block_size)
                  and _block_aligned(mask.k_runs, mask.block_size)):  # fmt: skip
            why = f"blocks of {mask.block_size} tokens that the kernel cannot tile or the call cuts"
        else:
            return "block_sparse"
    log.debug("ring call runs through the reference attention: %s", why)
    return "reference"


def _increasing(runs) -> bool:
    return all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(runs))


def _tileable(block_size: int) -> bool:
    return block_size >= 16 and block_size & (block_size - 1) == 0


def _block_aligned(runs, block_size: int) -> bool:
    """Every run starts a layout block and all but the last fill whole blocks, so the call's local
    blocks are whole global blocks (the last may end anywhere: the kernel masks the tail)."""
    return all(start % block_size == 0 for start, _ in runs) and all(
        n % block_size == 0 for _, n in runs[:-1]
    )


@dataclass(frozen=True)
class _DocCut:
    """The call cut by document, per batch element: packed cu_seqlens on the device, longest pieces."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def _doc_counts(starts: tuple[int, ...], runs) -> dict[int, int]:
    """Rows per document of a call whose (increasing) runs of positions are `runs`."""
    counts: dict[int, int] = {}
    for start, n in runs:
        pos, end = start, start + n
        doc = bisect.bisect_right(starts, pos) - 1
        while pos < end:
            nxt = min(end, starts[doc + 1])
            counts[doc] = counts.get(doc, 0) + nxt - pos
            pos, doc = nxt, doc + 1
    return counts


def _doc_cut(mask: PositionMask, batch: int, device) -> _DocCut:
    """Host-side: every document the call's queries or keys touch becomes one packed sequence per
    batch element (possibly empty on one side: its rows see no key, its keys get zero gradient).
    The same cut serves the call's backward and every layer's, so it is built (and copied to the
    device) once per (documents, runs, batch)."""
    return _doc_cut_of(mask.doc_starts, mask.q_runs, mask.k_runs, batch, torch.device(device))


@functools.lru_cache(maxsize=1024)
def _doc_cut_of(doc_starts, q_runs, k_runs, batch: int, device: torch.device) -> _DocCut:
    cq, ck = _doc_counts(doc_starts, q_runs), _doc_counts(doc_starts, k_runs)
    docs = sorted(set(cq) | set(ck))
    lens_q, lens_k = [cq.get(d, 0) for d in docs], [ck.get(d, 0) for d in docs]
    cu_q, cu_k = [0], [0]
    for _ in range(batch):
        for a, b in zip(lens_q, lens_k, strict=True):
            cu_q.append(cu_q[-1] + a)
            cu_k.append(cu_k[-1] + b)
    as_tensor = lambda cu: torch.tensor(cu, dtype=torch.int32, device=device)  # noqa: E731
    return _DocCut(as_tensor(cu_q), as_tensor(cu_k), max(lens_q), max(lens_k))


def _block_layout(mask: PositionMask, nheads: int):
    """The global layout's tiles for the call's rows and columns, as a `kernels` BlockLayout; built
    once per (layout, call) and kept, with its compiled tile lists, for the backward and later steps."""
    from kernels.layouts import BlockLayout

    cache = tensor_cache(mask.block_layout)
    key = ("sub_layout", mask.q_runs, mask.k_runs, mask.head_offset, nheads)
    if key not in cache:
        bs = mask.block_size
        lay = mask.block_layout
        if lay.shape[0] > 1:
            lay = lay[mask.head_offset : mask.head_offset + nheads]

        def blocks(runs) -> torch.Tensor:
            ids = [b for start, n in runs for b in range(start // bs, -(-(start + n) // bs))]
            return torch.tensor(ids, dtype=torch.long, device=lay.device)

        cache[key] = BlockLayout(
            lay.index_select(1, blocks(mask.q_runs)).index_select(2, blocks(mask.k_runs)), bs
        )
    return cache[key]


# score elements (batch * heads * rows * keys) the reference materialises at once: 16M, about 1 GiB
# with the float32 scores, probabilities, masks and the dropout Philox's int64 temporaries, so a long
# call that no kernel serves runs in row chunks instead of running out of memory
REFERENCE_CHUNK_ELEMENTS = 1 << 24


def narrow_rows(t: torch.Tensor, rows: tuple[int, int], dim: int = 1) -> torch.Tensor:
    """The view of rows [rows[0], rows[1]) of t along dim."""
    return t.narrow(dim, rows[0], rows[1] - rows[0])


def _row_chunks(q: torch.Tensor, seqlen_k: int, causal: bool, window, mask: PositionMask | None):
    """Yield (rows, reference kwargs) for chunks of the call's query rows, each with its own masks.

    Rows are independent given the keys, so chunking is exact. A chunk of m' rows ending at row r1 of
    m is bottom-right aligned d = r1 - m keys earlier than its rows really are, so its window bounds
    shift by d (causal becomes the right bound).
    """
    batch, m, nheads = q.shape[0], q.shape[1], q.shape[2]
    step = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, batch * nheads * seqlen_k))
    left, right = _window_bounds(causal, window)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        d = r1 - m
        kw = dict(
            causal=False,
            window=None if left is None and right is None
            else (None if left is None else left - d, None if right is None else right + d),
        )  # fmt: skip
        if mask is not None:
            part = replace(mask, q_pos=mask.q_pos[r0:r1], q_runs=None)
            drop = part.dropout_mask(batch, nheads)
            kw.update(attn_mask=part.element_mask(nheads), dropout_mask=drop,
                      dropout_p=mask.dropout_p if drop is not None else 0.0)  # fmt: skip
        yield (r0, r1), kw


def _packed(x: torch.Tensor) -> torch.Tensor:
    """(batch, seqlen, heads, dim) -> (batch * seqlen, heads, dim), the varlen kernels' packing."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _kernel_kwargs(
    causal: bool, softmax_scale: float, window, mask: PositionMask | None, varlen: bool
) -> dict:
    """The FlashAttention launchers' options for one call."""
    win_left, win_right = _window_bounds(causal, window)
    kw = dict(sm_scale=softmax_scale, win_left=win_left, win_right=win_right, key_padding_mask=None,
              dropout_p=0.0, seed=0)  # fmt: skip
    if mask is not None and mask.dropout_p > 0.0:
        kw.update(dropout_p=mask.dropout_p, seed=mask.dropout_seed, dropout_rows=mask.dropout_rows(varlen))
    return kw


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
    route = _route(backend, q, mask, causal, window)
    if route == "block_sparse":
        from kernels.block_sparse import _block_sparse_forward

        layout = _block_layout(mask, q.shape[2])
        return _block_sparse_forward(q, k, v, layout, causal, softmax_scale, 0.0, 0)  # lse natural log
    if route in ("dense", "varlen"):
        from kernels._flash_fwd import flash_attn_forward

        kw = _kernel_kwargs(causal, softmax_scale, window, mask, varlen=route == "varlen")
        if route == "dense":
            out, lse2 = flash_attn_forward(q, k, v, **kw)
            return out, lse2 * _LN2  # the kernel keeps lse in base 2
        batch, m, nheads, _ = q.shape
        cut = _doc_cut(mask, batch, q.device)
        out, lse2 = flash_attn_forward(
            _packed(q), _packed(k), _packed(v), cu_seqlens_q=cut.cu_q, cu_seqlens_k=cut.cu_k,
            max_seqlen_q=cut.max_q, max_seqlen_k=cut.max_k, **kw,
        )  # fmt: skip
        return out.view(q.shape), (lse2 * _LN2).view(nheads, batch, m).transpose(0, 1)
    outs, lses = [], []
    for rows, kw in _row_chunks(q, k.shape[1], causal, window, mask):
        out, lse = attention_reference(
            narrow_rows(q, rows), k, v, softmax_scale=softmax_scale, return_lse=True, **kw
        )
        outs.append(out)
        lses.append(lse)
    # float32 lse, or float64 for float64 inputs (the tests' ground truth)
    return (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs, 1), torch.cat(lses, 2))


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
    route = _route(backend, q, mask, causal, window)
    if route == "block_sparse":
        from kernels.block_sparse import _block_sparse_backward

        layout = _block_layout(mask, q.shape[2])
        return _block_sparse_backward(
            dout, q, k, v, out, lse.contiguous(), layout, causal, softmax_scale, 0.0, 0
        )
    if route in ("dense", "varlen"):
        from kernels._flash_bwd import flash_attn_backward

        kw = _kernel_kwargs(causal, softmax_scale, window, mask, varlen=route == "varlen")
        if route == "dense":
            return flash_attn_backward(dout, q, k, v, out, (lse / _LN2).contiguous(), **kw)
        batch, m, nheads, _ = q.shape
        cut = _doc_cut(mask, batch, q.device)
        lse2 = (lse / _LN2).transpose(0, 1).reshape(nheads, batch * m)  # (H, packed rows), contiguous
        dq, dk, dv = flash_attn_backward(
            _packed(dout), _packed(q), _packed(k), _packed(v), _packed(out), lse2, cu_seqlens_q=cut.cu_q,
            cu_seqlens_k=cut.cu_k, max_seqlen_q=cut.max_q, max_seqlen_k=cut.max_k, **kw,
        )  # fmt: skip
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
    dqs, dk, dv = [], None, None
    for rows, kw in _row_chunks(q, k.shape[1], causal, window, mask):
        dq_c, dk_c, dv_c = attention_backward_reference(
            narrow_rows(dout, rows), narrow_rows(q, rows), k, v, narrow_rows(out, rows), narrow_rows(lse, rows, 2),
            softmax_scale=softmax_scale, **kw,
        )  # fmt: skip
        dqs.append(dq_c)
        dk, dv = (dk_c, dv_c) if dk is None else (dk.add_(dk_c), dv.add_(dv_c))
    return (dqs[0] if len(dqs) == 1 else torch.cat(dqs, 1)), dk, dv


def merge_partial_(
    out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """In place: (out, lse) <- merge of two partial attentions over disjoint keys.

    out (B, m, H, D) and lse (B, H, m) are fp32 views of the accumulators. The weights
    exp(lse_part - lse_new) are <= 1, so nothing overflows, and a part with lse = -inf gets weight
    exactly 0 (with the other weight exactly 1), so a part that saw no key changes nothing.
    """
    new = torch.logaddexp(lse, part_lse.to(lse.dtype))
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))  # rows no part has reached
    w_old = torch.exp(lse - safe).transpose(1, 2)[..., None]  # (B, m, H, 1)
    w_new = torch.exp(part_lse.to(lse.dtype) - safe).transpose(1, 2)[..., None]
    out.mul_(w_old).add_(part_out.to(out.dtype) * w_new)
    lse.copy_(new)


def _dense_kernel_args(backend: str, q, mask, causal: bool, softmax_scale: float, window) -> dict | None:
    """The FlashAttention launchers' options when the call takes the dense Triton route, else None."""
    if _route(backend, q, mask, causal, window) != "dense":
        return None
    return _kernel_kwargs(causal, softmax_scale, window, mask, varlen=False)


def local_forward_merge(
    out_acc: torch.Tensor, lse_acc: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    causal: bool, softmax_scale: float, window, mask: PositionMask | None = None, backend: str = "auto",
) -> None:  # fmt: skip
    """local_forward of one call merged in place into the fp32 running (out_acc, lse_acc) of its query
    rows. The dense Triton route merges inside the kernel's epilogue (the step's output never reaches
    memory); the other routes merge the returned (out, lse) in torch."""
    kw = dict(causal=causal, softmax_scale=softmax_scale, window=window, mask=mask, backend=backend)
    args = _dense_kernel_args(backend, q, mask, causal, softmax_scale, window)
    if args is None or out_acc.dtype != torch.float32:
        merge_partial_(out_acc, lse_acc, *local_forward(q, k, v, **kw))
        return
    from kernels._flash_fwd import flash_attn_forward

    flash_attn_forward(q, k, v, merge_into=(out_acc, lse_acc), **args)


class DenseBackwardPrep:
    """The dense kernels' per-backward inputs over all of a shard's query rows: the base-2 lse and
    delta = rowsum(dO * O), computed on first use and then sliced for each call's rows, so a ring
    backward runs the preprocess once instead of once per step."""

    def __init__(self, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor):
        self._args, self._full = (out, dout, lse), None

    def rows(self, q_rows: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self._full is None:
            from kernels._flash_bwd import backward_delta

            out, dout, lse = self._args
            lse2 = lse / _LN2  # the kernels' base-2 lse
            self._full = lse2, backward_delta(out, dout, lse2)
        return tuple(narrow_rows(t, q_rows, 2) for t in self._full)


def local_backward_accumulate(
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor], dout, q, k, v, out, lse, *,
    causal: bool, softmax_scale: float, window, mask: PositionMask | None = None, backend: str = "auto",
    only: str | None = None, prep: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
    add_dkdv: bool = True,
) -> Callable[[], None] | None:  # fmt: skip
    """local_backward of one call added in place to fp32 gradient buffers (dq, dk, dv) shaped like
    q, k, v. The dense Triton route adds inside the kernels' epilogues; the others add in torch.

    only="dkdv" then only="dq" (two calls) add the same gradients as one call without `only`, split
    so the ring can send dK/dV on before the dq work: the dense Triton route runs one kernel in each;
    the routes that compute all three gradients at once add them all in the "dkdv" call. The "dkdv"
    call returns its dq half as a function, which shares its backward preprocess (delta).
    With only="dq", grads' dk and dv may be None (whichever route adds them runs later).
    prep: returns this call's rows of (base-2 lse, delta) for the dense route (a
    `DenseBackwardPrep.rows`), instead of computing them here.
    add_dkdv=False: the call's dK/dV overwrite grads' dk and dv (which the call must cover, every key
    row) instead of adding to them, so a fresh buffer needs no zero fill; dq is added either way."""
    if only not in (None, "dkdv", "dq"):
        raise ValueError(f"only must be None, 'dkdv' or 'dq', got {only!r}")
    kw = dict(causal=causal, softmax_scale=softmax_scale, window=window, mask=mask, backend=backend)
    args = _dense_kernel_args(backend, q, mask, causal, softmax_scale, window)
    if args is None or any(g is not None and g.dtype != torch.float32 for g in grads):
        if only != "dq":
            dq, dk, dv = local_backward(dout, q, k, v, out, lse, **kw)
            grads[0].add_(dq)
            for acc, g in ((grads[1], dk), (grads[2], dv)):
                acc.add_(g) if add_dkdv else acc.copy_(g)
        return (lambda: None) if only == "dkdv" else None
    from kernels._flash_bwd import flash_attn_backward

    lse2, delta = prep() if prep is not None else DenseBackwardPrep(out, dout, lse).rows((0, lse.shape[2]))
    flash_attn_backward(
        dout, q, k, v, out, lse2, grads_into=grads, only=only, delta=delta, add_dkdv=add_dkdv, **args
    )
    if only != "dkdv":
        return None
    return lambda: flash_attn_backward(
        dout, q, k, v, out, lse2, grads_into=grads, only="dq", delta=delta, **args
    )
