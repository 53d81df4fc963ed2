"""FlashAttention backward: delta preprocess, dk/dv kernel (loops over query tiles and over the query
heads of its GQA group) and dq kernel (loops over key tiles). No atomics: each output tile is owned by
one program, so results are deterministic. Dropout masks are regenerated from (seed, position).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _flash_bwd_fused_hopper, _flash_dkdv_hopper, _flash_dq_hopper
from ._common import (
    INTERPRET,
    LOG2E,
    autotune,
    cdiv,
    dot_precision,
    dropout_keep_tile,
    dropout_mode,
    load_tile,
    mask_scores,
    padded_head_dim,
    rowsum_do_o,
    sched_slots_for,
    sm_count,
    store_or_add_tile,
    tile_program_ids,
    token_strides,
    varlen_bounds,
    visible_range,
    wide_offsets,
    widen,
)
from ._flash_fwd import _TUNE_KEY, dropout_row_ids, prune_configs, tune_bucket, without_narrow_key_tiles
from ._grad_sums import sum_head_groups
from ._launch import CompiledLaunch


@triton.jit
def _bwd_preprocess(
    O, DO, DELTA, CU_Q,  # noqa: E741
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    stride_lb, stride_lh,
    seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """delta = rowsum(dO * O) in fp32, laid out like lse: it replaces rowsum(dP * P) in dS."""
    stride_om, stride_oh = widen(stride_om, WIDE), widen(stride_oh, WIDE)
    stride_dom, stride_doh = widen(stride_dom, WIDE), widen(stride_doh, WIDE)
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    if IS_VARLEN:
        q_start, seqlen_q = varlen_bounds(CU_Q, off_b)
    else:
        q_start = 0
    if pid_m * BLOCK_M >= seqlen_q:
        return
    off_b64 = off_b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    do = load_tile(DO + off_b64 * stride_dob + (q_start + offs_m)[:, None] * stride_dom + off_h * stride_doh
                   + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip
    o_ptrs = O + off_b64 * stride_ob + (q_start + offs_m)[:, None] * stride_om + off_h * stride_oh
    o_ptrs += offs_d[None, :]
    delta = rowsum_do_o(o_ptrs, do, offs_m, offs_d, seqlen_q, HEAD_DIM, BLOCK_D)
    tl.store(
        DELTA + off_b64 * stride_lb + off_h * stride_lh + q_start + offs_m, delta, mask=offs_m < seqlen_q
    )


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v, kpm,
    Q, DO, LSE, DELTA, DQ, stride_qm, stride_dom, stride_dqm, lse_off,
    offs_n, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_off, key0,
    lo, hi,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """Accumulate dk, dv of one key tile over query tiles [lo, hi), working transposed (keys x queries).

    key0: the dropout column of the tile's first key. PART: 0 both, 1 dv only, 2 dk only (and the
    atomic dq); a split pass recomputes P in each half but holds one fp32 accumulator, not two."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = load_tile(Q + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, offs_d, seqlen_q,
                      HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        if MASKED:
            lse = tl.load(LSE + lse_off + offs_m, mask=offs_m < seqlen_q, other=0.0)
        else:
            lse = tl.load(LSE + lse_off + offs_m)
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # (BLOCK_N, BLOCK_M), base 2
        if MASKED:
            pos_m = offs_m + (seqlen_k - seqlen_q)
            keep = (offs_m[None, :] < seqlen_q) & (offs_n[:, None] < seqlen_k)
            if HAS_RIGHT:
                keep = keep & (offs_n[:, None] <= pos_m[None, :] + win_right)
            if HAS_LEFT:
                keep = keep & (offs_n[:, None] >= pos_m[None, :] - win_left)
            qkT = tl.where(keep, qkT, float("-inf"))
        if HAS_KPM:
            qkT = tl.where(kpm[:, None], qkT, float("-inf"))
        if MASKED or HAS_KPM:
            # rows that saw no key have lse = -inf; their scores are all -inf here, so any finite lse gives 0
            lse = tl.where(lse == float("-inf"), 0.0, lse)
        pT = tl.math.exp2(qkT - lse[None, :])
        do = load_tile(DO + offs_m[:, None] * stride_dom + offs_d[None, :], offs_m, offs_d, seqlen_q,
                       HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        if DROPOUT:
            rows = rng_off + offs_m.to(tl.int64)
            # drawn as the forward's (queries, keys) tile, then transposed
            keepT = tl.trans(dropout_keep_tile(seed, rows, key0, dropout_p, offs_n.shape[0], DROPOUT))
            inv_keep = 1.0 / (1.0 - dropout_p)
            pdT = tl.where(keepT, pT * inv_keep, 0.0)
        else:
            pdT = pT
        if PART != 2:
            dv = tl.dot(pdT.to(do.dtype), do, dv, input_precision=DOT_PREC)
        if PART != 1:
            if MASKED:
                delta = tl.load(DELTA + lse_off + offs_m, mask=offs_m < seqlen_q, other=0.0)
            else:
                delta = tl.load(DELTA + lse_off + offs_m)
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            if DROPOUT:
                dpT = tl.where(keepT, dpT * inv_keep, 0.0)
            dsT = pT * (dpT - delta[None, :])
            dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PREC)
        if ATOMIC_DQ and PART != 1:
            # FA2-style: this tile's dS @ K goes straight into an fp32 dq (unscaled), saving the dq
            # kernel's recompute of QK^T and dO V^T at the price of nondeterministic summation order
            dq = tl.dot(tl.trans(dsT).to(k.dtype), k, input_precision=DOT_PREC)
            dq_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(
                DQ + offs_m[:, None] * stride_dqm + offs_d[None, :], dq, mask=dq_mask, sem="relaxed"
            )
    return dk, dv


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, DK, DV, DQ, LSE, DELTA, KPM, CU_Q, CU_K,
    # strides (the head dim's is 1); dO has q's layout, dk/dv have k's
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    stride_dqb, stride_dqm, stride_dqh,  # the fp32 dq accumulator (ATOMIC_DQ only)
    stride_lb, stride_lh,
    stride_kpmb, stride_kpmn,
    seqlen_q, seqlen_k, group,
    sm_scale, qk_scale, win_left, win_right, dropout_p, seed,
    drop_sb, drop_sh, drop_row0, drop_col0,  # dropout row ids, as in the forward
    tune_seqlen,  # autotune key only
    sched_slots,  # the program order (`_common.tile_program_ids`)
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr, ACCUMULATE: tl.constexpr, PART: tl.constexpr,
    WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_dom, stride_doh = widen(stride_dom, WIDE), widen(stride_doh, WIDE)
    stride_dkn, stride_dkh = widen(stride_dkn, WIDE), widen(stride_dkh, WIDE)
    stride_dvn, stride_dvh = widen(stride_dvn, WIDE), widen(stride_dvh, WIDE)
    stride_dqm, stride_dqh = widen(stride_dqm, WIDE), widen(stride_dqh, WIDE)
    # causal: the first key tiles are seen by the most queries, so tile order is already heaviest first
    pid_n, _, off_hk, off_b = tile_program_ids(sched_slots)
    if IS_VARLEN:
        q_start, seqlen_q = varlen_bounds(CU_Q, off_b)
        k_start, seqlen_k = varlen_bounds(CU_K, off_b)
    else:
        q_start = 0
        k_start = 0
    if pid_n * BLOCK_N >= seqlen_k:
        return
    key0 = drop_col0 + k_start + pid_n * BLOCK_N  # varlen: keys are numbered by their packed index
    off_b64 = off_b.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + off_b64 * stride_kb + (k_start + offs_n)[:, None] * stride_kn + off_hk * stride_kh
                  + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip
    if PART != 1:  # the dv-only half never reads V
        v = load_tile(V + off_b64 * stride_vb + (k_start + offs_n)[:, None] * stride_vn + off_hk * stride_vh
                      + offs_d[None, :], offs_n, offs_d, seqlen_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip
    else:
        v = k
    if HAS_KPM:
        kpm = (
            tl.load(KPM + off_b64 * stride_kpmb + offs_n * stride_kpmn, mask=offs_n < seqlen_k, other=0) != 0
        )
    else:
        kpm = None

    diag = seqlen_k - seqlen_q
    last_col = tl.minimum((pid_n + 1) * BLOCK_N, seqlen_k) - 1
    # query i sees key j iff j - diag - right <= i <= j - diag + left
    lo, full_lo, full_hi, hi = visible_range(
        pid_n * BLOCK_N, last_col, seqlen_q, -diag - win_right, -diag + win_left, BLOCK_M, HAS_RIGHT, HAS_LEFT
    )
    partial = (pid_n + 1) * BLOCK_N > seqlen_k  # a partial key tile is masked against every query tile
    full_lo = tl.where(partial, hi, full_lo)
    full_hi = tl.where(partial, hi, full_hi)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # GQA: this program owns the kv head, so it sums its query heads' contributions in registers
    for g in range(0, group):
        off_h = off_hk * group + g
        q_base = Q + off_b64 * stride_qb + q_start * stride_qm + off_h * stride_qh
        do_base = DO + off_b64 * stride_dob + q_start * stride_dom + off_h * stride_doh
        lse_off = off_b64 * stride_lb + off_h * stride_lh + q_start
        rng_off = off_b64 * drop_sb + off_h * drop_sh + drop_row0 + q_start
        if ATOMIC_DQ:
            dq_base = DQ + off_b64 * stride_dqb + q_start * stride_dqm + off_h * stride_dqh
        else:
            dq_base = DQ
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, kpm, q_base, do_base, LSE, DELTA, dq_base, stride_qm, stride_dom, stride_dqm, lse_off,
            offs_n, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_off, key0,
            lo, full_lo, True, HEAD_DIM, BLOCK_D, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC, ATOMIC_DQ,
            PART,
        )  # fmt: skip
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, kpm, q_base, do_base, LSE, DELTA, dq_base, stride_qm, stride_dom, stride_dqm, lse_off,
            offs_n, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_off, key0,
            full_lo, full_hi, False, HEAD_DIM, BLOCK_D, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC, ATOMIC_DQ,
            PART,
        )  # fmt: skip
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, kpm, q_base, do_base, LSE, DELTA, dq_base, stride_qm, stride_dom, stride_dqm, lse_off,
            offs_n, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_off, key0,
            full_hi, hi, True, HEAD_DIM, BLOCK_D, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC, ATOMIC_DQ,
            PART,
        )  # fmt: skip
    if PART != 1:
        dk = dk * sm_scale
        store_or_add_tile(DK + off_b64 * stride_dkb + (k_start + offs_n)[:, None] * stride_dkn + off_hk * stride_dkh
                          + offs_d[None, :], dk, offs_n, offs_d, seqlen_k, HEAD_DIM, ACCUMULATE)  # fmt: skip
    if PART != 2:
        store_or_add_tile(DV + off_b64 * stride_dvb + (k_start + offs_n)[:, None] * stride_dvn + off_hk * stride_dvh
                          + offs_d[None, :], dv, offs_n, offs_d, seqlen_k, HEAD_DIM, ACCUMULATE)  # fmt: skip


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse, delta, K, V, KPM, stride_kn, stride_vn, stride_kpmn,
    offs_m, rng_rows, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, drop_col0,
    lo, hi,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_n0 = tl.arange(0, BLOCK_N)
    pos_m = offs_m + (seqlen_k - seqlen_q)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_tile(K + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, offs_d, seqlen_k,
                      HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        v = load_tile(V + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, offs_d, seqlen_k,
                      HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        qk = mask_scores(
            qk, offs_n, pos_m, seqlen_k, win_left, win_right, KPM, stride_kpmn, MASKED, HAS_LEFT, HAS_RIGHT, HAS_KPM
        )  # fmt: skip
        p = tl.math.exp2(qk - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        if DROPOUT:
            keep_d = dropout_keep_tile(seed, rng_rows, drop_col0 + start_n, dropout_p, BLOCK_N, DROPOUT)
            dp = tl.where(keep_d, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq(
    Q, K, V, DO, DQ, LSE, DELTA, KPM, CU_Q, CU_K, O,  # noqa: E741
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_ob, stride_om, stride_oh,  # DELTA_HERE only
    stride_lb, stride_lh,
    stride_kpmb, stride_kpmn,
    seqlen_q, seqlen_k, group,
    sm_scale, qk_scale, win_left, win_right, dropout_p, seed,
    drop_sb, drop_sh, drop_row0, drop_col0,  # dropout row ids, as in the forward
    tune_seqlen,  # autotune key only
    sched_slots,  # the program order (`_common.tile_program_ids`)
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, ACCUMULATE: tl.constexpr, DELTA_HERE: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dq of one query tile. DELTA_HERE: this kernel computes its rows' delta = rowsum(dO * O) and
    stores it for the dk/dv kernel, which then runs second: the preprocess kernel's launch (~35 us of
    device time at n1k, and a launch of host time) is saved; the O tile is one extra load per program.
    WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)."""
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_dom, stride_doh = widen(stride_dom, WIDE), widen(stride_doh, WIDE)
    stride_dqm, stride_dqh = widen(stride_dqm, WIDE), widen(stride_dqh, WIDE)
    stride_om, stride_oh = widen(stride_om, WIDE), widen(stride_oh, WIDE)
    pid_m, n_tiles, off_h, off_b = tile_program_ids(sched_slots)
    if HAS_RIGHT:  # the forward's order: the rows that see the most keys first
        pid_m = n_tiles - 1 - pid_m
    if IS_VARLEN:
        q_start, seqlen_q = varlen_bounds(CU_Q, off_b)
        k_start, seqlen_k = varlen_bounds(CU_K, off_b)
    else:
        q_start = 0
        k_start = 0
    if pid_m * BLOCK_M >= seqlen_q:
        return
    off_hk = off_h // group
    off_b64 = off_b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + off_b64 * stride_qb + (q_start + offs_m)[:, None] * stride_qm + off_h * stride_qh
                  + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip
    do = load_tile(DO + off_b64 * stride_dob + (q_start + offs_m)[:, None] * stride_dom + off_h * stride_doh
                   + offs_d[None, :], offs_m, offs_d, seqlen_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip
    rows = off_b64 * stride_lb + off_h * stride_lh + q_start + offs_m
    lse = tl.load(LSE + rows, mask=offs_m < seqlen_q, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)  # rows that saw no key: every score is masked anyway
    if DELTA_HERE:
        o_ptrs = O + off_b64 * stride_ob + (q_start + offs_m)[:, None] * stride_om + off_h * stride_oh
        o_ptrs += offs_d[None, :]
        delta = rowsum_do_o(o_ptrs, do, offs_m, offs_d, seqlen_q, HEAD_DIM, BLOCK_D)
        tl.store(DELTA + rows, delta, mask=offs_m < seqlen_q)
    else:
        delta = tl.load(DELTA + rows, mask=offs_m < seqlen_q, other=0.0)
    rng_rows = off_b64 * drop_sb + off_h * drop_sh + drop_row0 + q_start + offs_m
    rng_col0 = drop_col0 + k_start
    k_base = K + off_b64 * stride_kb + k_start * stride_kn + off_hk * stride_kh
    v_base = V + off_b64 * stride_vb + k_start * stride_vn + off_hk * stride_vh
    kpm_base = KPM + off_b64 * stride_kpmb

    diag = seqlen_k - seqlen_q
    last_row = tl.minimum((pid_m + 1) * BLOCK_M, seqlen_q) - 1
    lo, full_lo, full_hi, hi = visible_range(
        pid_m * BLOCK_M + diag, last_row + diag, seqlen_k, -win_left, win_right, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _bwd_dq_inner(
        dq, q, do, lse, delta, k_base, v_base, kpm_base, stride_kn, stride_vn, stride_kpmn,
        offs_m, rng_rows, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_col0,
        lo, full_lo, True, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC,
    )  # fmt: skip
    dq = _bwd_dq_inner(
        dq, q, do, lse, delta, k_base, v_base, kpm_base, stride_kn, stride_vn, stride_kpmn,
        offs_m, rng_rows, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_col0,
        full_lo, full_hi, False, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC,
    )  # fmt: skip
    dq = _bwd_dq_inner(
        dq, q, do, lse, delta, k_base, v_base, kpm_base, stride_kn, stride_vn, stride_kpmn,
        offs_m, rng_rows, offs_d, seqlen_q, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_col0,
        full_hi, hi, True, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC,
    )  # fmt: skip
    dq = dq * sm_scale
    store_or_add_tile(DQ + off_b64 * stride_dqb + (q_start + offs_m)[:, None] * stride_dqm + off_h * stride_dqh
                      + offs_d[None, :], dq, offs_m, offs_d, seqlen_q, HEAD_DIM, ACCUMULATE)  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# autotune configs
# ---------------------------------------------------------------------------------------------------


def _configs(shapes, interp_shape) -> list[triton.Config]:
    if INTERPRET:
        m, n = interp_shape
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


# Padded head dims above this compute dk and dv in two passes (PART 1: dv, PART 2: dk and the atomic
# dq), each holding one BLOCK_N x BLOCK_D fp32 accumulator instead of two: at d256 two accumulators
# leave room for 32x64 tiles only (the backward ran at 0.81x SDPA flash there), one allows 64x128.
# The price is P recomputed in both passes (5 matmuls per tile pair instead of 4). Measured on an H200
# at d256: backward 165-182 -> 229-269 TFLOP/s (benchmarks/NOTES_attention.md).
SPLIT_DKDV_ABOVE = 128

# (BLOCK_M, BLOCK_N, num_warps, num_stages). The interpreter's tiles differ between the two kernels on
# purpose, so the CPU tests exercise tile-size independence (of masks and of dropout). The last two of
# each list are for head dim 256, where the pruning (registers of the fp32 accumulators, shared memory
# of the stages) leaves one config of the others per kernel: candidates, not yet measured there.
_DKDV_CONFIGS = _configs(
    [(32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (128, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3),
     (32, 64, 8, 2), (64, 64, 8, 1), (64, 32, 4, 2)],
    (16, 32),
)  # fmt: skip
_DQ_CONFIGS = _configs(
    [(128, 32, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (64, 32, 4, 2),
     (64, 64, 8, 2), (128, 32, 8, 2)],
    (32, 16),
)  # fmt: skip


def _prune_dkdv(configs, named_args, **kwargs):
    n_acc = 1 if {**named_args, **kwargs}.get("PART") else 2  # a split pass holds dk or dv, not both
    return prune_configs(configs, named_args, "seqlen_k", "seqlen_q", "BLOCK_N", n_acc, **kwargs)


def _prune_dq(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    configs = without_narrow_key_tiles(configs, args["BLOCK_D"])
    if args["DELTA_HERE"] and args["BLOCK_D"] <= 32:
        # Triton 3.6's bundled ptxas dies (SIGSEGV) on this one config with the delta computed in the
        # kernel at head dims <= 32 (found on CPU by check_kernel_builds.py); the autotuner would skip it
        # on a GPU after paying for the crash, so it is left out here (prune_configs keeps two candidates)
        shape = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
        configs = [c for c in configs if shape(c) != (64, 64, 8, 2)]
    return prune_configs(configs, named_args, "seqlen_q", "seqlen_k", "BLOCK_M", 1, **kwargs)


# ACCUMULATE adds into the gradient buffers, so the autotuner's trial runs put them back (a copy made
# only while tuning a key; ACCUMULATE is part of the key)
_bwd_dkdv_tuned = autotune(
    _bwd_dkdv, configs=_DKDV_CONFIGS, key=[*_TUNE_KEY, "PART"], prune_configs_by={"early_config_prune": _prune_dkdv},
    restore_value=["DK", "DV"],
)  # fmt: skip
# the atomic variant accumulates into DQ, so the autotuner must zero it before each timed run
_bwd_dkdv_atomic_tuned = autotune(
    _bwd_dkdv,
    configs=_DKDV_CONFIGS,
    key=[*_TUNE_KEY, "PART"],
    prune_configs_by={"early_config_prune": _prune_dkdv},
    reset_to_zero=["DQ"],
)
_bwd_dq_tuned = autotune(
    _bwd_dq, configs=_DQ_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune_dq},
    restore_value=["DQ"],
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------


# Through the compiled kernel's own launcher after the first call (`_launch.CompiledLaunch`): Triton's
# `kernel[grid](...)` binds and specializes every argument in Python each call, ~0.08 ms of a one-kernel
# backward's host time under cProfile (results/s63/call8), where eager short calls are host-bound
_launch_preprocess = CompiledLaunch(_bwd_preprocess)


def backward_delta(
    out, do, lse, cu_seqlens_q=None, max_seqlen_q=None, dlse=None, dlse_scale=1.0
) -> torch.Tensor:
    """delta = rowsum(dO * O) in fp32, laid out like lse (the backward's preprocess; dense or varlen).

    dlse: the loss's gradient with respect to lse (shaped like it), when the loss uses lse; it is
    subtracted, times dlse_scale (LOG2E for a base-2 lse's gradient): the backward computes
    dS = P * (dP - delta), and d lse_i / d s_ij = P_ij adds dlse_i * P_ij to dS_ij."""
    varlen = cu_seqlens_q is not None
    if do.stride(-1) != 1:
        do = do.contiguous()
    if varlen:
        batch, seqlen_q, stride_lb, stride_lh = cu_seqlens_q.numel() - 1, max_seqlen_q, 0, lse.stride(0)
    else:
        batch, seqlen_q, stride_lb, stride_lh = out.shape[0], out.shape[1], lse.stride(0), lse.stride(1)
    nheads, headdim = out.shape[-2], out.shape[-1]
    delta = torch.empty_like(lse)
    pre_m = 32 if INTERPRET else 64
    _launch_preprocess(
        (cdiv(seqlen_q, pre_m), nheads, batch),
        (),
        (out, do, delta, cu_seqlens_q, *token_strides(out, varlen), *token_strides(do, varlen), stride_lb,
         stride_lh, seqlen_q),
        dict(HEAD_DIM=headdim, BLOCK_D=padded_head_dim(headdim), IS_VARLEN=varlen,
             WIDE=wide_offsets((out, do), max_seqlen_q if varlen else None), BLOCK_M=pre_m),
    )  # fmt: skip
    if dlse is not None:
        delta.sub_(dlse, alpha=dlse_scale)  # in place: keeps lse's layout, which the kernels index it by
    return delta


def _check_grad_buffers(kind, bufs, like, dtype=None, optional=()):
    """Each of a launcher's (dq, dk, dv) buffers is shaped like q, k, v, in `dtype` (None: the input's),
    with a unit last stride; the names in `optional` may be None."""
    for name, buf, t in zip(("dq", "dk", "dv"), bufs, like, strict=True):
        if buf is None and name in optional:
            continue
        want = dtype or t.dtype
        if buf is None or buf.dtype != want or buf.shape != t.shape or buf.stride(-1) != 1:
            got = "None" if buf is None else f"{buf.dtype} {tuple(buf.shape)} strides {buf.stride()}"
            want_name = "fp32" if want == torch.float32 else str(want)
            raise ValueError(
                f"{kind} {name} must be {want_name} {tuple(t.shape)} with a unit last stride, got {got}"
            )


# A deterministic GQA call that the ordered one-kernel backward refuses at its group (causal with more
# than ORDERED_CAUSAL_MAX_GROUP query heads a key head, full attention's key groups past
# ORDERED_ROTATION_MAX_GROUP) but would take as MHA runs it as MHA: each query head's program reads K and V
# of its kv head (`_attn_bwd_fused_hopper`'s kv_repeat; until session 77 K and V were repeated per query head
# in memory first) and stores its own dK / dV, each kv head's the sum of its query heads' after (as
# FlashAttention-2 does for GQA), instead of the two deterministic kernels. One H200, d128, 32 query heads on
# 8, 16k tokens a call (one sequence past that), three alternating rounds, fwd+bwd against the two kernels,
# with the repeat in memory (results/s74/call2, call6): 1.02 / 1.05 / 1.09 / 1.07x at causal 8k / 16k / 32k /
# 64k, 1.03-1.06x at full 4k-16k, level (0.997) at causal 4k; against SDPA cuDNN 0.99-1.05x, where the two
# kernels gave 0.96-1.01. (Full attention past 16.9k keys takes the ordered kernel's convoy under GQA
# itself.) Reading K / V in place (session 77), fwd+bwd after ÷ before, four alternating processes
# (results/s77/call1): 0.916 / 0.964 / 0.982 at causal 4k / full 4k / causal 16k; against cuDNN, four rounds
# (call2): causal 4k / 8k 1.069 / 1.080x, full 4k / 8k 1.059 / 1.037x. Under 4k keys (call2, call3): full
# attention at 2k / 3k 1.017-1.034 / 1.060-1.067x faster than the two kernels (on 8 and on 4 kv heads), but
# at full 1k 0.96x and causal 2k 0.99x: the sums and the per-head dK / dV a larger share of a shorter call.
# The sums in one pass at copy bandwidth (`_grad_sums`; torch.sum ran at 0.35-0.6 of it): 0.984 / 0.982x the
# time at causal / full 4k (results/s78/call1), and the route then ran 0.981 / 0.960x the two kernels' time at
# causal 2k / 3k, 0.960 / 0.930x at full 1k / 1.5k (five alternating rounds, s78/call2): floors 2048 causal
# (where the ordered kernel's causal range starts, ORDERED_CAUSAL_FROM), 1024 full.
# It holds dK and dV at the query's head count meanwhile (2 x q's size: 1 GiB at 64k x 32 heads of 128), so
# from ORDERED_GQA_EXPANDED_MIN_KEYS (causal; _FULL: full attention) to _MAX_KEYS, the lengths measured.
ORDERED_GQA_EXPANDED = True
ORDERED_GQA_EXPANDED_MIN_KEYS = 2048
ORDERED_GQA_EXPANDED_MIN_KEYS_FULL = 1024
ORDERED_GQA_EXPANDED_MAX_KEYS = 65536
# Query heads a program of that route takes (`route_kernel_group`): 2 with full attention under
# ORDERED_GQA_PAIRS_BELOW keys (the ordered kernel's GQA at 2 query heads a key head: K / V read once for
# both, half the per-head dK / dV written and summed), else 1 (MHA). One H200, 32 query heads on 8, fwd+bwd,
# 2 ÷ 1, two runs of four and five alternating rounds (results/s77/call5, call6): full 2k / 3k / 4k / 6k / 8k
# 0.973-0.980 / 0.973 / 0.972-0.976 / 0.985 / 1.000, causal 4k / 6k / 8k 0.984-0.999 / 1.000 / 1.009.
ORDERED_GQA_PAIRS_BELOW = 8192
# FLASHTRAIN_GQA_KERNEL_GROUP (A/B runs) fixes it at every length (None: the rule)
ORDERED_GQA_KERNEL_GROUP = _flash_bwd_fused_hopper._positive_int_setting(
    "FLASHTRAIN_GQA_KERNEL_GROUP", "query heads", None
)


def route_kernel_group(causal: bool, seqlen_k: int) -> int:
    """Query heads a program of the GQA route run as MHA takes (see ORDERED_GQA_PAIRS_BELOW)."""
    if ORDERED_GQA_KERNEL_GROUP is not None:
        return ORDERED_GQA_KERNEL_GROUP
    return 2 if not causal and seqlen_k < ORDERED_GQA_PAIRS_BELOW else 1


def _route_programs_heads(q, k, causal: bool, group: int, sms: int) -> int | None:
    """Query heads a program of the GQA route takes in this deterministic call of group query heads a key
    head that the ordered kernel refused: `route_kernel_group`'s, else 1, the first that divides group and
    that the ordered kernel takes; None where the route does not run (out of `gqa_route_at`'s range, or
    neither)."""
    if group == 1 or not gqa_route_at(k.shape[1], causal):
        return None
    for heads in dict.fromkeys((route_kernel_group(causal, k.shape[1]), 1)):
        if (
            heads < group
            and group % heads == 0
            and _flash_bwd_fused_hopper.supports_ordered(
                q.shape[-1], causal, q.shape[1], k.shape[1], heads, sms
            )
        ):
            return heads
    return None


def gqa_route_at(seqlen_k: int, causal: bool) -> bool:
    """Whether a GQA call of seqlen_k keys is in the range of the backward's route run as MHA (on,
    and ORDERED_GQA_EXPANDED_MIN_KEYS, or _MIN_KEYS_FULL without causal, to _MAX_KEYS); where it runs, the
    ordered kernel's rule decides too."""
    floor = ORDERED_GQA_EXPANDED_MIN_KEYS if causal else ORDERED_GQA_EXPANDED_MIN_KEYS_FULL
    return ORDERED_GQA_EXPANDED and floor <= seqlen_k <= ORDERED_GQA_EXPANDED_MAX_KEYS


def flash_attn_backward(
    do, q, k, v, out, lse, *, sm_scale, win_left, win_right, key_padding_mask, dropout_p, seed,
    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, atomic_dq=False,
    dropout_rows=None, grads_into=None, only=None, delta=None, add_dkdv=True, dlse2=None, grads_out=None,
):  # fmt: skip
    """Gradients (dq, dk, dv) given the forward's saved out and base-2 lse (same layouts as the forward).

    atomic_dq: compute dq inside the dk/dv kernel with fp32 atomics (no separate dq kernel);
    nondeterministic summation order, so only on request, and never while
    `torch.use_deterministic_algorithms(True)` is on: the deterministic kernels then run (torch's rule
    for an op that has them).
    grads_into: dense only, fp32 (dq, dk, dv) buffers shaped like q, k, v (unit last strides) that the
        gradients are added to in place (ring attention's per-step accumulation, without materializing
        the step's gradients); returns them.
    only: with grads_into, "dkdv" or "dq" runs that kernel alone: the ring backward sends a step's
        dK/dV on before its dq kernel runs. Pass both halves the same `delta` to preprocess once.
        With only="dq", grads_into's dk and dv may be None.
    add_dkdv: with grads_into, False stores dK/dV into its buffers (every row) instead of adding to
        them, so a fresh fp32 buffer needs no zero fill; dq is added either way.
    delta: `backward_delta(out, do, lse, ...)` computed beforehand; None computes it here.
    dlse2: the gradient of the loss with respect to the base-2 lse (shaped like it), or None when the
        loss does not use lse; with a precomputed delta, pass it to `backward_delta` instead.
    grads_out: (dq, dk, dv) tensors shaped like q, k, v, in their dtype, with unit last strides, that the
        gradients are stored into (any other strides: the packed-QKV path passes three views of one
        gradient buffer, so the projection's gradient needs no concatenation); returns them.
    """
    if only not in (None, "dkdv", "dq"):
        raise ValueError(f"only must be None, 'dkdv' or 'dq', got {only!r}")
    if only is not None and grads_into is None:
        raise ValueError(
            "only= runs half of the backward: it needs grads_into, the buffers that half adds to"
        )
    if grads_into is not None and grads_out is not None:
        raise ValueError("pass grads_into (add to fp32 buffers) or grads_out (store), not both")
    varlen = cu_seqlens_q is not None
    if do.stride(-1) != 1:
        do = do.contiguous()
    # checked when the kernels launch, as torch checks its own ops (the switch may change between the
    # forward and the backward)
    atomic_dq = atomic_dq and not torch.are_deterministic_algorithms_enabled()
    accumulate = grads_into is not None
    if accumulate:
        if varlen or atomic_dq:
            raise ValueError("grads_into takes a dense, deterministic call (no varlen, no atomic_dq)")
        _check_grad_buffers(
            "grads_into", grads_into, (q, k, v), torch.float32, ("dk", "dv") if only == "dq" else ()
        )
        dq, dk, dv = grads_into
    elif grads_out is not None:
        _check_grad_buffers("grads_out", grads_out, (q, k, v))
        dq, dk, dv = grads_out
    else:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    hopper_kw = dict(
        win_left=win_left, win_right=win_right, key_padding_mask=key_padding_mask, dropout_p=dropout_p,
        varlen=varlen,
    )  # fmt: skip
    # Hopper, atomic dq asked for: the one-kernel backward (dQ added per step in fp32, 5 products instead
    # of 7) where it measured faster than the deterministic Gluon kernels (`_flash_bwd_fused_hopper.supports`);
    # elsewhere the deterministic route, dK/dV on the Gluon kernel, faster than the portable atomic variant
    # (d64, whose dq kernel is the portable one: fwd+bwd 0.90-1.00x cuDNN against the atomic variant's
    # 0.77-0.84x on one H100, results/s43/call1)
    dkdv_ok = (
        only is None and not accumulate and _flash_dkdv_hopper.supports(q, k, v, do, dk, dv, **hopper_kw)
    )
    causal, group, sms = win_right == 0, q.shape[-2] // k.shape[-2], sm_count(q.device)
    fused = False
    if atomic_dq and dkdv_ok:  # (unless the ordered kernel takes the call and is the faster one there)
        fused = (
            _flash_bwd_fused_hopper.ENABLED
            and _flash_bwd_fused_hopper.supports(q.shape[-1], causal, q.shape[1])
            and not _flash_bwd_fused_hopper.ordered_is_faster(
                q.shape[-1], causal, q.shape[1], k.shape[1], group, sms
            )
        )
        atomic_dq = fused
    # deterministic: the one-kernel backward with each dq tile's adds in one fixed order, where it takes the call
    ordered = (
        not atomic_dq
        and dkdv_ok
        and _flash_bwd_fused_hopper.supports_ordered(q.shape[-1], causal, q.shape[1], k.shape[1], group, sms)
    )
    # GQA the ordered kernel refuses at its group but takes at fewer query heads a program (`route_kernel_group`,
    # else 1: as MHA): each program reads its kv head's K / V, its dK / dV (dk_heads, dv_heads: kv_repeat x
    # k's heads) summed into dk, dv after (see ORDERED_GQA_EXPANDED)
    kv_repeat, dk_heads, dv_heads = 1, dk, dv
    kernel_group = (
        None if atomic_dq or ordered or not dkdv_ok else _route_programs_heads(q, k, causal, group, sms)
    )
    if kernel_group is not None:
        kv_repeat, group, ordered = group // kernel_group, kernel_group, True
        per_program_head = (*k.shape[:-2], k.shape[-2] * kv_repeat, k.shape[-1])
        dk_heads, dv_heads = k.new_empty(per_program_head), v.new_empty(per_program_head)
    fused = fused or ordered
    # (.., H, D) fp32 accumulator of the one-kernel backward (ordered: one per key group) and the atomic variant
    convoy = ordered and _flash_bwd_fused_hopper.ordered_convoy(q.shape[1], k.shape[1], causal, group, sms)
    key_groups = _flash_bwd_fused_hopper.ordered_dq_groups(k.shape[1], causal, convoy, sms) if ordered else 1
    dq_acc = None
    first_stores = ordered and _flash_bwd_fused_hopper.FIRST_STORES
    if atomic_dq or ordered:  # (first stores: zeros only where no program adds)
        dq_acc = _flash_bwd_fused_hopper.dq_buffer(q, k.shape[1], causal, key_groups, first_stores)
    if varlen:
        batch = cu_seqlens_q.numel() - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        stride_lb, stride_lh = 0, lse.stride(0)
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
    nheads, headdim = q.shape[-2], q.shape[-1]
    nheads_kv = k.shape[-2]
    block_d = padded_head_dim(headdim)
    # the plain call computes delta in the dq kernel, which then runs first (see _bwd_dq's DELTA_HERE)
    delta_here = delta is None and dlse2 is None and only is None and not atomic_dq and not ordered
    if delta_here:
        delta = torch.empty_like(lse)
    elif delta is None:
        delta = backward_delta(out, do, lse, cu_seqlens_q, max_seqlen_q, dlse=dlse2, dlse_scale=LOG2E)
    elif dlse2 is not None:
        raise ValueError("with a precomputed delta, pass dlse2 to backward_delta, which folds it into delta")

    # Hopper: the warp-specialised dq kernel (which writes delta too), then the dK/dV kernel reading it
    hopper_dq = delta_here and not accumulate and _flash_dq_hopper.supports(q, k, v, do, out, dq, **hopper_kw)
    hopper_dkdv = dkdv_ok and not atomic_dq
    if fused:
        _flash_bwd_fused_hopper.flash_attn_bwd_fused_hopper(
            q, k, v, do, lse, delta, dq_acc, dk_heads, dv_heads, sm_scale=sm_scale, causal=causal,
            ordered=ordered, key_groups=key_groups, convoy=convoy, first_stores=first_stores, kv_repeat=kv_repeat,
        )  # fmt: skip
        if kv_repeat > 1:  # (each in the inputs' dtype, summed in fp32 in a fixed order, rounded once more)
            sum_head_groups(dk_heads, dk)
            sum_head_groups(dv_heads, dv)
        # (the kernel added dQ times the softmax scale)
        _flash_bwd_fused_hopper.sum_dq_buffers(dq_acc, dq, k.shape[1], causal, key_groups)
        return dq, dk, dv
    if hopper_dq:
        # (the dK/dV kernel, next, may start under the dq kernel's end: `_flash_dkdv_hopper.dependent_after_dq`)
        dependent = hopper_dkdv and _flash_dkdv_hopper.dependent_after_dq(q)
        _flash_dq_hopper.flash_attn_dq_hopper(q, k, v, do, out, lse, delta, dq, sm_scale=sm_scale, causal=causal,
                                              dependent_dkdv=dependent)  # fmt: skip
        if hopper_dkdv:  # (before the portable kernels' argument set-up: this route is host-bound when short)
            _flash_dkdv_hopper.flash_attn_dkdv_hopper(
                q, k, v, do, dk, dv, lse, delta, sm_scale=sm_scale, causal=causal, dependent=dependent
            )
            return dq, dk, dv

    kpm = key_padding_mask.view(torch.uint8) if key_padding_mask is not None else None
    kpm_args = (kpm if kpm is not None else lse,)
    kpm_strides = (kpm.stride(0), kpm.stride(1)) if kpm is not None else (0, 0)
    drop = dropout_row_ids(dropout_rows, stride_lb, stride_lh)
    scalars = (
        seqlen_q, seqlen_k, nheads // nheads_kv,
        sm_scale, sm_scale * 1.4426950408889634, win_left or 0, win_right or 0, dropout_p, seed,
        *drop, tune_bucket(seqlen_q), sched_slots_for(q.device, win_right is not None),
    )  # fmt: skip
    meta = dict(
        HEAD_DIM=headdim, BLOCK_D=block_d, IS_VARLEN=varlen, HAS_LEFT=win_left is not None,
        HAS_RIGHT=win_right is not None, HAS_KPM=kpm is not None,
        DROPOUT=dropout_mode(dropout_p, col0=drop[3], varlen=varlen), DOT_PREC=dot_precision(q.dtype),
        WIDE=wide_offsets((q, k, v, do, out, dq, dk, dv, dq_acc), max(seqlen_q, seqlen_k) if varlen else None),
    )  # fmt: skip
    strides_qkv_do = tuple(s for t in (q, k, v, do) for s in token_strides(t, varlen))
    # dq runs first: with DELTA_HERE it writes the delta the dk/dv kernel reads (otherwise the order is free)
    if not hopper_dq and only != "dkdv" and not atomic_dq:
        grid_q = lambda m: (cdiv(seqlen_q, m["BLOCK_M"]), nheads, batch)  # noqa: E731
        _bwd_dq_tuned[grid_q](
            q, k, v, do, dq, lse, delta, *kpm_args, cu_seqlens_q, cu_seqlens_k, out if delta_here else lse,
            *strides_qkv_do, *token_strides(dq, varlen), *(token_strides(out, varlen) if delta_here else (0, 0, 0)),
            stride_lb, stride_lh, *kpm_strides, *scalars, ACCUMULATE=accumulate, DELTA_HERE=delta_here, **meta,
        )  # fmt: skip
    if hopper_dkdv:  # (after the portable dq kernel, whose delta it reads)
        _flash_dkdv_hopper.flash_attn_dkdv_hopper(
            q, k, v, do, dk, dv, lse, delta, sm_scale=sm_scale, causal=causal
        )
        return dq, dk, dv
    grid_kv = lambda m: (cdiv(seqlen_k, m["BLOCK_N"]), nheads_kv, batch)  # noqa: E731
    dq_strides = token_strides(dq_acc, varlen) if atomic_dq else (0, 0, 0)
    # wide heads: dv and dk in two passes, each holding one fp32 accumulator (see SPLIT_DKDV_ABOVE)
    for part in () if only == "dq" else (1, 2) if block_d > SPLIT_DKDV_ABOVE else (0,):
        (_bwd_dkdv_atomic_tuned if atomic_dq else _bwd_dkdv_tuned)[grid_kv](
            q, k, v, do, dk, dv, dq_acc, lse, delta, *kpm_args, cu_seqlens_q, cu_seqlens_k,
            *strides_qkv_do,
            *token_strides(dk, varlen), *token_strides(dv, varlen), *dq_strides,
            stride_lb, stride_lh, *kpm_strides, *scalars, ATOMIC_DQ=atomic_dq, ACCUMULATE=accumulate and add_dkdv,
            PART=part,
            **meta,
        )  # fmt: skip
    if atomic_dq:  # into dq as allocated above (q's dtype) or passed in grads_out
        dq.copy_(dq_acc * sm_scale)
    return dq, dk, dv
