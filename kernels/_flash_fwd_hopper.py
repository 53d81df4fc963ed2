"""FlashAttention forward for Hopper (sm_90) in Gluon: warp-specialised, TMA-fed, wgmma pipelined.

The portable forward (`_flash_fwd._attn_fwd`) leaves the tensor cores idle while each tile's softmax
runs, and Triton 3.6 does not build its own warp-specialised pipeline for that loop
(benchmarks/NOTES_attention.md, "Warp specialisation"). This kernel writes the FlashAttention-3 schedule
by hand in Gluon (Triton's lower-level language, shipped with Triton 3.6):

- one producer warp streams K and V tiles into a ring of shared-memory stages with TMA bulk copies
  (mbarriers say when a stage is full, and when every consumer is done with it);
- NUM_CONSUMERS warpgroups each own BLOCK_M query rows of the program's tile and share the K/V stages;
  while one warpgroup runs its softmax, the other's matrix products can keep the tensor cores busy. The
  configs of `PINGPONG_CONFIGS` enforce that order (FlashAttention-3's ping-pong: the warpgroups take
  turns at issuing their products, on two hardware named barriers, `wait_turn`); the others leave it to
  the warp schedulers;
- inside a warpgroup the scores of the next key tile are issued (asynchronous wgmma) before the softmax
  of the current one, and P @ V of the current one runs alongside that softmax (intra-warpgroup overlap).

Scope: dense (batch, seqlen, nheads, headdim) inputs in bf16/fp16, head dims 64, 128 and 256 (`CONFIGS`),
full or causal (bottom-right aligned), GQA; no dropout, window, key padding or varlen (those take the
portable kernel).
Same outputs as the portable forward: out in q's dtype and the base-2 lse (B, H, Sq).
With SPARSE=True the same kernel walks a block-sparse layout's tile lists instead of a range of key
tiles, and stores lse in natural log (`kernels._block_sparse_hopper` builds the lists and launches it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._common import (
    INTERPRET,
    LOG2E,
    cdiv,
    compute_capability,
    sm_count,
)
from ._hopper_pipeline import (
    all_tma_ready,
    descriptor,
    item_buffers,
    key_tile,
    kv_ring,
    list_args,
    masked_scores,
    masked_steps,
    my_items,
    persistent_producer,
    program_rows,
    store_rows,
    stream_kv,
    work_rows,
)
from ._launch import CompiledLaunch


@gluon.jit
def _producer(
    q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, kv_empty,
    off_b, off_h, off_hk, m0, n_kv, tiles, SPARSE: gl.constexpr,
):  # fmt: skip
    """One warp: each consumer's Q rows once, then the key tiles' K and V into the stage ring."""
    NUM_CONSUMERS: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [off_b, off_h, m0 + c * BLOCK_M, 0], q_ready.index(c), q_smem.index(c)
        )
    stream_kv(
        k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, off_b, off_hk, n_kv, tiles, 0, SPARSE
    )


@gluon.jit
def release_kv(kv_empty, k_smem, v_smem, k_pos, v_pos):
    """A forward consumer hands back the tiles it is done with (every warp of its warpgroup is past
    the products that read them): with one K/V ring the stage of ring position v_pos (K and V); with
    K and V rings of their own (`kv_ring` with V_STAGES) the K tile of position k_pos, if k_pos >= 0,
    and the V tile of v_pos, if v_pos >= 0."""
    K_STAGES: gl.constexpr = k_smem.shape[0]
    SPLIT: gl.constexpr = kv_empty.shape[0] != K_STAGES
    if SPLIT:
        mbarrier.arrive(kv_empty.index(k_pos % K_STAGES), count=1, pred=k_pos >= 0)
        mbarrier.arrive(kv_empty.index(K_STAGES + v_pos % v_smem.shape[0]), count=1, pred=v_pos >= 0)
    else:
        mbarrier.arrive(kv_empty.index(v_pos % K_STAGES), count=1)


@gluon.jit
def _named_barrier(BAR: gl.constexpr, ARRIVE: gl.constexpr):
    """bar.sync (ARRIVE False: wait) or bar.arrive (signal without waiting) on hardware named barrier
    BAR (8 or 9) for the two consumer warpgroups, 256 threads: a warpgroup's 128 threads meet the other's
    128 arrivals. Named barriers, not mbarriers: no shared-memory polling and no extra thread_barrier,
    the costs session 38's turns on mbarriers had (they lost; whether for those costs is not measured).
    Triton's warp specialisation uses ids 0-2 (`bar.sync 0, 128` and `2, 128` for the consumer
    partitions, `barrier.sync 1` for the whole block). Emitted through an elementwise asm over one
    element per thread of the warpgroup, so each thread runs it once."""
    one_per_thread: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    bar = gl.full([128], BAR, gl.int32, one_per_thread)  # (the id as an operand: ptxas folds the constant)
    if ARRIVE:
        gl.inline_asm_elementwise("bar.arrive $1, 256; mov.b32 $0, $1;", "=r,r", [bar], gl.int32, False, 1)
    else:
        gl.inline_asm_elementwise("bar.sync $1, 256; mov.b32 $0, $1;", "=r,r", [bar], gl.int32, False, 1)


@gluon.jit
def wait_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """FlashAttention-3's ping-pong: warpgroup WG waits for its turn at the tensor cores (named barrier
    8 + WG) before issuing a step's products; `pass_turn` hands the turn to the other once they are
    issued. So the two warpgroups' products queue alternately and one's softmax runs while the other's
    products do; left alone, both tend to issue together and then both wait on their exp2 work. Each
    warpgroup takes one turn a step, and both walk the same steps; a program's `first_turn` and
    `last_turn` balance the counts. The turns alternate strictly, so an arrival is always taken before
    the next one comes: a named barrier counts arrivals, and two of one warpgroup's in a row would
    complete it without the other."""
    if PINGPONG:
        _named_barrier(8 + WG, False)


@gluon.jit
def pass_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Hands the tensor cores to the other warpgroup (`wait_turn`) once this one's products are issued."""
    if PINGPONG:
        _named_barrier(9 - WG, True)


