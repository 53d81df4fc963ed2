"""Pure-torch references for every op in `kernels/` (attention, and the fused loss at the end).

These are the numerical oracles the tests compare the Triton kernels against. They materialise the
full (seqlen_q, seqlen_k) score matrix, so they are only for small shapes, and they compute in the
dtype they are given: call them on float64 inputs for the "truth" and on fp16/bf16 inputs for
"PyTorch's own low-precision error", which sets the tolerance of each kernel test.

Conventions shared with the kernels (see `kernels.flash_attention` for the public docs):
- q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), GQA when
  nheads_kv divides nheads (query head h reads key/value head h // (nheads // nheads_kv)).
- causal and window are aligned bottom-right: query i sits at key position i + seqlen_k - seqlen_q.
- window=(left, right): query i sees keys in [i' - left, i' + right] with i' its aligned position;
  None on a side means unbounded on that side.
- A query row that sees no key gives out = 0 and lse = -inf (never NaN), and passes no gradient.
- lse is the natural log of the softmax denominator, float32, shape (batch, nheads, seqlen_q); it is
  differentiable (d lse_i / d score_ij = p_ij), as the kernels' lse is.
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF
# rounds of the dropout's Philox4x32 (why seven: kernels/_common.py, PHILOX_ROUNDS)
PHILOX_ROUNDS = 7


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32): split c in 16-bit halves so no product passes 2^49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _umulhi32(c: int, x: torch.Tensor) -> torch.Tensor:
    """floor(c * x / 2^32) for int64 x in [0, 2^32), without an int64 product past 2^49."""
    return (x * (c >> 16) + ((x * (c & 0xFFFF)) >> 16)) >> 16


def _philox4x32(
    seed: int, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, rounds: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four output words of Philox4x32 with `rounds` rounds as Triton's `tl.philox` computes them
    (int64 holding uint32)."""
    k0, k1 = int(seed) & _M32, (int(seed) >> 32) & _M32
    a, b = 0xD2511F53, 0xCD9E8D57  # Philox's round multipliers
    for _ in range(rounds):
        c0, c1, c2, c3 = (
            _umulhi32(b, c2) ^ c1 ^ k0,
            _mul32(c2, b),
            _umulhi32(a, c0) ^ c3 ^ k1,
            _mul32(c0, a),
        )
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32  # the key schedule
    return c0, c1, c2, c3


def dropout_keep_reference(
    seed: int, row_ids: torch.Tensor, col_ids: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """The kernels' dropout keep-mask (`kernels._common.dropout_keep`) in torch, bit for bit.

    row_ids, col_ids: integer tensors that broadcast together (row ids as the kernels number them:
    (batch * nheads + head) * seqlen_q + query for dense attention). Column c = 32s + 8t + 2k + h
    (t, k in 0..3, h in 0..1) takes 16-bit half h (low half first) of word t of Triton's Philox4x32-7
    keyed by the seed with counter (4s + k, low and high words of the row id, 0), and the entry is
    kept when that half is >= ceil(dropout_p * 65536), computed in float32 as the kernels do.
    """
    rows = row_ids.to(torch.int64)
    cols = col_ids.to(torch.int64)
    row_lo, row_hi, cols = torch.broadcast_tensors(rows & _M32, (rows >> 32) & _M32, cols)
    calls = (((cols >> 5) << 2) + ((cols >> 1) & 3)) & _M32
    words = _philox4x32(seed, calls, row_lo, row_hi, torch.zeros_like(cols), rounds=PHILOX_ROUNDS)
    bits = torch.stack(words, dim=-1).gather(-1, ((cols >> 3) & 3).unsqueeze(-1)).squeeze(-1)
    halves = torch.where((cols & 1) == 1, bits >> 16, bits & 0xFFFF)
    p32 = torch.tensor(dropout_p, dtype=torch.float32, device=bits.device)
    threshold = torch.ceil(p32 * 65536.0).to(torch.int64)
    return halves >= threshold


def dropout_keep_mask(
    seed: int, batch: int, heads: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, dropout_p: float,
    *, nheads_total: int, seqlen: int,
) -> torch.Tensor:  # fmt: skip
    """Bool keep-mask (batch, len(heads), len(q_pos), len(k_pos)) at global coordinates.

    Entry (b, h, i, j) is the kernels' draw for row id (b * nheads_total + h) * seqlen + i and column
    j, so it depends only on (seed, b, h, i, j), never on the shard that computes it, and equals the
    mask `kernels.flash_attention` draws on the whole sequence with the same seed.
    """
    dev = q_pos.device
    b = torch.arange(batch, device=dev, dtype=torch.int64)[:, None, None, None]
    h = heads.to(dev, torch.int64)[None, :, None, None]
    rows = (b * nheads_total + h) * seqlen + q_pos.to(torch.int64)[None, None, :, None]
    return dropout_keep_reference(seed, rows, k_pos.to(torch.int64), dropout_p)


def dropout_mask(
    seed: int, batch: int, nheads: int, seqlen_q: int, seqlen_k: int, dropout_p: float, device=None
):
    """The bool keep-mask (batch, nheads, seqlen_q, seqlen_k) that the dense kernels draw for `seed`;
    pass it to the references as dropout_mask."""
    pos = lambda n: torch.arange(n, device=device)  # noqa: E731
    return dropout_keep_mask(
        seed,
        batch,
        pos(nheads),
        pos(seqlen_q),
        pos(seqlen_k),
        dropout_p,
        nheads_total=nheads,
        seqlen=seqlen_q,
    )


def position_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
) -> torch.Tensor:
    """Boolean keep-mask (len(q_pos), len(k_pos)) of causal / sliding-window attention between queries
    and keys at the given (aligned) positions; the shards of sequence parallelism use global ones."""
    rows, cols = q_pos[:, None], k_pos[None, :]
    keep = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool, device=q_pos.device)
    if causal:
        keep &= cols <= rows
    if window is not None:
        left, right = window
        if left is not None:
            keep &= cols >= rows - left
        if right is not None:
            keep &= cols <= rows + right
    return keep


