"""Block-sparse FlashAttention (the FlashAttention paper's Algorithm 5): forward and backward that
visit only the tiles a `BlockLayout` keeps, so time and HBM traffic scale with the layout's density.

Each program walks a compressed list of tiles (built once per layout and shape by
`BlockLayout.block_lists` and cached): the forward and the dq kernel walk, per query tile, the key
tiles it sees; the dk/dv kernel walks, per key tile, the query tiles that see it. Every list comes
in two parts: *full* tiles, every element kept, walked without any element mask or bounds check,
and *partial* tiles (causal diagonal, sequence tail) walked with one. The tile index is loaded from
the list and used in pointer arithmetic; the Triton interpreter runs this too (checked with
triton 3.6), so CI exercises the same kernels as the GPU.

Dropout follows the dense kernel: `_common.dropout_keep` draws the keep-mask from (seed, global row,
key), so the forward, both backward kernels and the dense kernel agree element for element whatever
their tiles; it sits behind a DROPOUT constexpr, so the no-dropout kernels compile as without it.

On an H100/H200 (sm_90) bf16/fp16 calls at head dims 64 and 128 take the Gluon kernels of the dense
path instead, walking the same lists (`kernels._block_sparse_hopper`: 1.2-1.3x these kernels at d128).

Layout of the op: kernels -> launchers (`_block_sparse_forward`, `_block_sparse_backward`) ->
`BlockSparseAttnFunc` -> `block_sparse_attention`. The torch reference is
`kernels.reference.block_sparse_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import _block_sparse_hopper
from kernels._common import (
    INTERPRET,
    LOG2E,
    check_causal,
    check_device,
    check_dropout,
    check_dtype,
    check_flag,
    check_heads,
    check_rank,
    dot_precision,
    draw_seed,
    dropout_keep_tile,
    dropout_mode,
    inference_call,
    load_tile,
    padded_head_dim,
    resolve_softmax_scale,
    rowsum_do_o,
    store_tile,
    unit_last_stride,
    wide_offsets,
    widen,
)
from kernels._flash_bwd import backward_delta
from kernels.layouts import BlockLayout

__all__ = ["block_sparse_attention", "BlockLayout"]


@triton.jit
def _keep_mask(offs_m, offs_n, seqlen_k, shift, CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N) element mask of a partial tile: key in the sequence, and causal."""
    keep = offs_n[None, :] < seqlen_k
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + shift)
    return keep


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tiles(
    acc, l_i, m_i, q, K, V, IDX, count,
    offs_m, rows, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_n0 = tl.arange(0, BLOCK_N)
    for t in range(0, count):
        start_n = tl.load(IDX + t) * BLOCK_N
        offs_n = start_n + offs_n0
        k = load_tile(K + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        # raw scores: the scale goes into each row's max and into the exp2's FMA (as the dense forward)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if MASKED:
            qk = tl.where(_keep_mask(offs_m, offs_n, seqlen_k, shift, CAUSAL), qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # log2 units
            # a row that has seen no key yet keeps m = -inf: subtract 0 instead of -inf (NaN)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            # the softmax denominator counts dropped entries; only the P @ V product loses them
            p = tl.where(dropout_keep_tile(seed, rows, start_n, dropout_p, offs_n0.shape[0], DROPOUT), p, 0.0)
        v = load_tile(V + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _bs_fwd_kernel(
    Q, K, V, Out, LSE,
    FULL_IDX, FULL_CNT, PART_IDX, PART_CNT,
    # strides (batch, seq, head); the head dim is unit-stride
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    # sizes
    nheads, seqlen_q, seqlen_k, shift, qk_scale, n_row_tiles, n_col_tiles,
    # dropout (read only when DROPOUT)
    dropout_p, seed,
    # meta-parameters
    GROUP: tl.constexpr, LAYOUT_PER_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)."""
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_om, stride_oh = widen(stride_om, WIDE), widen(stride_oh, WIDE)
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = off_bh % nheads
    off_hk = off_h // GROUP
    lay_h = off_h if LAYOUT_PER_HEAD else 0

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    Q += off_b * stride_qb + off_h * stride_qh
    K += off_b * stride_kb + off_hk * stride_kh
    V += off_b * stride_vb + off_hk * stride_vh
    q = load_tile(Q + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM,
                  True, BLOCK_D != HEAD_DIM)  # fmt: skip

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # each row's lse index is also its Philox row id, the same one the dense kernel uses
    rows = off_bh.to(tl.int64) * seqlen_q + offs_m
    lists = lay_h * n_row_tiles + pid_m
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q, K, V, FULL_IDX + lists * n_col_tiles, tl.load(FULL_CNT + lists),
        offs_m, rows, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
        BLOCK_N, False, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q, K, V, PART_IDX + lists * n_col_tiles, tl.load(PART_CNT + lists),
        offs_m, rows, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
        BLOCK_N, True, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
    )  # fmt: skip

    # rows that saw no key: l = 0 -> out 0 and lse -inf, without dividing by zero
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    if DROPOUT:
        acc = acc * (1.0 / (1.0 - dropout_p))
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)  # ln 2
    tl.store(LSE + rows, lse, mask=offs_m < seqlen_q)
    Out += off_b * stride_ob + off_h * stride_oh
    store_tile(Out + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(Out.dtype.element_ty), offs_m, offs_d,
               seqlen_q, HEAD_DIM)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dq_tiles(
    dq, q, do, lse2, delta, K, V, IDX, count,
    offs_m, rows, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_n0 = tl.arange(0, BLOCK_N)
    for t in range(0, count):
        start_n = tl.load(IDX + t) * BLOCK_N
        offs_n = start_n + offs_n0
        k = load_tile(K + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        v = load_tile(V + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if MASKED:
            # zero-padded keys score 0, and exp2(0 - lse) can overflow: mask before the exp (NaN hazard)
            qk = tl.where(_keep_mask(offs_m, offs_n, seqlen_k, shift, CAUSAL), qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        if DROPOUT:
            # dO reaches P only through the kept, rescaled entries; delta = rowsum(dO * O) already
            # describes the dropped output, so dS = P * (dP_dropped - delta) is exact
            keep = dropout_keep_tile(seed, rows, start_n, dropout_p, offs_n0.shape[0], DROPOUT)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bs_bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, O,  # noqa: E741
    FULL_IDX, FULL_CNT, PART_IDX, PART_CNT,
    # strides (batch, seq, head); the gradient has its own, so strided inputs need no copy
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_ob, stride_om, stride_oh,  # DELTA_HERE only
    # sizes
    nheads, seqlen_q, seqlen_k, shift, qk_scale, sm_scale, n_row_tiles, n_col_tiles,
    # dropout (read only when DROPOUT)
    dropout_p, seed,
    # meta-parameters
    GROUP: tl.constexpr, LAYOUT_PER_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, DELTA_HERE: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """dq of one query tile. DELTA_HERE: computes and stores its rows' delta, which the dk/dv kernel
    (launched after) reads: no preprocess launch (as the dense dq kernel, `_flash_bwd._bwd_dq`).
    WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)."""
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_dom, stride_doh = widen(stride_dom, WIDE), widen(stride_doh, WIDE)
    stride_dqm, stride_dqh = widen(stride_dqm, WIDE), widen(stride_dqh, WIDE)
    stride_om, stride_oh = widen(stride_om, WIDE), widen(stride_oh, WIDE)
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = off_bh % nheads
    off_hk = off_h // GROUP
    lay_h = off_h if LAYOUT_PER_HEAD else 0

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_off = off_b * stride_qb + off_h * stride_qh
    K += off_b * stride_kb + off_hk * stride_kh
    V += off_b * stride_vb + off_hk * stride_vh
    q = load_tile(Q + q_off + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM,
                  True, BLOCK_D != HEAD_DIM)  # fmt: skip
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM,
                  True, BLOCK_D != HEAD_DIM)  # fmt: skip
    row = off_bh.to(tl.int64) * seqlen_q + offs_m
    lse2 = tl.load(LSE + row, mask=offs_m < seqlen_q, other=float("inf")) * 1.4426950408889634
    # rows that saw no key have lse = -inf; +inf makes their p exactly 0 instead of NaN
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    if DELTA_HERE:
        o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
        delta = rowsum_do_o(o_ptrs, do, offs_m, offs_d, seqlen_q, HEAD_DIM, BLOCK_D)
        tl.store(DELTA + row, delta, mask=offs_m < seqlen_q)
    else:
        delta = tl.load(DELTA + row, mask=offs_m < seqlen_q, other=0.0)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lists = lay_h * n_row_tiles + pid_m
    dq = _dq_tiles(
        dq, q, do, lse2, delta, K, V, FULL_IDX + lists * n_col_tiles, tl.load(FULL_CNT + lists),
        offs_m, row, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
        BLOCK_N, False, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
    )  # fmt: skip
    dq = _dq_tiles(
        dq, q, do, lse2, delta, K, V, PART_IDX + lists * n_col_tiles, tl.load(PART_CNT + lists),
        offs_m, row, offs_d, stride_kn, stride_vn, seqlen_k, shift, qk_scale, dropout_p, seed,
        BLOCK_N, True, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
    )  # fmt: skip
    dq_ptrs = DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    store_tile(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), offs_m, offs_d, seqlen_q, HEAD_DIM)


@triton.jit
def _dkdv_tiles(
    dk, dv, k, v, Q, DO, LSE, DELTA, IDX, count, row0, key0,
    offs_n, offs_d, stride_qm, stride_dom, seqlen_q, seqlen_k, shift, qk_scale, dropout_p, seed,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_m0 = tl.arange(0, BLOCK_M)
    for t in range(0, count):
        start_m = tl.load(IDX + t) * BLOCK_M
        offs_m = start_m + offs_m0
        q = load_tile(Q + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        do = load_tile(DO + offs_m[:, None] * stride_dom + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM,
                  MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        if MASKED:
            # rows past the sequence get lse = +inf so p = 0; rows that saw no key (lse -inf) too
            lse2 = tl.load(LSE + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * 1.4426950408889634
            lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
            delta = tl.load(DELTA + offs_m, mask=offs_m < seqlen_q, other=0.0)
        else:
            lse2 = tl.load(LSE + offs_m) * 1.4426950408889634  # a full tile: every row saw a key
            delta = tl.load(DELTA + offs_m)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # (BLOCK_N, BLOCK_M)
        if MASKED:
            keep_t = offs_n[:, None] < seqlen_k
            if CAUSAL:
                keep_t = keep_t & (offs_n[:, None] <= offs_m[None, :] + shift)
            qk_t = tl.where(keep_t, qk_t, float("-inf"))
        p_t = tl.math.exp2(qk_t - lse2[None, :])
        if DROPOUT:
            # the forward's mask, regenerated transposed (keys x queries) from the same global ids
            keep_t = tl.trans(
                dropout_keep_tile(seed, row0 + offs_m, key0, dropout_p, offs_n.shape[0], DROPOUT)
            )
            inv_keep = 1.0 / (1.0 - dropout_p)
            pd_t = tl.where(keep_t, p_t * inv_keep, 0.0)
        else:
            pd_t = p_t
        dv = tl.dot(pd_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        if DROPOUT:
            dp_t = tl.where(keep_t, dp_t * inv_keep, 0.0)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _bs_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA,
    FULL_IDX, FULL_CNT, PART_IDX, PART_CNT,
    # strides (batch, seq, head); the gradients have their own, so strided inputs need no copy
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    # sizes
    nheads, nheads_kv, seqlen_q, seqlen_k, shift, qk_scale, sm_scale, n_row_tiles, n_col_tiles,
    # dropout (read only when DROPOUT)
    dropout_p, seed,
    # meta-parameters
    GROUP: tl.constexpr, LAYOUT_PER_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)."""
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_dom, stride_doh = widen(stride_dom, WIDE), widen(stride_doh, WIDE)
    stride_dkn, stride_dkh = widen(stride_dkn, WIDE), widen(stride_dkh, WIDE)
    stride_dvn, stride_dvh = widen(stride_dvn, WIDE), widen(stride_dvh, WIDE)
    pid_n = tl.program_id(0)
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // nheads_kv).to(tl.int64)
    off_hk = off_bhk % nheads_kv

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_off = off_b * stride_kb + off_hk * stride_kh
    v_off = off_b * stride_vb + off_hk * stride_vh
    k = load_tile(K + k_off + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  True, BLOCK_D != HEAD_DIM)  # fmt: skip
    v = load_tile(V + v_off + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM,
                  True, BLOCK_D != HEAD_DIM)  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # the query heads of this kv head each have their own tile lists; summing them here avoids atomics
    for g in range(0, GROUP):
        off_h = off_hk * GROUP + g
        lay_h = off_h if LAYOUT_PER_HEAD else 0
        Qh = Q + off_b * stride_qb + off_h * stride_qh
        DOh = DO + off_b * stride_dob + off_h * stride_doh
        row0 = (off_b * nheads + off_h) * seqlen_q
        lists = lay_h * n_col_tiles + pid_n
        dk, dv = _dkdv_tiles(
            dk, dv, k, v, Qh, DOh, LSE + row0, DELTA + row0,
            FULL_IDX + lists * n_row_tiles, tl.load(FULL_CNT + lists), row0, pid_n * BLOCK_N,
            offs_n, offs_d, stride_qm, stride_dom, seqlen_q, seqlen_k, shift, qk_scale,
            dropout_p, seed, BLOCK_M, False, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
        )  # fmt: skip
        dk, dv = _dkdv_tiles(
            dk, dv, k, v, Qh, DOh, LSE + row0, DELTA + row0,
            PART_IDX + lists * n_row_tiles, tl.load(PART_CNT + lists), row0, pid_n * BLOCK_N,
            offs_n, offs_d, stride_qm, stride_dom, seqlen_q, seqlen_k, shift, qk_scale,
            dropout_p, seed, BLOCK_M, True, CAUSAL, HEAD_DIM, BLOCK_D, DROPOUT, DOT_PREC,
        )  # fmt: skip
    DK += off_b * stride_dkb + off_hk * stride_dkh
    DV += off_b * stride_dvb + off_hk * stride_dvh
    store_tile(DK + offs_n[:, None] * stride_dkn + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
               offs_n, offs_d, seqlen_k, HEAD_DIM)  # fmt: skip
    store_tile(DV + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), offs_n, offs_d,
               seqlen_k, HEAD_DIM)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# tile configs and launchers
# ----------------------------------------------------------------------------------------------

# (tile_m, tile_n, num_warps, num_stages) per pass on the GPU; a tile is capped at the layout block.
# 64 and 128 are the fastest of 3 candidates per pass measured by `bench_block_sparse.py --tune`
# (H200, bf16, n=16k, 16 heads, butterfly on 128-blocks; results/block_sparse_h200.json holds the
# trials); 256 is untuned, sized to fit shared memory.
_GPU_CONFIGS = {
    "fwd": {64: (128, 64, 8, 3), 128: (128, 128, 8, 3), 256: (64, 32, 8, 2)},
    "dq": {64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)},
    "dkdv": {64: (64, 64, 4, 3), 128: (64, 64, 4, 3), 256: (32, 64, 8, 2)},
}


def _tiles(layout: BlockLayout, pass_name: str, head_dim: int, override=None) -> tuple[int, int, int, int]:
    """Kernel tile sizes for one pass: the layout's block in the interpreter (small shapes)."""
    if override is not None:
        tile_m, tile_n = override
        return tile_m, tile_n, 4, 2
    if INTERPRET:
        return layout.block_m, layout.block_n, 4, 2
    table = _GPU_CONFIGS[pass_name]
    tile_m, tile_n, warps, stages = table[min(d for d in table if d >= head_dim)]
    return min(tile_m, layout.block_m), min(tile_n, layout.block_n), warps, stages


def _check_inputs(q, k, v, layout, causal, softmax_scale, dropout_p):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t, 4, "(batch, seqlen, nheads, headdim)")
    check_device(q, k, v)
    check_dtype(q, k, v)
    batch, seqlen_q, nheads, headdim = q.shape
    if k.shape != v.shape or k.shape[0] != batch:
        raise ValueError(f"k and v must both be (batch={batch}, seqlen_k, nheads_kv, headdim), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")  # fmt: skip
    check_heads(nheads, k.shape[2], headdim, k.shape[3], v.shape[3])
    if seqlen_q == 0 or k.shape[1] == 0:
        raise ValueError(f"sequence lengths must be >= 1, got seqlen_q={seqlen_q}, seqlen_k={k.shape[1]}")
    if not isinstance(layout, BlockLayout):
        raise ValueError(
            f"layout must be a kernels.layouts.BlockLayout (it carries its block size), got "
            f"{type(layout).__name__}: wrap a bool tile mask as BlockLayout(mask, block_size)"
        )
    if layout.device != q.device:
        raise ValueError(
            f"layout is on {layout.device} but the inputs are on {q.device}: use layout.to({str(q.device)!r})"
        )
    if layout.nheads not in (1, nheads):
        raise ValueError(f"layout has {layout.nheads} heads; it needs 1 (shared) or nheads={nheads}")
    layout.check_covers(seqlen_q, k.shape[1])
    resolve_softmax_scale(softmax_scale, headdim)
    check_dropout(dropout_p)
    check_causal(causal)