@gluon.jit
def first_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Warpgroup 0 goes first: warpgroup 1 gives it the program's first turn."""
    if PINGPONG:
        if WG == 1:
            _named_barrier(8, True)


@gluon.jit
def last_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Warpgroup 0 takes the turn warpgroup 1's last `pass_turn` gave it, so no arrival is left pending
    on barrier 8 when the program ends. Once a program, not once an item: per item, warpgroup 1's next
    `first_turn` could in principle come before warpgroup 0 took the last one, and two arrivals in a row
    would complete the barrier without warpgroup 0 (which then waits for ever)."""
    if PINGPONG:
        if WG == 0:
            _named_barrier(8, False)


@gluon.jit
def _softmax_update(s, m_i, l_i, qk_scale, MASKED: gl.constexpr):
    """Online softmax of one tile of raw scores (base 2, the scale folded into the exp2's FMA):
    returns (p, the rescale factor of the running sums, new max, new sum)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    if MASKED:  # a row that has seen no key keeps m = -inf: subtract 0 so exp2 gives 0, not NaN
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    p = gl.exp2(s * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _consumer_steps(
    acc, p, m_i, l_i, lo, hi, n_kv, tiles, q, k_smem, v_smem, k_ready, v_ready, kv_empty, rows, seqlen_k, diag,
    qk_scale, ring0, CAUSAL: gl.constexpr, MASKED: gl.constexpr, SPARSE: gl.constexpr,
    s_layout: gl.constexpr, o_layout: gl.constexpr, WG: gl.constexpr = 0, PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """Steps i in [lo, hi): scores of tile i issued, then P @ V of tile i - 1 (whose p we hold) beside
    tile i's softmax; tile i - 1's K and V are released once its product is done. ring0: as
    `stream_kv`'s. PINGPONG: warpgroup WG issues each step's two products in its turn (`wait_turn`),
    with P's operand and V's wait done before the turn, so the turn holds only the issues."""
    STAGES: gl.constexpr = k_smem.shape[0]
    V_STAGES: gl.constexpr = v_smem.shape[0]  # (STAGES unless V has a ring of its own: `kv_ring`)
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    for i in range(lo, hi):
        stage = (ring0 + i) % STAGES
        prev = (ring0 + i - 1) % V_STAGES
        mbarrier.wait(k_ready.index(stage), ((ring0 + i) // STAGES) & 1)
        k_t = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        if PINGPONG:  # (P's operand ready before the turn: the turn holds only the two issues)
            mbarrier.wait(v_ready.index(prev), ((ring0 + i - 1) // V_STAGES) & 1)
            p_op = gl.convert_layout(p.to(q.dtype), p_layout)
            v = v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM])
            wait_turn(WG, PINGPONG)
        s = warpgroup_mma(q, k_t, gl.zeros(p.shape, gl.float32, s_layout), use_acc=False, is_async=True)
        if not PINGPONG:  # (without turns: after S is issued, so the wait and the conversion overlap it)
            mbarrier.wait(v_ready.index(prev), ((ring0 + i - 1) // V_STAGES) & 1)
            p_op = gl.convert_layout(p.to(q.dtype), p_layout)
            v = v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM])
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        pass_turn(WG, PINGPONG)
        s, p_op = warpgroup_mma_wait(1, deps=(s, p_op))  # the scores are in; P @ V may still run
        if MASKED:
            start_n = key_tile(tiles, i, n_kv, SPARSE) * BLOCK_N
            s = masked_scores(s, start_n, rows, seqlen_k, diag, CAUSAL, s_layout)
        p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale, MASKED)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        gl.thread_barrier()  # every warp of the group is past its products before the stage is handed back
        release_kv(kv_empty, k_smem, v_smem, ring0 + i, ring0 + i - 1)  # (split rings: K of this step)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return acc, p, m_i, l_i


@gluon.jit
def _consumer(
    q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, kv_empty, o_desc, LSE,
    off_b, off_h, m0, n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, stride_lb, stride_lh,
    WG: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr, PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """One warpgroup: query rows m0 + WG * BLOCK_M .. + BLOCK_M against the key tiles of steps 0 ..
    n_kv - 1 (`key_tile`); block-sparse, the first n_listed_masked of them need the element mask.
    PINGPONG: the two warpgroups take turns at issuing their products (`wait_turn`)."""
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    first_row = m0 + WG * BLOCK_M
    first_turn(WG, PINGPONG)
    acc, m_i, l_i, rows = _attend_rows(
        q_smem.index(WG), q_ready.index(WG), 0, k_smem, v_smem, k_ready, v_ready, kv_empty, first_row, n_kv,
        tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, 0, q_ready.index(WG), False, CAUSAL, SPARSE, False,
        WG, PINGPONG,
    )  # fmt: skip
    last_turn(WG, PINGPONG)
    out = _finish_rows(acc, m_i, l_i, LSE, off_b, off_h, rows, seqlen_q, stride_lb, stride_lh, SPARSE)
    # out through this group's Q stage (no product reads it any more)
    store_rows(out.to(q_smem.dtype), q_smem.index(WG), o_desc, [off_b, off_h, first_row, 0], True)


@gluon.jit
def _attend_rows(
    q_buf, q_bar, q_phase, k_smem, v_smem, k_ready, v_ready, kv_empty, first_row, n_kv, tiles, n_listed_masked,
    seqlen_q, seqlen_k, qk_scale, ring0, prev_q_empty, release_prev, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
    RELEASE: gl.constexpr, WG: gl.constexpr = 0, PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """A warpgroup's BLOCK_M query rows from first_row (in shared memory q_buf (1, 1, BLOCK_M, HEAD_DIM)
    once q_bar completes phase q_phase) against the key tiles of steps 0 .. n_kv - 1, whose stages start
    at ring position ring0 (`stream_kv`): (acc, m_i, l_i, rows), the unnormalised output rows, their
    running max and sum (base 2), and the rows' indices. Every stage of these steps has been handed back,
    and every product that read q is done, when it returns.
    RELEASE (the persistent kernel): once the first product is issued, wait for this warpgroup's last
    TMA store (the previous item's out, stored through its Q buffer) and, if release_prev, hand that
    buffer back on prev_q_empty; the store had the Q and K waits to finish in.
    PINGPONG: warpgroup WG (0 or 1) takes turns with the other at issuing each step's products after the
    first (`wait_turn`); the caller gives the program's first turn and takes its last."""
    BLOCK_M: gl.constexpr = q_buf.shape[2]
    HEAD_DIM: gl.constexpr = q_buf.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    STAGES: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = first_row + gl.arange(0, BLOCK_M, layout=row_s)
    diag = seqlen_k - seqlen_q
    n_masked = masked_steps(n_kv, n_listed_masked, first_row, seqlen_k, diag, BLOCK_N, CAUSAL, SPARSE)

    mbarrier.wait(q_bar, q_phase)
    q = q_buf.reshape([BLOCK_M, HEAD_DIM])
    first = ring0 % STAGES
    mbarrier.wait(k_ready.index(first), (ring0 // STAGES) & 1)
    k_t = k_smem.index(first).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(
        q, k_t, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True
    )
    if RELEASE:
        tma.store_wait(0)
        gl.thread_barrier()
        if release_prev:
            mbarrier.arrive(prev_q_empty, count=1)
    s = warpgroup_mma_wait(0, deps=(s,))
    if kv_empty.shape[0] != STAGES:  # K and V rings of their own: step 0's K goes back now
        gl.thread_barrier()
        release_kv(kv_empty, k_smem, v_smem, ring0, -1)
    s = masked_scores(s, key_tile(tiles, 0, n_kv, SPARSE) * BLOCK_N, rows, seqlen_k, diag, CAUSAL, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale, True)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    acc, p, m_i, l_i = _consumer_steps(
        acc, p, m_i, l_i, 1, n_masked, n_kv, tiles, q, k_smem, v_smem, k_ready, v_ready, kv_empty, rows,
        seqlen_k, diag, qk_scale, ring0, CAUSAL, True, SPARSE, s_layout, o_layout, WG, PINGPONG,
    )  # fmt: skip
    acc, p, m_i, l_i = _consumer_steps(
        acc, p, m_i, l_i, n_masked, n_kv, n_kv, tiles, q, k_smem, v_smem, k_ready, v_ready, kv_empty, rows,
        seqlen_k, diag, qk_scale, ring0, CAUSAL, False, SPARSE, s_layout, o_layout, WG, PINGPONG,
    )  # fmt: skip
    # the last tile's P @ V
    V_STAGES: gl.constexpr = v_smem.shape[0]
    last = (ring0 + n_kv - 1) % V_STAGES
    mbarrier.wait(v_ready.index(last), ((ring0 + n_kv - 1) // V_STAGES) & 1)
    p_op = gl.convert_layout(p.to(q.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    acc = warpgroup_mma(p_op, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    gl.thread_barrier()
    release_kv(kv_empty, k_smem, v_smem, -1, ring0 + n_kv - 1)
    return acc, m_i, l_i, rows


@gluon.jit
def _finish_rows(
    acc, m_i, l_i, LSE, off_b, off_h, rows, seqlen_q, stride_lb, stride_lh, SPARSE: gl.constexpr
):
    """Stores the rows' lse and returns their output (acc / l, float32). Rows that saw no key: out = 0
    (acc is 0) and lse = -inf, never 0/0."""
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    acc = acc / gl.convert_layout(l_safe, o_rows)[:, None]
    lse = gl.where(seen, m_i + gl.log2(l_safe), float("-inf"))
    if SPARSE:  # kernels.block_sparse_attention's lse is in natural log
        lse = lse * 0.6931471805599453  # ln(2)
    lse_ptrs = LSE + off_b.to(gl.int64) * stride_lb + off_h * stride_lh + rows
    gl.store(lse_ptrs, lse, mask=rows < seqlen_q)
    return acc


@gluon.jit
def _attn_fwd_hopper(
    q_desc, k_desc, v_desc, o_desc, LSE,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, V_STAGES: gl.constexpr = 0, PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """Descriptors are 4-D (batch, heads, seqlen, headdim) views; q's and o's blocks are (1, 1, BLOCK_M,
    HEAD_DIM), k's and v's (1, 1, BLOCK_N, HEAD_DIM). A program covers NUM_CONSUMERS * BLOCK_M rows.
    V_STAGES > 0: K and V in rings of their own, of STAGES and V_STAGES tiles (`kv_ring`).
    PINGPONG: the consumers take turns at issuing their products (`wait_turn`).
    SPARSE: a block-sparse call, whose key tiles come from TILES and COUNTS (`listed_row_program`) and
    whose lse is stored in natural log; dense calls pass any pointer there (never read)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    m0, off_h, off_hk, off_b, n_kv, n_masked, tiles = program_rows(
        sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS, lay_heads, n_list_rows, list_len,
        BLOCK_M * NUM_CONSUMERS, BLOCK_N, CAUSAL, SPARSE,
    )  # fmt: skip

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_ready.index(c), count=1)
    k_smem, v_smem, k_ready, v_ready, kv_empty = kv_ring(k_desc, v_desc, STAGES, NUM_CONSUMERS, V_STAGES)

    # (Gluon takes no starred arguments, and a tuple held in a variable turns its constexprs (the
    # warpgroup index WG, CAUSAL) into run-time values: each partition's tuple is written out in the call)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups (a third does not fit the registers)")
    gl.warp_specialize(
        [
            (_consumer, (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, kv_empty, o_desc, LSE, off_b, off_h,
                         m0, n_kv, tiles, n_masked, seqlen_q, seqlen_k, qk_scale, stride_lb, stride_lh, 0, CAUSAL,
                         SPARSE, PINGPONG)),
            (_consumer, (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, kv_empty, o_desc, LSE, off_b, off_h,
                         m0, n_kv, tiles, n_masked, seqlen_q, seqlen_k, qk_scale, stride_lb, stride_lh, 1, CAUSAL,
                         SPARSE, PINGPONG)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, kv_empty,
                         off_b, off_h, off_hk, m0, n_kv, tiles, SPARSE)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# persistent variant: one program per SM walks several row tiles
# ---------------------------------------------------------------------------------------------------
# A program of `_attn_fwd_hopper` holds a whole SM, so its fixed costs (the first Q and K loads, the
# pipeline's fill and drain, the output's store) are paid in full by every 128-row tile; with few key
# tiles per row tile (short sequences, sparse lists) they are a large share of the time. Here each
# program walks several work items of the same (row tiles, heads, batch) grid (`my_items`): the producer
# loads the next item's Q (two buffers per consumer) and K/V tiles (the ring goes on) while the consumers
# finish the current one, and each item's out leaves through its Q buffer by a TMA store that the
# consumer waits for only after issuing the next item's first product.


@gluon.jit
def _persistent_consumer(
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, o_desc, LSE, stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_row_tiles, nheads, n_batch, WG: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
    PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """One warpgroup: rows WG * BLOCK_M .. + BLOCK_M of each work item of this program (`_consumer`'s
    work, item after item); out through the item's Q buffer, which the next item hands back."""
    NUM_CONSUMERS: gl.constexpr = q_smem.shape[0] // 2
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    n_mine, programs, pid = my_items(n_row_tiles * nheads * n_batch)
    ring0 = 0
    first_turn(WG, PINGPONG)  # (once a program: the turns alternate strictly from item to item)
    for j in range(n_mine):
        m0, off_h, off_hk, off_b, n_kv, n_listed_masked, tiles = work_rows(
            j, programs, pid, n_row_tiles, nheads, n_batch, sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS,
            lay_heads, n_list_rows, list_len, BLOCK_M * NUM_CONSUMERS, BLOCK_N, CAUSAL, SPARSE,
        )  # fmt: skip
        first_row = m0 + WG * BLOCK_M
        buf = (j % 2) * NUM_CONSUMERS + WG
        prev = ((j + 1) % 2) * NUM_CONSUMERS + WG
        acc, m_i, l_i, rows = _attend_rows(
            q_smem.index(buf), q_ready.index(buf), (j // 2) & 1, k_smem, v_smem, k_ready, v_ready, kv_empty,
            first_row, n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, ring0, q_empty.index(prev),
            j > 0, CAUSAL, SPARSE, True, WG, PINGPONG,
        )  # fmt: skip
        out = _finish_rows(acc, m_i, l_i, LSE, off_b, off_h, rows, seqlen_q, stride_lb, stride_lh, SPARSE)
        # out through the item's Q buffer (every product that read these Q rows is done); the next
        # item's _attend_rows waits for the store
        store_rows(out.to(q_smem.dtype), q_smem.index(buf), o_desc, [off_b, off_h, first_row, 0], False)
        ring0 += n_kv
    last_turn(WG, PINGPONG)
    tma.store_wait(0)


@gluon.jit
def _attn_fwd_hopper_persistent(
    q_desc, k_desc, v_desc, o_desc, LSE,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_row_tiles, nheads, n_batch,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, PINGPONG: gl.constexpr = False, V_STAGES: gl.constexpr = 0,
):  # fmt: skip
    """`_attn_fwd_hopper` on a 1-D grid of at most one program per SM, each walking its share of the
    work items of the (n_row_tiles, nheads, n_batch) grid (`my_items`). V_STAGES > 0: K and V in rings
    of their own (`kv_ring`), whose positions run on from item to item as one ring's do."""
    q_smem, no_do, q_ready, q_empty = item_buffers(q_desc, q_desc, NUM_CONSUMERS, False)
    k_smem, v_smem, k_ready, v_ready, kv_empty = kv_ring(k_desc, v_desc, STAGES, NUM_CONSUMERS, V_STAGES)

    # (partition tuples written out in the call: see _attn_fwd_hopper)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups (a third does not fit the registers)")
    gl.warp_specialize(
        [
            (_persistent_consumer, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                                    o_desc, LSE, stride_lb, stride_lh, seqlen_q, seqlen_k, group, qk_scale,
                                    sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len, n_row_tiles,
                                    nheads, n_batch, 0, CAUSAL, SPARSE, PINGPONG)),
            (_persistent_consumer, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                                    o_desc, LSE, stride_lb, stride_lh, seqlen_q, seqlen_k, group, qk_scale,
                                    sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len, n_row_tiles,
                                    nheads, n_batch, 1, CAUSAL, SPARSE, PINGPONG)),
            (persistent_producer, (q_desc, q_desc, k_desc, v_desc, q_smem, no_do, k_smem, v_smem, q_ready, q_empty,
                                   k_ready, v_ready, kv_empty, seqlen_q, seqlen_k, group, sched_slots, TILES, COUNTS,
                                   lay_heads, n_list_rows, list_len, n_row_tiles, nheads, n_batch, CAUSAL, SPARSE,
                                   False)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# configs and launcher
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HopperFwdConfig:
    """One launch shape of `_attn_fwd_hopper`."""

    block_m: int  # query rows per consumer warpgroup (wgmma's M: 64)
    block_n: int  # keys per K/V tile
    consumers: int  # consumer warpgroups per program (2: three at d64 spill even at 160 registers each)
    stages: int  # K/V tiles in flight (shared memory: 2 * stages * block_n * headdim * 2 bytes)
    consumer_regs: int  # registers per thread of a consumer warpgroup (setmaxnreg)
    producer_regs: int = 24  # of the producer's warpgroup
    persistent: bool = False  # `_attn_fwd_hopper_persistent`: one program per SM walks several row tiles
    # > 0: the forward's K and V in rings of their own, `stages` K tiles and this many V tiles (`kv_ring`)
    v_stages: int = 0
    # the consumers take turns at issuing their products (FlashAttention-3's ping-pong, `wait_turn`)
    pingpong: bool = False
    # set by a kernel that keeps K and V in one ring, to say why (then a config of it with v_stages raises)
    one_kv_ring: ClassVar[str | None] = None
    # set by a kernel whose consumers take no turns, to say so (then a config of it with pingpong raises)
    no_turns: ClassVar[str | None] = None

    def __post_init__(self):
        if self.v_stages and self.one_kv_ring:
            raise ValueError(f"{self}: {self.one_kv_ring}; leave v_stages at 0")
        if self.pingpong and self.no_turns:
            raise ValueError(f"{self}: {self.no_turns}; leave pingpong False")


# Per head dim. Register budget: consumers * 128 * consumer_regs + 128 * producer_regs <= 65536.
CONFIGS = {
    64: HopperFwdConfig(block_m=64, block_n=128, consumers=2, stages=3, consumer_regs=240),
    # 128-key tiles, K and V in rings of two tiles each (`kv_ring`): the producer loads a step ahead, as
    # with three shared stages. Those (one H200, results/s38/call3) ran 1.07-1.12x the 64-key tiles on four
    # stages at 4k and 16k (n16k full 614-640 against 568-570 TFLOP/s; cuDNN 618), but their 224 KB of
    # shared memory gave wrong outputs under the GPU tests (call4/), as the persistent forward's 230 KB
    # had in session 29; two shared stages were 0.89-0.96x the 64-key tiles.
    128: HopperFwdConfig(block_m=64, block_n=128, consumers=2, stages=2, consumer_regs=240, v_stages=2),
    # 64 x 256 fp32 output rows take 128 registers a thread; Q (64 KB) and three stages of 32-key K/V
    # tiles fill 164 KB (one H200: within 2% of the best of four configs at every shape, 64x64 s2 lost
    # 8% at n16k full; benchmarks/NOTES_attention.md "Head dim 256")
    256: HopperFwdConfig(block_m=64, block_n=32, consumers=2, stages=3, consumer_regs=240),
}

# The persistent variant's configs: the row-tile kernel's tiles and stages (d128: 128-key tiles in K and V
# rings of 2 + 2, beside two sets of Q buffers: 197 KB). Forward alone on one H100 (bf16, batch x seqlen =
# 16k tokens, TFLOP/s persistent / row-tile / portable; benchmarks/NOTES_attention.md "Persistent
# forward"): d64 causal 316 / 236 / 288 at 1k, 405 / 394 / 403 at 4k, 430 / 447 / 465 at 16k; d64 full
# 418 / 347 / 374 (1k), 451 / 422 / 424 (4k), 465 / 454 / 444 (16k). d128's ran on 64-key tiles on four
# shared stages until session 76 (`PERSISTENT_64KEY`, which the block-sparse forward keeps); on 128-key
# tiles in split rings, one H200, five alternating rounds, cuDNN's forward time ÷ ours, 128-key / 64-key
# persistent / the row-tile kernel (with turns on full calls) (results/s76/call1): full 512 / 1k / 2k /
# 4k 0.980 / 0.916 / 0.824, 1.054 / 0.940 / 0.962, 1.046 / 0.925 / 1.013, 1.043 / 0.923 / 1.016; causal
# 512-8k 0.956 / 0.943 / 0.702, 1.020 / 0.979 / 0.881, 1.032 / 0.964 / 0.965, 1.036 / 0.975 / 1.029, 1.038
# / 0.975 / 1.042. With turns the 128-key persistent variant was level or slower (0.966-1.050). Past 8k
# (call2), 128-key persistent / row-tile / row-tile with turns: full 8k / 16k / 32k 1.053 / 1.043 / 1.043,
# 1.047 / 1.045 / 1.041, 1.042 / 1.056 / 1.048; causal 8k / 16k 1.055 / 1.058, 1.017 / 1.072.
PERSISTENT_CONFIGS = {
    64: dataclasses.replace(CONFIGS[64], persistent=True),
    128: dataclasses.replace(CONFIGS[128], persistent=True),
}
PERSISTENT_64KEY = HopperFwdConfig(
    block_m=64, block_n=64, consumers=2, stages=4, consumer_regs=240, persistent=True
)
# d128: the persistent variant below these query counts (causal, full), the row-tile kernel from them
PERSISTENT_BELOW_128 = {True: 8192, False: 16384}

# FlashAttention-3's ping-pong (`wait_turn`) where it measured faster: d128's row-tile kernel on full calls
# below 32k queries (since session 76 it takes full calls from 16k only; in that session's run the turns were
# level there, 1.041-1.048 against 1.043-1.056, results/s76/call2) and d64's persistent variant. Forward
# alone, one H200, five alternating rounds, cuDNN's forward time ÷ ours without / with (results/s57/call1,
# call2): d128 full 2k-16k 0.949 / 0.982, 1.022 / 1.033, 1.042 / 1.057, 1.046 / 1.071, but 32k / 64k 1.064 /
# 1.053, 1.060 / 1.052 (causal 8k-16k 1.055 / 1.049, 1.082 / 1.065: causal d128 goes without); d64 persistent,
# causal 1k / 2k / 4k / 8k / 16k 0.933 / 0.983, 0.962 / 1.017, 0.975 / 1.024, 0.913 / 0.976, 0.951 / 1.006,
# full 1k / 4k / 16k 0.980 / 1.008, 0.959 / 0.989, 0.994 / 1.008. Session 38's turns on mbarriers, on 64-key
# tiles, had lost (0.89-1.01x).
# The block-sparse path keeps the configs without (unmeasured there).
# FLASHTRAIN_FWD_PINGPONG=0 turns them off (A/B runs).
PINGPONG = os.environ.get("FLASHTRAIN_FWD_PINGPONG", "1") != "0"
PINGPONG_CONFIGS = {
    64: dataclasses.replace(PERSISTENT_CONFIGS[64], pingpong=True),
    128: dataclasses.replace(CONFIGS[128], pingpong=True),
}


def config_for(headdim: int, seqlen_q: int, causal: bool) -> HopperFwdConfig:
    """The persistent variant where it measured faster: d64 causal calls of up to 4k queries and every full
    one; d128 below `PERSISTENT_BELOW_128`'s query counts (see `PERSISTENT_CONFIGS`). The others take the
    row-tile kernel (longer causal calls: it spreads their uneven tiles better). d256: the row-tile kernel.
    d64 alternating in one process, six rounds (results/s43/call4, one H200), TFLOP/s persistent /
    row-tile: causal 4k 388 / 389, full 4k 429 / 417. Where `PINGPONG_CONFIGS` has the chosen config with
    its consumers taking turns, that one."""
    if headdim == 128:
        if seqlen_q < PERSISTENT_BELOW_128[causal]:
            return PERSISTENT_CONFIGS[128]
        return PINGPONG_CONFIGS[128] if PINGPONG and not causal and seqlen_q < 32768 else CONFIGS[128]
    if headdim in PERSISTENT_CONFIGS and (not causal or seqlen_q <= 4096):
        return (
            PINGPONG_CONFIGS[headdim]
            if PINGPONG and headdim in PINGPONG_CONFIGS
            else PERSISTENT_CONFIGS[headdim]
        )
    return CONFIGS[headdim]


# FLASHTRAIN_HOPPER_FWD=0 sends every call to the portable forward (A/B measurements, a safety valve)
ENABLED = os.environ.get("FLASHTRAIN_HOPPER_FWD", "1") != "0"


# Shortest query length timed against the portable forward and found faster (`faster_here`); at 64 queries
# it lost at d64 and d256 (results/s41/call2)
MIN_SEQLEN_Q = 128


def faster_here(headdim: int, seqlen_q: int, causal: bool) -> bool:
    """Where these kernels (`config_for`'s choice) beat the portable one, forward alone (bf16, batch x
    seqlen = 16k tokens, benchmarks/NOTES_attention.md "Gluon forward", "Head dim 256", "Persistent
    forward", "Below 1k queries"): head dims 128 and 256 at every length measured (1k-16k, causal and
    full: 1.13-1.28x and 1.26-1.31x on an H200; 256 and 512 queries: 1.26-1.53x and 1.11-1.32x in
    kernel time, results/s40/call3; 128 queries: 1.11-1.39x and 1.01-1.19x, results/s41/call2); head dim
    64 from 128 queries (1.06-1.18x at 256 and 512, 1.08-1.52x at 128; the row-tile kernel had lost at
    1k, 0.82-0.92x; the persistent variant: 1.06-1.12x full, 1.10x causal at 1k, level at 4k on an H100;
    the row-tile kernel causal from 8k, 1.01-1.03x on an H200). At 64 queries it lost at d64 and d256
    (0.53-0.83x) and split d128 (0.93x causal, 1.08x full), so shorter calls keep the portable kernel."""
    return headdim in CONFIGS and seqlen_q >= MIN_SEQLEN_Q


def eligible(
    *, capability, dtype, headdim, seqlen_q, seqlen_k, win_left, win_right, key_padding, dropout_p, varlen,
    merge, rule=faster_here,
) -> bool:  # fmt: skip
    """Whether a forward call takes this kernel: a dense bf16/fp16 call on an sm_90 GPU, full or causal
    (window (None, 0)), without dropout, key padding or a merge, where `rule(headdim, seqlen_q, causal)`
    says it pays (the Hopper dq kernel passes its own)."""
    if capability != (9, 0) or dtype not in (torch.bfloat16, torch.float16) or headdim not in CONFIGS:
        return False
    if varlen or merge or key_padding or dropout_p != 0.0:
        return False
    if win_left is not None or win_right not in (None, 0):  # other windows: the portable kernel
        return False
    return seqlen_q > 0 and seqlen_k > 0 and rule(headdim, seqlen_q, win_right == 0)


def supports(q, k, v, *, win_left, win_right, key_padding_mask, dropout_p, varlen, merge) -> bool:
    """Whether this forward call takes this kernel (FLASHTRAIN_HOPPER_FWD not 0, and `usable`)."""
    return ENABLED and usable(
        q, k, v, win_left=win_left, win_right=win_right, key_padding_mask=key_padding_mask,
        dropout_p=dropout_p, varlen=varlen, merge=merge,
    )  # fmt: skip


def usable(
    q, k, v, *, win_left, win_right, key_padding_mask, dropout_p, varlen, merge, rule=faster_here, also=()
) -> bool:
    """`eligible` for these tensors (dense (batch, seqlen, heads, headdim) CUDA tensors that TMA can read);
    everything else takes the portable kernel. rule: as `eligible`'s (the backward kernels pass their
    own); also: more tensors TMA must read or write (the backward's dO and gradients)."""
    if INTERPRET or q.device.type != "cuda" or varlen:  # varlen q is (total, heads, headdim)
        return False
    ok = eligible(
        capability=compute_capability(q.device), dtype=q.dtype, headdim=q.shape[-1],
        seqlen_q=q.shape[1], seqlen_k=k.shape[1], win_left=win_left, win_right=win_right,
        key_padding=key_padding_mask is not None, dropout_p=dropout_p, varlen=varlen, merge=merge, rule=rule,
    )  # fmt: skip
    return ok and all_tma_ready((q, k, v, *also))


def flash_attn_forward_hopper(
    q, k, v, *, sm_scale: float, causal: bool, config: HopperFwdConfig | None = None, lists=None
):
    """(out, base-2 lse (B, H, Sq)) as `_flash_fwd.flash_attn_forward` returns them; the caller checked
    `supports`. config: None takes `config_for`'s. lists: a block-sparse call's (tiles, counts)
    (`kernels._block_sparse_hopper.row_lists`, for this config's rows and key tiles); lse is then in
    natural log."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    cfg = config or config_for(headdim, seqlen_q, causal)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (B, Sq, H, D), contiguous
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    grid = (cdiv(seqlen_q, cfg.block_m * cfg.consumers), nheads, batch)
    descriptors = ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (out, cfg.block_m))
    args = (lse, lse.stride(0), lse.stride(1), seqlen_q, seqlen_k, nheads // nheads_kv, sm_scale * LOG2E,
            *list_args(lists, lse, q.device, causal))  # fmt: skip
    constexprs = dict(
        CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        PRODUCER_REGS=cfg.producer_regs, SPARSE=lists is not None, PINGPONG=cfg.pingpong, V_STAGES=cfg.v_stages,
        num_warps=4,
    )  # fmt: skip
    if cfg.persistent:
        items = grid[0] * grid[1] * grid[2]
        _launch_fwd_persistent((min(items, sm_count(q.device)),), descriptors, (*args, *grid), constexprs)
    else:
        _launch_fwd(grid, descriptors, args, constexprs)
    return out, lse


_launch_fwd = CompiledLaunch(_attn_fwd_hopper, descriptor)
_launch_fwd_persistent = CompiledLaunch(_attn_fwd_hopper_persistent, descriptor)