def attention_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean keep-mask (seqlen_q, seqlen_k) for causal and/or sliding-window attention."""
    q_pos = torch.arange(seqlen_q, device=device) + (seqlen_k - seqlen_q)  # bottom-right aligned
    return position_mask(q_pos, torch.arange(seqlen_k, device=device), causal=causal, window=window)


def _scores_and_mask(q, k, v, causal, softmax_scale, window, key_padding_mask, attn_mask):
    """Scaled scores (B, H, Sq, Sk), the combined keep-mask, and V with GQA heads repeated (B, H, Sk, D)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    group = nheads // nheads_kv
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, Sk, D)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, Sk, D)
    scores = torch.matmul(q.transpose(1, 2), kh.transpose(-1, -2)) * scale  # (B, H, Sq, Sk)
    keep = attention_mask(seqlen_q, seqlen_k, causal=causal, window=window, device=q.device)
    keep = keep.expand(batch, nheads, seqlen_q, seqlen_k)
    if key_padding_mask is not None:
        keep = keep & key_padding_mask[:, None, None, :]
    if attn_mask is not None:
        keep = keep & attn_mask
    return scores, keep, vh


def _finite_row_max(scores: torch.Tensor) -> torch.Tensor:
    """Each row's max (keepdim), 0 for a row of only -inf, so that scores - max is never -inf + inf."""
    row_max = scores.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))