def _block_sparse_forward(
    q, k, v, layout: BlockLayout, causal: bool, sm_scale: float, dropout_p: float, seed: int, tiles=None,
    hopper: bool | None = None,
):  # fmt: skip
    """Launcher: returns out (like q) and lse (batch, nheads, seqlen_q) float32, natural log. hopper:
    `takes_hopper_forward`'s answer for these arguments, if the caller has it."""
    if hopper is None:
        hopper = takes_hopper_forward(q, k, v, layout, dropout_p, tiles)
    if hopper:
        return _block_sparse_hopper.block_sparse_forward_hopper(q, k, v, layout, causal, sm_scale)
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    head_dim = padded_head_dim(headdim)
    tile_m, tile_n, warps, stages = _tiles(layout, "fwd", head_dim, tiles)
    lists = layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, tile_n)
    n_rows, n_cols = lists.tile_kind.shape[1:]
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    grid = (n_rows, batch * nheads)
    _bs_fwd_kernel[grid](
        q, k, v, out, lse,
        lists.row_full_idx, lists.row_full_cnt, lists.row_part_idx, lists.row_part_cnt,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        nheads, seqlen_q, seqlen_k, seqlen_k - seqlen_q, sm_scale * LOG2E, n_rows, n_cols,
        dropout_p, seed,
        GROUP=nheads // nheads_kv, LAYOUT_PER_HEAD=layout.nheads > 1, HEAD_DIM=headdim,
        BLOCK_D=head_dim, BLOCK_M=tile_m, BLOCK_N=tile_n, CAUSAL=causal, DROPOUT=dropout_mode(dropout_p),
        DOT_PREC=dot_precision(q.dtype), WIDE=wide_offsets((q, k, v, out)), num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return out, lse


def takes_hopper_forward(q, k, v, layout: BlockLayout, dropout_p: float, tiles=None) -> bool:
    """Whether the forward takes the Hopper kernel (`_block_sparse_hopper.usable_forward`; never with a
    tile override)."""
    return tiles is None and _block_sparse_hopper.usable_forward(q, k, v, layout, dropout_p)


def _block_sparse_backward(
    do, q, k, v, out, lse, layout: BlockLayout, causal: bool, sm_scale: float, dropout_p: float, seed: int,
    tiles=None, dlse=None, forward_hopper: bool | None = None,
):  # fmt: skip
    """Launcher: returns dq, dk, dv shaped like q, k, v (dk/dv summed over each kv head's group).
    dlse: the loss's gradient with respect to the (natural-log) lse, or None when it does not use it.
    forward_hopper: whether the forward of these q, k, v took the Hopper kernel (`takes_hopper_forward`),
    which saves the backward asking again; None asks."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    head_dim = padded_head_dim(headdim)
    (do,) = unit_last_stride(do)
    if tiles is None and _block_sparse_hopper.usable_backward(
        q, k, v, do, out, layout, dropout_p, lse_grad=dlse is not None, forward_hopper=forward_hopper
    ):
        return _block_sparse_hopper.block_sparse_backward_hopper(
            do, q, k, v, out, lse, layout, causal, sm_scale
        )
    # the dq kernel computes delta unless lse has a gradient, which the dense kernels' preprocess folds in
    delta_here = dlse is None
    delta = torch.empty_like(lse) if delta_here else backward_delta(out, do, lse, dlse=dlse)
    # dense gradients whatever the inputs' strides (q/k/v may be slices of a fused QKV projection)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    common = dict(GROUP=nheads // nheads_kv, LAYOUT_PER_HEAD=layout.nheads > 1, HEAD_DIM=headdim,
                  BLOCK_D=head_dim, CAUSAL=causal, DROPOUT=dropout_mode(dropout_p),
                  DOT_PREC=dot_precision(q.dtype), WIDE=wide_offsets((q, k, v, do, out, dq, dk, dv)))  # fmt: skip
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))  # fmt: skip

    tile_m, tile_n, warps, stages = _tiles(layout, "dq", head_dim, tiles)
    lists = layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, tile_n)
    n_rows, n_cols = lists.tile_kind.shape[1:]
    _bs_bwd_dq_kernel[(n_rows, batch * nheads)](
        q, k, v, do, dq, lse, delta, out,
        lists.row_full_idx, lists.row_full_cnt, lists.row_part_idx, lists.row_part_cnt, *strides,
        dq.stride(0), dq.stride(1), dq.stride(2), out.stride(0), out.stride(1), out.stride(2),
        nheads, seqlen_q, seqlen_k, seqlen_k - seqlen_q, sm_scale * LOG2E, sm_scale, n_rows, n_cols,
        dropout_p, seed, BLOCK_M=tile_m, BLOCK_N=tile_n, num_warps=warps, num_stages=stages,
        DELTA_HERE=delta_here, **common,
    )  # fmt: skip

    tile_m, tile_n, warps, stages = _tiles(layout, "dkdv", head_dim, tiles)
    lists = layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, tile_n)
    n_rows, n_cols = lists.tile_kind.shape[1:]
    _bs_bwd_dkdv_kernel[(n_cols, batch * nheads_kv)](
        q, k, v, do, dk, dv, lse, delta,
        lists.col_full_idx, lists.col_full_cnt, lists.col_part_idx, lists.col_part_cnt, *strides,
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        nheads, nheads_kv, seqlen_q, seqlen_k, seqlen_k - seqlen_q, sm_scale * LOG2E, sm_scale,
        n_rows, n_cols, dropout_p, seed,
        BLOCK_M=tile_m, BLOCK_N=tile_n, num_warps=warps, num_stages=stages, **common,
    )  # fmt: skip
    return dq, dk, dv


def _run_forward(q, k, v, layout, causal, sm_scale, dropout_p, seed, tiles):
    """The forward's kernels: (q, k, v as they read them, out, lse, whether the Hopper forward ran)."""
    q, k, v = unit_last_stride(q, k, v)
    hopper = takes_hopper_forward(q, k, v, layout, dropout_p, tiles)
    out, lse = _block_sparse_forward(q, k, v, layout, causal, sm_scale, dropout_p, seed, tiles, hopper)
    return q, k, v, out, lse, hopper


class BlockSparseAttnFunc(torch.autograd.Function):
    """lse_grad: lse goes back to the user, so it is differentiable (as in `kernels.flash_attention`)."""

    @staticmethod
    def forward(ctx, q, k, v, layout, causal, sm_scale, dropout_p, seed, tiles, lse_grad):
        q, k, v, out, lse, hopper = _run_forward(q, k, v, layout, causal, sm_scale, dropout_p, seed, tiles)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.causal, ctx.sm_scale, ctx.tiles, ctx.hopper = layout, causal, sm_scale, tiles, hopper
        # the backward regenerates the keep-mask from the seed instead of storing it
        ctx.dropout_p, ctx.seed, ctx.lse_grad = dropout_p, seed, lse_grad
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        # an output the loss does not use gets None, not zeros: a returned lse that the loss ignores then
        # leaves the backward free to compute delta itself (and to take the Hopper kernels)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if do is None:  # only lse reaches the loss
            do = torch.zeros_like(out)
        dlse = dlse if ctx.lse_grad else None
        dq, dk, dv = _block_sparse_backward(
            do, q, k, v, out, lse, ctx.layout, ctx.causal, ctx.sm_scale, ctx.dropout_p, ctx.seed,
            ctx.tiles, dlse, ctx.hopper,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 7)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: BlockLayout,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
    _tiles: tuple[int, int] | None = None,
):
    """Attention restricted to the tiles a block layout keeps; forward and backward skip the rest.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), nheads_kv
    dividing nheads (GQA: query head h reads kv head h // (nheads // nheads_kv)). float16, bfloat16
    or float32, CUDA tensors (CPU under TRITON_INTERPRET=1); head dim up to 256.
    layout: `kernels.layouts.BlockLayout`, a bool tile mask (nheads or 1, n_row_blocks, n_col_blocks)
    that carries its block sizes (powers of two >= 16) and lives on q's device. Query i may attend to
    key j iff layout[h, i // block_m, j // block_n]; the grid must cover seqlen_q x seqlen_k (blocks
    wholly past the sequence are ignored). Build one with `kernels.layouts.butterfly_layout`,
    `local_layout`, `strided_layout`, `random_layout` or `make_layout`.
    causal: also mask keys after the query, aligned bottom-right as in `kernels.flash_attention`.
    softmax_scale: defaults to 1 / sqrt(headdim).
    dropout_p: dropout on the attention probabilities, in [0, 1), as in `kernels.flash_attention`: the
    Philox seed comes from torch's CPU generator (torch.manual_seed makes it reproducible), kept
    probabilities are scaled by 1 / (1 - dropout_p), the backward regenerates the mask, and lse is
    unaffected. The mask depends only on (seed, batch, head, query, key), so for the same seed it is
    the dense kernel's mask (`kernels.reference.dropout_mask`) restricted to the layout.
    A query row that sees no key gets out = 0 and lse = -inf, and zero gradients.
    Returns out (batch, seqlen_q, nheads, headdim), and with return_lse also lse
    (batch, nheads, seqlen_q), float32, natural log of the softmax denominator, differentiable as
    in `kernels.flash_attention`.
    _tiles: (tile_m, tile_n) override of the kernel tiles, for tests of the block-splitting path.
    """
    _check_inputs(q, k, v, layout, causal, softmax_scale, dropout_p)
    check_flag("return_lse", return_lse)
    dropout_p = float(dropout_p)
    sm_scale = resolve_softmax_scale(softmax_scale, q.shape[-1])
    seed = draw_seed() if dropout_p > 0 else 0
    args = (q, k, v, layout, causal, float(sm_scale), dropout_p, seed, _tiles)
    if inference_call(q, k, v):  # no gradient can flow: the forward's kernels without the autograd Function
        _, _, _, out, lse, _ = _run_forward(*args)
    else:
        out, lse = BlockSparseAttnFunc.apply(*args, return_lse)
    if return_lse:
        return out, lse
    return out
