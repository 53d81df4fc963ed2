"""Flash-Decoding: a few new queries against a long KV cache (inference only, no backward).

With one query per sequence the FlashAttention grid has only batch x nheads programs, far too few to
fill the GPU. So the KV length is split across programs: each computes a partial (out, lse) over its
slice in fp32, and a merge kernel combines them through their log-sum-exps. Under GQA the query heads
of one kv group are packed into the rows of one tile (rows = seqlen_q x group), so each K/V tile is
read once per group instead of once per query head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._common import (
    INTERPRET,
    LOG2E,
    cdiv,
    check_causal,
    check_device,
    check_dtype,
    check_flag,
    check_heads,
    check_rank,
    check_window,
    compute_capability,
    dot_precision,
    exceeds_extent_limit,
    next_power_of_2,
    padded_head_dim,
    resolve_softmax_scale,
    sm_count,
    visible_range,
    wide_offsets,
    widen,
)
from ._flash_fwd import _fwd_inner, _fwd_tile
from ._launch import CompiledLaunch
from .layouts import BlockLayout


@triton.jit
def _decode_split(
    Q, K, V, SEQLENS, OPART, LPART, O, LSE, LAYOUT, TILES, TILE_CNT,  # noqa: E741
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_os, stride_ob, stride_oh, stride_om,
    stride_ls, stride_lb, stride_lh,
    stride_outb, stride_outm, stride_outh,
    seqlen_q, max_len, nheads_kv, group, chunk, num_splits,
    qk_scale, win_left, win_right, stride_lay_h, stride_lay_r, stride_tiles_g, stride_tiles_r, stride_cnt_g,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
    SPARSE: tl.constexpr, PER_HEAD: tl.constexpr, LAYOUT_BM: tl.constexpr, LAYOUT_BN: tl.constexpr,
    WIDE: tl.constexpr,
):  # fmt: skip
    """Partial attention of (query rows of one kv group) x (keys [split * chunk, (split + 1) * chunk));
    with one split, the rows' final out and lse.

    SPARSE: one query per sequence (at the cache's last key), which sees only the key blocks its row of
    the block layout keeps (LAYOUT: int8 (heads or 1, row blocks, column blocks) of LAYOUT_BM x LAYOUT_BN
    blocks). The program walks its share of the row's list of kept key tiles (TILES, TILE_CNT: of the kv
    group's rows, `_decode_tiles`), the list split evenly among the programs (not the positions, which
    left most programs without a kept block and one with the band by the diagonal); no other tile is
    read. PER_HEAD (a pattern per query head): a tile some of the group's heads keep is walked with the
    others' rows masked, by placing their query before every key (the caller makes the call causal,
    which at the last key hides nothing else).

    PDL (launched as a programmatic dependent launch): wait for the previous kernel's writes before reading
    anything, then let the merge kernel launch, so that its programs are in place when this one ends.
    (Letting it launch after the key loop instead measured 0-5% slower, results/s66/call3/.)

    WIDE: the cache's rows and heads offset in 64 bits (one sequence past 2**31 elements, `_common.widen`)."""
    stride_kn, stride_kh = widen(stride_kn, WIDE), widen(stride_kh, WIDE)
    stride_vn, stride_vh = widen(stride_vn, WIDE), widen(stride_vh, WIDE)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    split = tl.program_id(0)
    pid_m = tl.program_id(1)
    off_bh = tl.program_id(2)
    off_b = off_bh // nheads_kv
    off_hk = off_bh % nheads_kv
    off_b64 = off_b.to(tl.int64)
    seqlen_k = tl.minimum(tl.load(SEQLENS + off_b), max_len)

    n_rows = seqlen_q * group
    offs_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # packed row -> (query qi, head g of the group)
    qi = offs_r // group
    off_h = off_hk * group + offs_r % group
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < n_rows
    q = tl.load(
        Q + off_b64 * stride_qb + qi[:, None] * stride_qm + off_h[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    diag = seqlen_k - seqlen_q
    pos_m = qi + diag
    last_row = tl.minimum((pid_m + 1) * BLOCK_M, n_rows) - 1
    lo, full_lo, full_hi, hi = visible_range(
        (pid_m * BLOCK_M) // group + diag, last_row // group + diag, seqlen_k,
        -win_left, win_right, BLOCK_N, HAS_LEFT, HAS_RIGHT,
    )  # fmt: skip
    # intersect with this split's slice; its ends are multiples of BLOCK_N (or the sequence's end)
    # (the dense path's bounds: a SPARSE build walks its list instead, and the compiler drops these)
    s0 = split * chunk
    s1 = s0 + chunk
    lo = tl.maximum(lo, s0)
    hi = tl.maximum(tl.minimum(hi, s1), lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = K + off_b64 * stride_kb + off_hk * stride_kh
    v_base = V + off_b64 * stride_vb + off_hk * stride_vh
    if SPARSE:  # this program's share of the row's kept key tiles, each with its element masks
        r = tl.maximum(seqlen_k - 1, 0) // LAYOUT_BM
        count = tl.where(seqlen_k > 0, tl.load(TILE_CNT + off_hk * stride_cnt_g + r), 0)
        share = tl.cdiv(count, num_splits)
        first = tl.minimum(split * share, count)
        tiles = TILES + off_hk * stride_tiles_g + r * stride_tiles_r
        for e in range(first, tl.minimum(first + share, count)):
            start_n = tl.load(tiles + e) * BLOCK_N
            pos_t = pos_m
            if PER_HEAD:  # the rows of heads that skip the tile's block get their query before every key
                keep = tl.load(
                    LAYOUT + r * stride_lay_r + off_h * stride_lay_h + start_n // LAYOUT_BN, mask=row_ok, other=0
                )  # fmt: skip
                pos_t = tl.where(keep != 0, pos_m, -1)
            acc, l_i, m_i = _fwd_tile(
                acc, l_i, m_i, q, k_base, v_base, None, stride_kn, stride_vn, 0, pos_t, None, offs_d, seqlen_k,
                win_left, win_right, qk_scale, 0.0, 0, 0, start_n,
                True, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, False, False, DOT_PREC,
            )  # fmt: skip
    else:
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_base, v_base, None, stride_kn, stride_vn, 0, pos_m, None, offs_d, seqlen_k,
            win_left, win_right, qk_scale, 0.0, 0, 0, lo, full_lo, full_hi, hi,
            HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, False, False, DOT_PREC,
        )  # fmt: skip
    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    d_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    if num_splits == 1:  # (no partials, no merge kernel)
        tl.store(
            LSE + (off_b64 * nheads_kv * group + off_h) * seqlen_q + qi, lse * 0.6931471805599453, mask=row_ok
        )
        out_off = off_b64 * stride_outb + qi * stride_outm + off_h * stride_outh
        tl.store(O + out_off[:, None] + offs_d[None, :], acc.to(O.dtype.element_ty), mask=d_ok)
    else:
        row_off = split * stride_os + off_b64 * stride_ob + off_h * stride_oh + qi * stride_om
        tl.store(OPART + row_off[:, None] + offs_d[None, :], acc, mask=d_ok)
        tl.store(LPART + split * stride_ls + off_b64 * stride_lb + off_h * stride_lh + qi, lse, mask=row_ok)


@triton.jit
def _decode_merge(
    OPART, LPART, O, LSE, num_splits,  # noqa: E741
    stride_os, stride_ob, stride_oh, stride_om,
    stride_ls, stride_lb, stride_lh,
    stride_qb, stride_qm, stride_qh,
    nheads, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out = sum_s 2^(lse_s - lse) out_s with lse = log2 sum_s 2^lse_s; splits that saw no key weigh 0.
    PDL: launched before the split kernel ends; waits for its partials."""
    if PDL:
        gdc_wait()
    row = tl.program_id(0)  # (b, h, qi) flattened
    qi = row % seqlen_q
    off_h = (row // seqlen_q) % nheads
    off_b = (row // seqlen_q) // nheads
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    base_l = off_b.to(tl.int64) * stride_lb + off_h * stride_lh + qi
    base_o = off_b.to(tl.int64) * stride_ob + off_h * stride_oh + qi * stride_om
    # both loads before the reductions, whose barriers would otherwise hold the partial outputs' load back
    # behind the lse's (sm_90 SASS): one memory latency instead of two. Nsight Compute, GPT-2 medium's heads
    # at batch 1 and a 64k cache (33 splits): 6.2 -> 4.1 us (results/s67/call2/, call5/); replayed calls
    # moved within 1%, the merge's start overlapping the split kernel's end (PDL).
    lse_s = tl.load(LPART + offs_s * stride_ls + base_l, mask=s_ok, other=float("-inf"))
    o_s = tl.load(
        OPART + offs_s[:, None] * stride_os + base_o + offs_d[None, :],
        mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse_s - m_safe)
    total = tl.sum(w, 0)
    out = tl.sum(o_s * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    lse = tl.where(total > 0.0, m_safe + tl.math.log2(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    tl.store(LSE + row, lse * 0.6931471805599453)  # natural log
    tl.store(O + off_b.to(tl.int64) * stride_qb + qi * stride_qm + off_h * stride_qh + offs_d,
             out.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)  # fmt: skip


# A decode step's kernels do a few microseconds of work at short caches, so a generation loop is bound by
# the host: both launch through the compiled kernels' own launchers after their first call
# (`_launch.CompiledLaunch`), not `kernel[grid](...)`'s per-call argument binding. From sm_90, without GQA or
# at head dims up to 64, both launch as programmatic dependent launches (PDL, `_dependent_launches`): a
# kernel's programs start while the kernel before it ends, and wait in `gdc_wait` for its writes; at batch 1
# a whole call is a few microseconds, of which the gap between two kernels is a part. (Merging in the split
# kernel instead, its last program per work item merging through a counter, was slower: 152 registers at
# d128 against 128, one program less per SM, and a merge order that changed from run to run;
# results/s66/call1/.)
DECODE_PDL = not INTERPRET  # (the interpreter runs no inline PTX)
PDL_GQA_MAX_HEAD_DIM = 64  # under GQA, PDL up to this padded head dim (0: never, as before session 71)


def _dependent_launches(device: torch.device, group: int, block_d: int) -> bool:
    """Whether both kernels launch as PDL: on CUDA from sm_90 (ptxas refuses `griddepcontrol` below it),
    without GQA or at padded head dims up to PDL_GQA_MAX_HEAD_DIM. Measured on an H200, graph replays
    alternating with ordinary launches: with MHA 1.003-1.035x faster at batch 1 and 8 (GPT-2 medium's heads at
    batch 1 and a 4k cache: 1.033x), 1.000-1.01x at d128 (results/s66/call2-call6); with GQA at d128 (32 query
    heads on 8) 0.92-0.93x at batch 8 and a 4k cache, 0.97 at 16k, 0.98-1.01 at batch 1 (s66), again 0.93 /
    0.97 / 0.99 at batch 8 and 4k / 16k / 64k (results/s71/call4/); with GQA at d64 (16 query heads on 4 and
    32 on 8, batch 1 and 8, 4k-64k) faster at all 12 points, 1.002-1.05x (s71/call4/, call5/). Why GQA at d128
    loses is not known."""
    return (
        DECODE_PDL
        and (group == 1 or block_d <= PDL_GQA_MAX_HEAD_DIM)
        and device.type == "cuda"
        and compute_capability(device)[0] >= 9
    )


_launch_split = CompiledLaunch(_decode_split)
_launch_merge = CompiledLaunch(_decode_merge)


# Launch shape of the split kernel: programs per SM the default split count aims at, and the split
# kernel's warps, pipeline stages and key tile (module-level so `benchmarks/bench_decode.py` can sweep them).
# Measured on an H200, one token: at d128 (results/decode_{launch_sweep,small_work}_h200.json) with at most
# 32 (batch x kv heads x row blocks) work items, 4 programs per SM read the cache up to 11% faster than 2
# (128k: batch 1 MHA 0.532 -> 0.510 ms, batch 2 GQA 0.283 -> 0.255); at 64 and 128 items the two were
# within 4% either way, and at 256 (batch 8, MHA) 4 per SM was 20% slower. At d64 a program reads half
# the bytes a tile, and 128 items (GPT-2 medium's 16 heads at batch 8) read 1.09-1.19x faster at 4 per SM
# (results/s65/call5/: 16k 0.160 -> 0.138 ms, 64k 0.580 -> 0.492). So the rule counts work items times
# the (padded) head dim: up to SMALL_WORK_COLUMNS, 4 programs per SM.
#
# From padded head dim 128 little work rounds the split count down (at most 4 programs per SM), below it
# up. The time of a split kernel is its most loaded SM's: at d128 64 GQA items at batch 8 took 9 splits,
# 576 programs on 132 SMs, so 48 SMs ran a fifth program, each reading its slice in the SM's share of the
# bandwidth after the rest had ended (ours 0.661 ms against cuDNN's 0.495 at 64k, 3.25 TB/s against 4.4 for
# the same kernel's MHA rows; results/s66/call2/). Rounded down, 8 splits: 0.502 ms, 1.19-1.32x faster at
# 16k-64k, and d128 MHA at batch 1 (17 -> 16 splits) 1.04-1.05x (results/s66/call4/, call5/). A d64
# program moves half the bytes a tile and an SM runs five of them no slower: rounding GPT-2 medium's 128
# items at batch 8 down to 4 splits instead of 5 was 3.5-4.6% slower (call4/). d256 follows d128 unmeasured.
#
# Since session 71 d64 rounds down too, at 5 programs per SM: the split kernel takes 88 registers a thread
# there (128 at d128), so an SM holds 5 programs at once, and floor(5 x SMs / items) splits fill one wave.
# With GQA (16 query heads on 4, 32 on 8) at batch 8 that is 20 / 10 splits where 4 per SM rounded up gave
# 17 / 9: 0.96-0.99x the time at 4k-64k (with PDL under GQA 0.95-0.98x; cuDNN's time 0.91-0.93x ours
# before), at batch 1 0.99-1.01x (with PDL 0.96-1.00x) (results/s71/call5/: 4 alternating rounds of graph
# replays). GPT-2 medium's 16 heads: the same 5 splits at batch 8, 33 -> 41 at batch 1, 0.99-1.01x. Splits
# of 21 (5 per SM rounded up: a sixth program on 12 SMs) ran 1.3x slower at 64k (s71/call2/).
SPLITS_PER_SM = 2
SPLITS_PER_SM_SMALL_WORK = 4
SPLITS_PER_SM_SMALL_WORK_D64 = 5  # (little work at padded head dim 64: the programs an SM holds)
SMALL_WORK_COLUMNS = 8192  # 64 work items at d128, 128 at d64
ROUND_DOWN_HEAD_DIM = 64  # (None: rounded up at every head dim, as before session 66; 128 before session 71)
SPLIT_WARPS = 4
SPLIT_STAGES = 2
SPLIT_BLOCK_N = 64  # keys a tile (the interpreter takes 32: small test caches still span several tiles)
# No split shorter than MIN_SPLIT_TILES key tiles. At batch 1 a short cache's split count is set by this
# floor, not by the SMs: at 4 tiles GPT-2 medium's 16 heads at a 4k cache ran 256 programs on 132 SMs, at 2
# tiles 512, 1.08x faster (16.3 -> 15.1 us from graphs, cuDNN 15.3), a Llama-like GQA 32/8 at d128 1.03x at
# 4k (1.04x at 16k in one call, 0.99x in another); at 1 tile slower again (the merge reads twice the
# partials) (results/s67/call1/, call2/, call7/, batch 1, 4k-64k, d64 and d128).
MIN_SPLIT_TILES = 2
# Through a layout, the longest list of kept tiles takes the cache length's place, and splits may be one tile:
# against two, 1.05-1.10x faster at batch 1 (butterfly on GPT-2 medium's 16 heads at 16k / 64k: 0.909 / 0.954x the
# time, a pattern per head on 16 / 4 heads at 16k 0.965x), 0.999-1.002x elsewhere (batch 8, per-head 64k;
# results/s70/call9/, five alternating rounds of graph replays). A list is short (a butterfly's 64k row: ~20 tiles)
# and latency-bound: at two tiles a split each program waits for its tiles one after the other; at one, GPT-2
# medium's 16 heads run ~320 programs on 132 SMs, each one tile's wait.
LAYOUT_MIN_SPLIT_TILES = 1


def _default_num_splits(
    work_items: int,
    block_d: int,
    max_len: int,
    block_n: int,
    device: torch.device,
    min_tiles: int | None = None,
) -> int:
    """Enough programs for about SPLITS_PER_SM (little work: SPLITS_PER_SM_SMALL_WORK, at padded head dim 64
    SPLITS_PER_SM_SMALL_WORK_D64, rounded down from ROUND_DOWN_HEAD_DIM) per SM, but no split shorter than
    min_tiles key tiles (default MIN_SPLIT_TILES)."""
    sms = sm_count(device)
    work_items = max(work_items, 1)
    small = work_items * block_d <= SMALL_WORK_COLUMNS
    per_sm = SPLITS_PER_SM
    if small:
        per_sm = SPLITS_PER_SM_SMALL_WORK_D64 if block_d == 64 else SPLITS_PER_SM_SMALL_WORK
    if small and ROUND_DOWN_HEAD_DIM is not None and block_d >= ROUND_DOWN_HEAD_DIM:
        want = per_sm * sms // work_items
    else:
        want = cdiv(per_sm * sms, work_items)
    min_tiles = MIN_SPLIT_TILES if min_tiles is None else min_tiles
    return max(1, min(want, cdiv(max_len, min_tiles * block_n), 128))


def _decode_layout(layout, q, nheads: int, max_len: int):
    """(int8 mask on q's device, its (head, row) strides; the head's read only with a pattern per head) of a
    layout `flash_decode` can take; a ValueError that says what to change for any other."""
    if not isinstance(layout, BlockLayout):
        raise ValueError(f"layout must be a kernels.layouts.BlockLayout, got {type(layout).__name__}")
    if q.shape[1] != 1:
        raise ValueError(
            f"a layout takes one new query per sequence (a decode step), got seqlen_q={q.shape[1]}: run "
            "several through kernels.block_sparse_attention with the rows they fall in"
        )
    if layout.device != q.device:
        raise ValueError(f"layout is on {layout.device} but q is on {q.device}; move it with layout.to(...)")
    if layout.nheads not in (1, nheads):
        raise ValueError(
            f"layout has {layout.nheads} heads for {nheads} query heads: give one pattern for every head, "
            "or one per query head"
        )
    rows, cols = layout.shape[1:]
    if rows * layout.block_m < max_len or cols * layout.block_n < max_len:
        raise ValueError(
            f"layout grid {rows}x{cols} of {layout.block_m}x{layout.block_n} blocks covers "
            f"{rows * layout.block_m}x{cols * layout.block_n} positions, not the cache's {max_len}: build it "
            f"for at least {cdiv(max_len, layout.block_m)} row and {cdiv(max_len, layout.block_n)} column blocks"
        )
    mask = layout.derived(("decode_int8",), lambda: layout.mask.to(torch.int8))
    return mask, mask.stride()[:2]


def _decode_tiles(layout: BlockLayout, nheads_kv: int, block_n: int):
    """The key tiles (block_n keys each) a decode query in each row of the layout reads: those of the blocks
    its row keeps (with a pattern per head, any head of the kv group), up to the row's end (later keys are
    not in its cache yet). Per (kv head, or 1 for a shared pattern; row): the tiles' indices ascending, int32
    (G, R, the largest count), their counts (G, R), and the largest count, which sets the split count. Built
    once per layout (a device sync, before any CUDA graph captures the step)."""

    def build():
        keep = layout.mask
        if layout.nheads > 1:  # the union over each kv group's query heads
            keep = keep.view(nheads_kv, layout.nheads // nheads_kv, *keep.shape[1:]).any(dim=1)
        keep = keep.repeat_interleave(layout.block_n // block_n, dim=-1)  # (G, R, T)
        rows, n_tiles = keep.shape[1:]
        row_end = (torch.arange(rows, device=keep.device) + 1) * layout.block_m
        keep = keep & (torch.arange(n_tiles, device=keep.device) * block_n < row_end[:, None])
        counts = keep.sum(-1, dtype=torch.int32)
        most = int(counts.max())
        tiles = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[..., : max(most, 1)]
        return tiles.to(torch.int32).contiguous(), counts.contiguous(), most

    groups = nheads_kv if layout.nheads > 1 else 1
    return layout.derived(("decode_tiles", groups, block_n), build)


def flash_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    return_lse: bool = False,
    num_splits: int | None = None,
    layout: BlockLayout | None = None,
):
    """Attention of a few new queries against the first cache_seqlens[b] entries of a KV cache.

    q: (batch, seqlen_q, nheads, headdim), seqlen_q small (one or a few new tokens);
    k_cache, v_cache: (batch, max_len, nheads_kv, headdim), nheads a multiple of nheads_kv;
    cache_seqlens: int32 (batch,), valid length of each cache (entries past max_len are clamped to it,
    negative ones read as 0; not checked on the host, which would cost a device sync per step).
    Causal/window alignment is bottom-right against each sequence's own length. num_splits: KV slices per sequence (default: enough
    to fill the GPU). Inference only: no gradient flows through. Returns out (batch, seqlen_q, nheads,
    headdim) in q's dtype and, with return_lse=True, lse (batch, nheads, seqlen_q) float32 natural log.
    layout: a `kernels.layouts.BlockLayout` over the cache's positions (queries and keys alike: a block
    model's layout, `block_sparse_attention`'s): the one new query of each sequence (seqlen_q = 1), at
    position cache_seqlens[b] - 1, sees only the keys of the blocks its row keeps, and the others are not
    read (under GQA, those no head of a kv group keeps). Everything stays on the device, so a step through
    it can be captured in a CUDA graph.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(name, t, 4, "(batch, seqlen, nheads, headdim)")
    check_rank("cache_seqlens", cache_seqlens, 1, "(batch,) of int32")
    check_device(q, k_cache, v_cache, cache_seqlens)
    check_dtype(q, k_cache, v_cache)
    batch, seqlen_q, nheads, headdim = q.shape
    max_len, nheads_kv = k_cache.shape[1], k_cache.shape[2]
    check_heads(nheads, nheads_kv, headdim, k_cache.shape[3], v_cache.shape[3])
    # a cache whose one sequence spans past 2**31 elements is walked in the WIDE build (64-bit row and head
    # offsets; the usual build stays as it was); the few new queries are addressed in 32 bits
    if exceeds_extent_limit(q, seqlen_q, 1):
        raise ValueError(
            f"q: {seqlen_q} new queries of one sequence span past 2**31 elements; flash_decode takes a few "
            "new queries a call: attend a prompt this long with kernels.flash_attention (a prefill)"
        )
    wide = wide_offsets((k_cache, v_cache))
    if k_cache.shape[:3] != v_cache.shape[:3] or k_cache.shape[0] != batch:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must be "
            f"(batch={batch}, max_len, nheads_kv, headdim)"
        )
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(
            f"cache_seqlens must be int32 of shape (batch,) = ({batch},), got {cache_seqlens.dtype} "
            f"{tuple(cache_seqlens.shape)}"
        )
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    left, right = check_window(window)
    if check_causal(causal):
        right = 0 if right is None else min(right, 0)
    check_flag("return_lse", return_lse)
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    scale = resolve_softmax_scale(softmax_scale, headdim)

    group = nheads // nheads_kv
    n_rows = seqlen_q * group
    block_m = min(max(16, next_power_of_2(n_rows)), 64)
    block_n = 32 if INTERPRET else SPLIT_BLOCK_N
    lay, lay_strides = None, (0, 0)
    tiles, tile_cnt, tile_strides, most_keys = None, None, (0, 0, 0), max_len
    if layout is not None:
        lay, lay_strides = _decode_layout(layout, q, nheads, max_len)
        block_n = min(block_n, layout.block_n)  # (each tile inside one layout block)
        tiles, tile_cnt, most = _decode_tiles(layout, nheads_kv, block_n)
        # (a shared pattern's lists serve every kv head: their head stride is 0)
        per_group = layout.nheads > 1
        tile_strides = (tiles.stride(0) * per_group, tiles.stride(1), tile_cnt.stride(0) * per_group)
        most_keys = most * block_n  # what the longest list reads, split as a dense cache that long
        # (a head's row is masked by its causal mask, which at the last key hides nothing else)
        if layout.nheads > 1:
            right = 0 if right is None else min(right, 0)
    m_blocks = cdiv(n_rows, block_m)
    block_d = padded_head_dim(headdim)
    if num_splits is None:
        num_splits = _default_num_splits(
            batch * nheads_kv * m_blocks, block_d, most_keys, block_n, q.device,
            None if layout is None else LAYOUT_MIN_SPLIT_TILES,
        )  # fmt: skip
    chunk = cdiv(cdiv(max(max_len, 1), num_splits), block_n) * block_n
    pdl = _dependent_launches(q.device, group, block_d)
    with torch.no_grad():
        out = torch.empty_like(q)
        lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
        # partials only where there are splits to merge (one split writes out and lse itself)
        opart = lpart = None
        part_strides = (0,) * 7
        if num_splits > 1:
            opart = torch.empty(
                num_splits, batch, nheads, seqlen_q, headdim, device=q.device, dtype=torch.float32
            )
            lpart = torch.empty(num_splits, batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
            part_strides = (*opart.stride()[:4], *lpart.stride()[:3])
        _launch_split(
            (num_splits, m_blocks, batch * nheads_kv),
            (),
            (q, k_cache, v_cache, cache_seqlens, opart, lpart, out, lse, lay, tiles, tile_cnt,
             q.stride(0), q.stride(1), q.stride(2),
             k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
             v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
             *part_strides,
             out.stride(0), out.stride(1), out.stride(2),
             seqlen_q, max_len, nheads_kv, group, chunk, num_splits,
             scale * LOG2E, left or 0, right or 0, *lay_strides, *tile_strides),
            dict(HEAD_DIM=headdim, BLOCK_D=block_d, HAS_LEFT=left is not None, HAS_RIGHT=right is not None,
                 DOT_PREC=dot_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n, PDL=pdl,
                 SPARSE=layout is not None, PER_HEAD=layout is not None and layout.nheads > 1, LAYOUT_BM=layout.block_m if layout is not None else 1,
                 LAYOUT_BN=layout.block_n if layout is not None else 1, WIDE=wide,
                 num_warps=SPLIT_WARPS, num_stages=SPLIT_STAGES, launch_pdl=pdl),
        )  # fmt: skip
        if num_splits > 1:
            _launch_merge(
                (batch * nheads * seqlen_q,),
                (),
                (opart, lpart, out, lse, num_splits,
                 *part_strides,
                 out.stride(0), out.stride(1), out.stride(2),
                 nheads, seqlen_q),
                dict(HEAD_DIM=headdim, BLOCK_D=block_d, BLOCK_S=max(2, next_power_of_2(num_splits)), PDL=pdl,
                     launch_pdl=pdl),
            )  # fmt: skip
    return (out, lse) if return_lse else out