def _masked_logsumexp(scores: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, where a row of only -inf gives -inf and passes no gradient.

    torch.logsumexp's backward is exp(x - lse), which is NaN on such a row even where its incoming
    gradient is 0; the kernels give those rows no gradient (they saw no key), and so does this."""
    row_max = _finite_row_max(scores.detach())
    denom = torch.exp(scores - row_max).sum(dim=-1)
    seen = denom > 0
    lse = torch.log(torch.where(seen, denom, torch.ones_like(denom))) + row_max.squeeze(-1)
    return torch.where(seen, lse, torch.full_like(lse, float("-inf")))


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    return_lse: bool = False,
):
    """Materialised softmax attention in the dtype of the inputs.

    attn_mask: optional bool keep-mask broadcastable to (batch, nheads, seqlen_q, seqlen_k), combined
    with causal/window/key_padding_mask. dropout_mask: bool keep-mask of that shape (the kernels
    regenerate theirs from a seed; tests pass the kernel's mask here); kept entries are scaled by
    1 / (1 - dropout_p). Dropout does not change lse, which describes the softmax denominator.
    """
    scores, keep, vh = _scores_and_mask(q, k, v, causal, softmax_scale, window, key_padding_mask, attn_mask)
    scores = scores.masked_fill(~keep, float("-inf"))

    row_max = _finite_row_max(scores)
    probs = torch.exp(scores - row_max)
    denom = probs.sum(dim=-1, keepdim=True)
    probs = probs / torch.where(denom > 0, denom, torch.ones_like(denom))  # empty rows stay 0
    if dropout_mask is not None:
        probs = probs * dropout_mask / (1.0 - dropout_p)
    out = torch.matmul(probs, vh).transpose(1, 2)  # (B, Sq, H, D)
    if return_lse:
        # float32 at least, float64 when the inputs are: the float64 run is the tests' ground truth
        lse = _masked_logsumexp(scores.to(torch.promote_types(scores.dtype, torch.float32)))  # (B, H, Sq)
        return out, lse
    return out


def split_qkv(qkv: torch.Tensor, nheads_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views q, k, v of a packed (batch, seqlen, nheads + 2 * nheads_kv, headdim) tensor: the query
    heads, then the key heads, then the value heads (a fused QKV projection's output viewed as heads)."""
    nheads = qkv.shape[2] - 2 * nheads_kv
    return qkv.split([nheads, nheads_kv, nheads_kv], dim=2)


def attention_qkvpacked_reference(qkv: torch.Tensor, *, nheads_kv: int | None = None, **options):
    """`attention_reference` on a packed qkv (`split_qkv`; nheads_kv None: a third of the heads each).
    Autograd gives its gradient in qkv's shape, as `flash_attention_qkvpacked` does."""
    return attention_reference(
        *split_qkv(qkv, qkv.shape[2] // 3 if nheads_kv is None else nheads_kv), **options
    )


def attention_backward_reference(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention's backward from a given (out, lse), in the dtype of the inputs.

    `out` and `lse` may be the *global* output and log-sum-exp of a larger attention of which
    (k, v) is one part (ring attention recomputes each step this way): probabilities are
    exp(scores - lse) and delta = rowsum(dout * out), so the partial gradients add up to the full ones.
    With dropout (the forward's keep-mask and p), Z = mask / (1 - p): dV = (P·Z)ᵀ dO and
    dP = (dO Vᵀ)·Z, while delta stays rowsum(dO ∘ O) since O already carries the dropout.
    Returns (dq, dk, dv) with the shapes of q, k, v (GQA groups summed into their K/V head).
    """
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    group = nheads // nheads_kv
    qh, doh, oh = (t.transpose(1, 2) for t in (q, dout, out))  # (B, H, Sq, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, H, Sk, D)
    scores, keep, vh = _scores_and_mask(q, k, v, causal, softmax_scale, window, key_padding_mask, attn_mask)
    lse = lse.to(scores.dtype)[..., None]  # (B, H, Sq, 1)
    # masked entries and rows with lse = -inf get probability 0, never exp(-inf + inf) = NaN
    probs = torch.where(keep & torch.isfinite(lse), torch.exp(scores - lse), torch.zeros_like(scores))
    dprobs = torch.matmul(doh, vh.transpose(-1, -2))  # (B, H, Sq, Sk)
    if dropout_mask is not None:
        kept = dropout_mask.to(scores.dtype) / (1.0 - dropout_p)
        dv = torch.matmul((probs * kept).transpose(-1, -2), doh)  # (B, H, Sk, D)
        dprobs = dprobs * kept
    else:
        dv = torch.matmul(probs.transpose(-1, -2), doh)  # (B, H, Sk, D)
    delta = (doh * oh).sum(dim=-1, keepdim=True)  # (B, H, Sq, 1)
    dscores = probs * (dprobs - delta) * scale
    dq = torch.matmul(dscores, kh)  # (B, H, Sq, D)
    dk = torch.matmul(dscores.transpose(-1, -2), qh)  # (B, H, Sk, D)
    # (B, H, Sk, D) -> (B, Sk, Hkv, D): sum each GQA group into the K/V head it read
    dk = dk.reshape(batch, nheads_kv, group, seqlen_k, headdim).sum(2).transpose(1, 2)
    dv = dv.reshape(batch, nheads_kv, group, seqlen_k, headdim).sum(2).transpose(1, 2)
    return dq.transpose(1, 2), dk, dv


def attention_varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    return_lse: bool = False,
    **kwargs,
):
    """Packed sequences: q (total_q, nheads, headdim), k/v (total_k, nheads_kv, headdim).

    Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and likewise for k/v; each is
    attended independently. lse comes back as (nheads, total_q).
    """
    outs, lses = [], []
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        out, lse = attention_reference(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], return_lse=True, **kwargs
        )
        outs.append(out[0])
        lses.append(lse[0])
    out = torch.cat(outs, dim=0)
    if return_lse:
        return out, torch.cat(lses, dim=-1)
    return out


def decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    return_lse: bool = False,
    **kwargs,
):
    """New queries q (batch, seqlen_q, nheads, headdim) against the first cache_seqlens[b] entries
    of k_cache/v_cache (batch, max_cache_len, nheads_kv, headdim). Causal alignment is bottom-right
    against each sequence's own length, i.e. the last new query sees the whole valid cache.
    """
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        out, lse = attention_reference(
            q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], return_lse=True, **kwargs
        )
        outs.append(out)
        lses.append(lse)
    out = torch.cat(outs, dim=0)
    if return_lse:
        return out, torch.cat(lses, dim=0)
    return out


def expand_block_layout(
    layout: torch.Tensor, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int
) -> torch.Tensor:
    """Bool block layout (nheads or 1, n_row_blocks, n_col_blocks) -> element keep-mask
    (1, nheads or 1, seqlen_q, seqlen_k), ready to pass as `attn_mask`."""
    mask = layout.repeat_interleave(block_m, dim=-2).repeat_interleave(block_n, dim=-1)
    return mask[None, :, :seqlen_q, :seqlen_k]


def block_sparse_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: torch.Tensor,
    block_m: int,
    block_n: int,
    **kwargs,
):
    """Dense attention restricted to the tiles `layout` keeps (same conventions as the kernel)."""
    mask = expand_block_layout(layout.to(q.device), block_m, block_n, q.shape[1], k.shape[1])
    return attention_reference(q, k, v, attn_mask=mask, **kwargs)


def linear_cross_entropy_reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Summed token cross-entropy of hidden @ weight.T (plain autograd, all logits at once)."""
    logits = (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))
    return torch.nn.functional.cross_entropy(
        logits, targets.long(), ignore_index=ignore_index, reduction="sum"
    )
