"""FlashAttention forward kernel (dense and varlen through one kernel), its autotune configs and launcher.

Layout: q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_kv, headdim), any strides with
a unit last stride; varlen packs sequences as (total, nheads, headdim) and reads each sequence's start
from cu_seqlens. The kernel keeps scores in base 2 (scale folded with log2(e)) and writes the base-2
lse; the public API converts it to natural log.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _flash_fwd_hopper
from ._common import (
    INTERPRET,
    autotune,
    cdiv,
    dot_precision,
    dropout_keep_tile,
    dropout_mode,
    load_tile,
    mask_scores,
    next_power_of_2,
    padded_head_dim,
    sched_slots_for,
    store_tile,
    tile_program_ids,
    token_strides,
    varlen_bounds,
    visible_range,
    wide_offsets,
    widen,
)


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q,
    K, V, KPM, stride_kn, stride_vn, stride_kpmn,
    pos_m, rng_rows, offs_d,
    seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, drop_col0,
    lo, full_lo, full_hi, hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Key tiles [lo, hi) as `visible_range` splits them: [lo, full_lo) (a window's edge) and [full_hi, hi)
    (the diagonal, the sequence's tail) pay for bounds/causal/window masks; the run between does not.
    (The row strides come in as the caller's build has them: int64 in a WIDE build, `_common.widen`.)"""
    for run in tl.static_range(3):  # (unrolled: three loops, MASKED known in each)
        start = lo if run == 0 else full_lo if run == 1 else full_hi
        stop = full_lo if run == 0 else full_hi if run == 1 else hi
        for start_n in range(start, stop, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(
                acc, l_i, m_i, q, K, V, KPM, stride_kn, stride_vn, stride_kpmn, pos_m, rng_rows, offs_d,
                seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, drop_col0, start_n,
                run != 1, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(
    acc, l_i, m_i, q,
    K, V, KPM, stride_kn, stride_vn, stride_kpmn,
    pos_m, rng_rows, offs_d,
    seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, drop_col0,
    start_n,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """The online softmax over the key tile at start_n: the running (acc, l_i, m_i) updated."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_tile(K + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, offs_d, seqlen_k,
                  HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
    # raw scores; the scale is applied to each row's max and folded into the exp2's argument (one FMA),
    # which saves a multiply per score in a loop bound by instruction issue (NOTES_attention.md,
    # "Loop experiments")
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)  # (BLOCK_M, BLOCK_N)
    qk = mask_scores(
        qk, offs_n, pos_m, seqlen_k, win_left, win_right, KPM, stride_kpmn, MASKED, HAS_LEFT, HAS_RIGHT, HAS_KPM
    )  # fmt: skip
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # base 2; qk_scale > 0 keeps the max the max
    if MASKED or HAS_KPM:
        # a row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN
        m_ij_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    else:
        m_ij_safe = m_ij
    p = tl.math.exp2(qk * qk_scale - m_ij_safe[:, None])
    alpha = tl.math.exp2(m_i - m_ij_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        # the softmax denominator counts dropped entries; only the P @ V product loses them
        p = tl.where(
            dropout_keep_tile(seed, rng_rows, drop_col0 + start_n, dropout_p, BLOCK_N, DROPOUT), p, 0.0
        )
    v = load_tile(V + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, offs_d, seqlen_k,
                  HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # fmt: skip
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
    return acc, l_i, m_ij


@triton.jit
def _attn_fwd(
    Q, K, V, O, LSE, KPM, CU_Q, CU_K,  # noqa: E741
    # strides (the head dim's is 1)
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh,
    stride_kpmb, stride_kpmn,
    # sizes: seqlen_q/seqlen_k are per batch (dense) or the maxima (varlen)
    seqlen_q, seqlen_k, group,
    # scalars
    qk_scale, win_left, win_right, dropout_p, seed,
    drop_sb, drop_sh, drop_row0, drop_col0,  # dropout row ids: b * drop_sb + h * drop_sh + drop_row0 + row
    tune_seqlen,  # autotune key only
    sched_slots,  # the program order (`_common.tile_program_ids`)
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PREC: tl.constexpr, MERGE: tl.constexpr, WIDE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """MERGE: O and LSE hold a running fp32 (out, natural-log lse) over other keys, and this call's
    attention is merged into them through the log-sum-exp (ring attention's per-step update).
    WIDE: rows and heads offset in 64 bits (a sequence past 2**31 elements, `_common.widen`)."""
    stride_qm, stride_qh = widen(stride_qm, WIDE), widen(stride_qh, WIDE)
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    stride_om, stride_oh = widen(stride_om, WIDE), widen(stride_oh, WIDE)
    pid_m, n_tiles, off_h, off_b = tile_program_ids(sched_slots)
    if HAS_RIGHT:
        # causal-like: the last row blocks see the most keys, so start them first to shorten the tail
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
    q_base = Q + off_b64 * stride_qb + q_start * stride_qm + off_h * stride_qh
    k_base = K + off_b64 * stride_kb + k_start * stride_kn + off_hk * stride_kh
    v_base = V + off_b64 * stride_vb + k_start * stride_vn + off_hk * stride_vh
    o_base = O + off_b64 * stride_ob + q_start * stride_om + off_h * stride_oh
    kpm_base = KPM + off_b64 * stride_kpmb

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    pos_m = offs_m + (seqlen_k - seqlen_q)  # bottom-right aligned key position of each query
    lse_rows = off_b64 * stride_lb + off_h * stride_lh + q_start + offs_m
    rng_rows = off_b64 * drop_sb + off_h * drop_sh + drop_row0 + q_start + offs_m
    rng_col0 = drop_col0 + k_start  # varlen: keys are numbered by their packed index
    q = load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, offs_d, seqlen_q,
                  HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # fmt: skip

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    last_row = tl.minimum((pid_m + 1) * BLOCK_M, seqlen_q) - 1
    lo, full_lo, full_hi, hi = visible_range(
        pid_m * BLOCK_M + (seqlen_k - seqlen_q), last_row + (seqlen_k - seqlen_q), seqlen_k,
        -win_left, win_right, BLOCK_N, HAS_LEFT, HAS_RIGHT,
    )  # fmt: skip
    # masked tiles left of the fully visible run (window edge), the run itself, then the diagonal/tail
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, kpm_base, stride_kn, stride_vn, stride_kpmn,
        pos_m, rng_rows, offs_d, seqlen_k, win_left, win_right, qk_scale, dropout_p, seed, rng_col0,
        lo, full_lo, full_hi, hi, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_KPM, DROPOUT, DOT_PREC,
    )  # fmt: skip

    # rows that saw no key: out = 0 (acc is 0) and lse = -inf, never 0/0
    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    if DROPOUT:
        acc = acc * (1.0 / (1.0 - dropout_p))
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :]
    if MERGE:
        acc, lse = _merge_partial(acc, lse, o_ptrs, LSE + lse_rows, offs_m, offs_d, seqlen_q, HEAD_DIM,
                                  BLOCK_D != HEAD_DIM)  # fmt: skip
    tl.store(LSE + lse_rows, lse, mask=offs_m < seqlen_q)
    store_tile(o_ptrs, acc.to(O.dtype.element_ty), offs_m, offs_d, seqlen_q, HEAD_DIM)


@triton.jit
def _merge_partial(acc, lse2, o_ptrs, lse_ptrs, offs_m, offs_d, seqlen_q, HEAD_DIM: tl.constexpr,
                   PAD_D: tl.constexpr):  # fmt: skip
    """(out, natural lse) of the running accumulator at o_ptrs/lse_ptrs merged with this call's
    normalized acc and base-2 lse2. Weights 2^(lse - new) are <= 1, so nothing overflows, and a side
    with lse = -inf gets weight exactly 0 (a call that saw no key changes nothing)."""
    old2 = tl.load(lse_ptrs, mask=offs_m < seqlen_q, other=float("-inf")) * 1.4426950408889634
    top = tl.maximum(old2, lse2)
    top_safe = tl.where(top == float("-inf"), 0.0, top)  # rows nobody has reached yet
    w_old = tl.math.exp2(old2 - top_safe)
    w_new = tl.math.exp2(lse2 - top_safe)
    total = w_old + w_new
    total_safe = tl.where(total > 0.0, total, 1.0)
    out_old = load_tile(o_ptrs, offs_m, offs_d, seqlen_q, HEAD_DIM, True, PAD_D)
    out = out_old * (w_old / total_safe)[:, None] + acc * (w_new / total_safe)[:, None]
    lse = tl.where(total > 0.0, top_safe + tl.math.log2(total_safe), float("-inf"))
    return out, lse * 0.6931471805599453  # the accumulator keeps the natural log


# ---------------------------------------------------------------------------------------------------
# autotune configs
# ---------------------------------------------------------------------------------------------------


def _smem_limit() -> int:
    if INTERPRET or not torch.cuda.is_available():
        return 1 << 30
    major, _ = torch.cuda.get_device_capability()
    return {9: 227 * 1024, 8: 163 * 1024}.get(major, 99 * 1024)


def fwd_configs() -> list[triton.Config]:
    if INTERPRET:
        # the interpreter runs one fixed small config; 32-wide tiles still give several tiles per row
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    # the last two fit head dim 256 (shared memory, registers); the prune function picks what fits
    shapes = [
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 4, 3), (64, 64, 4, 3),
        (64, 32, 4, 2), (128, 32, 8, 2),
    ]  # fmt: skip
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


def prune_configs(configs, named_args, rows_key, cols_key, acc_rows_key, n_acc, **kwargs):
    """Drop configs whose tiles overflow shared memory or registers, or dwarf the sequence.

    acc_rows_key names the tile dim of the fp32 accumulators (n_acc of them, BLOCK_D wide), which must
    stay at <= 128 registers a thread to avoid spills; shared memory counts Q (or K/V) once and the
    streamed tiles once per pipeline stage.
    """
    args = {**named_args, **kwargs}
    block_d = args["BLOCK_D"]
    elt = 4 if args["DOT_PREC"] == "ieee" else 2
    seq_rows = next_power_of_2(args[rows_key])
    seq_cols = next_power_of_2(args[cols_key])
    kept = []
    for c in configs:
        bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        rows, cols = (bm, bn) if rows_key.endswith("q") else (bn, bm)
        smem = (rows * block_d * 2 + c.num_stages * cols * block_d * 2) * elt
        regs = n_acc * c.kwargs[acc_rows_key] * block_d / (32 * c.num_warps)
        if smem > _smem_limit() or regs > 128:
            continue
        if rows > max(seq_rows, 64) or cols > max(seq_cols, 32):
            continue
        kept.append(c)
    if args["DOT_PREC"] == "ieee":
        # fp32 inputs are for tests against a float64 reference: built, not raced. ptxas is slow on exact
        # fp32 dots: the 25 configs of one fp32 windowed GQA call took 293 s to build for sm_90 on 2 CPU
        # cores (`check_kernel_builds.py --cases fp32_window_gqa`), and such tests ran past 150 s on an
        # H200 machine. So those calls tune over the two cheapest tiles that fit.
        kept = sorted(kept, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages))[:2]
    # Keep at least two candidates: the autotuner compiles a lone config outside its guard, while
    # with two it treats a config whose compile fails as infinitely slow and takes the other. ptxas
    # (CUDA 13, H200) crashed with SIGSEGV on some configs of these kernels: once inside an autotune
    # run, which went on with another config, and once fatally in a short-sequence ring test (the
    # forward's 32-wide key tiles at head dims <= 32, since dropped in `_prune_fwd`).
    spare = sorted(
        (c for c in configs if c not in kept), key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]
    )
    return kept + spare[: max(0, 2 - len(kept))]


def without_narrow_key_tiles(configs, block_d: int):
    """Triton 3.6's ptxas (CUDA 13) dies with SIGSEGV building the forward and the dq kernel for sm_90
    with 32-wide key tiles at head dims 16 and 32 (`check_kernel_builds.py`, cases dense_d16 / dense_d32;
    dq since the program order moved into `tile_program_ids`); with keys of <= 32 both surviving forward
    candidates were such tiles, so the call failed. Drops those tiles at such head dims (the
    interpreter's one config stays)."""
    if block_d > 32:
        return configs
    return [c for c in configs if c.kwargs["BLOCK_N"] > 32] or configs


def _prune_fwd(configs, named_args, **kwargs):
    configs = without_narrow_key_tiles(configs, {**named_args, **kwargs}["BLOCK_D"])
    return prune_configs(configs, named_args, "seqlen_q", "seqlen_k", "BLOCK_M", 1, **kwargs)


_TUNE_KEY = [
    "HEAD_DIM",
    "tune_seqlen",
    "IS_VARLEN",
    "HAS_LEFT",
    "HAS_RIGHT",
    "HAS_KPM",
    "DROPOUT",
    "DOT_PREC",
    "MERGE",  # forward only
    "WIDE",  # (a WIDE build is tuned apart: its timings should not pick the usual build's tiles)
    "ACCUMULATE",  # backward only
]
# MERGE updates O and LSE in place, so the autotuner's trial runs put them back (a copy made only
# while tuning a key; MERGE is part of the key)
_attn_fwd_tuned = autotune(
    _attn_fwd, configs=fwd_configs(), key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune_fwd},
    restore_value=["O", "LSE"],
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------


def dropout_row_ids(dropout_rows, stride_lb: int, stride_lh: int) -> tuple[int, int, int, int]:
    """Kernel args (drop_sb, drop_sh, drop_row0, drop_col0) numbering the dropout Philox counters (rows, columns).

    Row id of (batch b, head h, query i) = b * drop_sb + h * drop_sh + drop_row0 + i, key j's column
    drop_col0 + j; i and j count from the start of the packed tensors for varlen (b is then the
    sequence). By default the lse index (dense: (b * nheads + h) * seqlen_q + i) and j. The ring
    passes dropout_rows = (sb, sh, row0, col0) giving the row id the whole sequence would have, so the
    mask of a sequence shard is the single-process mask's block.
    """
    return tuple(dropout_rows) if dropout_rows is not None else (stride_lb, stride_lh, 0, 0)


def tune_bucket(seqlen: int) -> int:
    """Sequences re-tune per power of two up to 8k; longer ones share the 8k choice."""
    return min(next_power_of_2(seqlen), 8192)


def flash_attn_forward(
    q, k, v, *, sm_scale, win_left, win_right, key_padding_mask, dropout_p, seed,
    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_rows=None,
    merge_into=None,
):  # fmt: skip
    """Launch the forward. Inputs are already checked. Returns (out, lse2) with lse2 in base 2.

    Dense: q (B, Sq, H, D), lse2 (B, H, Sq). Varlen: q (Tq, H, D), lse2 (H, Tq).
    dropout_rows: see `dropout_row_ids` (None: the rows' lse indices, the public API's numbering).
    merge_into: dense only, (out_acc, lse_acc): a running fp32 out (B, Sq, H, D) and natural-log fp32
        lse (B, H, Sq) over other keys (unit last strides); this call's attention is merged into them
        in place (ring attention's step update, without materializing the step's out) and None returned.
    """
    varlen = cu_seqlens_q is not None
    if _flash_fwd_hopper.supports(
        q, k, v, win_left=win_left, win_right=win_right, key_padding_mask=key_padding_mask,
        dropout_p=dropout_p, varlen=varlen, merge=merge_into is not None,
    ):  # fmt: skip
        return _flash_fwd_hopper.flash_attn_forward_hopper(q, k, v, sm_scale=sm_scale, causal=win_right == 0)
    if merge_into is not None:
        out_acc, lse_acc = merge_into
        if varlen or out_acc.dtype != torch.float32 or lse_acc.dtype != torch.float32:
            raise ValueError("merge_into takes fp32 (out, lse) accumulators of a dense (not varlen) call")
        if out_acc.shape != q.shape or lse_acc.shape != (q.shape[0], q.shape[2], q.shape[1]):
            raise ValueError(
                f"merge_into shapes {tuple(out_acc.shape)}, {tuple(lse_acc.shape)} do not match q {tuple(q.shape)}"
            )
        if out_acc.stride(-1) != 1 or lse_acc.stride(-1) != 1:
            raise ValueError("merge_into accumulators need a unit last stride")
    if varlen:
        batch = cu_seqlens_q.numel() - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        lse = torch.empty(q.shape[1], q.shape[0], device=q.device, dtype=torch.float32)  # (H, Tq)
        stride_lb, stride_lh = 0, lse.stride(0)
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        seqlen_k = k.shape[1]
        if merge_into is None:
            lse = torch.empty(batch, q.shape[2], seqlen_q, device=q.device, dtype=torch.float32)  # (B, H, Sq)
        else:
            lse = lse_acc
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
    nheads, headdim = q.shape[-2], q.shape[-1]
    out = torch.empty_like(q) if merge_into is None else out_acc
    kpm = key_padding_mask.view(torch.uint8) if key_padding_mask is not None else None
    drop = dropout_row_ids(dropout_rows, stride_lb, stride_lh)
    drop_mode = dropout_mode(dropout_p, col0=drop[3], varlen=varlen)  # drop: (sb, sh, row0, col0)
    grid = lambda meta: (cdiv(seqlen_q, meta["BLOCK_M"]), nheads, batch)  # noqa: E731
    _attn_fwd_tuned[grid](
        q, k, v, out, lse, kpm if kpm is not None else lse, cu_seqlens_q, cu_seqlens_k,
        *token_strides(q, varlen), *token_strides(k, varlen), *token_strides(v, varlen), *token_strides(out, varlen),
        stride_lb, stride_lh,
        kpm.stride(0) if kpm is not None else 0, kpm.stride(1) if kpm is not None else 0,
        seqlen_q, seqlen_k, nheads // k.shape[-2],
        sm_scale * 1.4426950408889634, win_left or 0, win_right or 0, dropout_p, seed,
        *drop, tune_bucket(seqlen_q), sched_slots_for(q.device, win_right is not None),
        HEAD_DIM=headdim, BLOCK_D=padded_head_dim(headdim), IS_VARLEN=varlen,
        HAS_LEFT=win_left is not None, HAS_RIGHT=win_right is not None, HAS_KPM=kpm is not None,
        DROPOUT=drop_mode, DOT_PREC=dot_precision(q.dtype), MERGE=merge_into is not None,
        WIDE=wide_offsets((q, k, v, out), max(seqlen_q, seqlen_k) if varlen else None),
    )  # fmt: skip
    return (out, lse) if merge_into is None else None
