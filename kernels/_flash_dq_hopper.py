"""The backward's dq kernel for Hopper (sm_90) in Gluon: warp-specialised, TMA-fed, wgmma pipelined.

The portable dq kernel (`_flash_bwd._bwd_dq`) is a forward-shaped loop: a tile of query rows against
every key tile it sees, three products per key tile, dq summed in registers (deterministic, no atomics).
This kernel runs that loop on the Hopper forward's schedule (`_flash_fwd_hopper`): one producer warp
loads each consumer's Q and dO rows, then streams K and V tiles into a ring of shared-memory stages
with TMA; two consumer warpgroups of BLOCK_M query rows share the stages. Per key tile a consumer
issues, all asynchronous,

    S = Q K^T,  dP = dO V^T,  and the previous tile's dq += dS K,

so the tensor cores work through the elementwise part that follows (P = exp2(S * scale - lse) once S
is in, dS = P * (dP - delta) once dP is in), and hands the previous tile's stage back once its dq
product is done.

Like the portable kernel with DELTA_HERE it also computes its rows' delta = rowsum(dO * O) and stores it
for the dK/dV kernel, which runs after it. Scope as the Hopper forward: dense bf16/fp16, head dims 128
and 256 (see CONFIGS), full or causal (bottom-right), GQA; no dropout, window, key padding, varlen, lse
gradient or accumulation into fp32 buffers (the ring's steps): those take the portable kernel.

`_attn_bwd_dq_hopper_persistent` runs the same rows on at most one program per SM, each walking its
share of the row tiles with the next tile's Q, dO and K/V loads under this one's work (the forward's
persistent scheme). At d128, with two K/V stages, it loses on long lists (dense d128 0.62-0.93x) and
wins on block-sparse lists of one block per row (dq alone 1.24x); at block-sparse d64, three stages
either way, 1.09-1.34x at every density tried (benchmarks/NOTES_attention.md "A persistent dq kernel";
`_block_sparse_hopper.PERSISTENT_DQ`).
"""

from __future__ import annotations

import dataclasses
import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import _flash_dkdv_hopper as dkdv_hopper
from . import _flash_fwd_hopper as fwd_hopper
from . import _hopper_pipeline as pipeline
from ._common import LOG2E, cdiv, sm_count
from ._hopper_pipeline import (
    descriptor,
    key_tile,
    list_args,
    masked_scores,
    masked_steps,
    program_rows,
    stream_kv,
)
from ._launch import CompiledLaunch


@gluon.jit
def _producer(
    q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_ready, k_ready, v_ready, kv_empty,
    off_b, off_h, off_hk, m0, n_kv, tiles, SPARSE: gl.constexpr,
):  # fmt: skip
    """One warp: each consumer's Q and dO rows once, then the key tiles' K and V into the ring."""
    NUM_CONSUMERS: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    for c in gl.static_range(NUM_CONSUMERS):
        bar = qdo_ready.index(c)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        coord = [off_b, off_h, m0 + c * BLOCK_M, 0]
        tma.async_copy_global_to_shared(q_desc, coord, bar, q_smem.index(c))
        tma.async_copy_global_to_shared(do_desc, coord, bar, do_smem.index(c))
    stream_kv(
        k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, off_b, off_hk, n_kv, tiles, 0, SPARSE
    )


@gluon.jit
def _issue_scores(q, do, k_smem, v_smem, k_ready, v_ready, stage, phase, s_layout: gl.constexpr):
    """S = Q K^T and dP = dO V^T of the tile in `stage`, both asynchronous."""
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    BLOCK_M: gl.constexpr = q.shape[0]
    zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(k_ready.index(stage), phase)
    k_t = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(q, k_t, zeros, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(stage), phase)
    v_t = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    dp = warpgroup_mma(do, v_t, zeros, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _steps(
    dq, ds_op, lo, hi, n_kv, tiles, q, do, k_smem, v_smem, k_ready, v_ready, kv_empty, rows, lse, delta,
    seqlen_k, diag, qk_scale, ring0, CAUSAL: gl.constexpr, MASKED: gl.constexpr, SPARSE: gl.constexpr,
    s_layout: gl.constexpr, op_layout: gl.constexpr,
):  # fmt: skip
    """Steps i in [lo, hi) (key tile `key_tile(i)`, ring position ring0 + i): its S and dP issued, then
    tile i - 1's dq product (whose dS we hold in ds_op) beside its P and dS; tile i - 1's stage is
    released once that is done."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    for i in range(lo, hi):
        stage = (ring0 + i) % STAGES
        prev = (ring0 + i - 1) % STAGES
        phase = ((ring0 + i) // STAGES) & 1
        s, dp = _issue_scores(q, do, k_smem, v_smem, k_ready, v_ready, stage, phase, s_layout)
        dq = warpgroup_mma(ds_op, k_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
        s = warpgroup_mma_wait(2, deps=(s,))  # S is in; dP and the dq product may still run
        if MASKED:
            start_n = key_tile(tiles, i, n_kv, SPARSE) * BLOCK_N
            s = masked_scores(s, start_n, rows, seqlen_k, diag, CAUSAL, s_layout)
        p = gl.exp2(s * qk_scale - lse[:, None])
        dp = warpgroup_mma_wait(1, deps=(dp,))
        ds = p * (dp - delta[:, None])
        dq, ds_op = warpgroup_mma_wait(0, deps=(dq, ds_op))
        gl.thread_barrier()  # every warp of the group is past its products before the stage is handed back
        mbarrier.arrive(kv_empty.index(prev), count=1)
        ds_op = gl.convert_layout(ds.to(q.dtype), op_layout)
    return dq, ds_op


@gluon.jit
def _consumer(
    q_smem, do_smem, k_smem, v_smem, qdo_ready, k_ready, v_ready, kv_empty, dq_desc, O, LSE, DELTA,  # noqa: E741
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
    off_b, off_h, m0, n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, sm_scale,
    WG: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
):  # fmt: skip
    """One warpgroup: dq of query rows m0 + WG * BLOCK_M .. + BLOCK_M against the key tiles of steps 0 ..
    n_kv - 1 (`key_tile`; block-sparse, the first n_listed_masked need the element mask)."""
    _dq_rows(
        q_smem.index(WG), do_smem.index(WG), qdo_ready.index(WG), 0, k_smem, v_smem, k_ready, v_ready, kv_empty,
        dq_desc, O, LSE, DELTA, stride_ob, stride_om, stride_oh, stride_lb, stride_lh, off_b, off_h,
        m0 + WG * q_smem.shape[3], n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, sm_scale, 0,
        qdo_ready.index(WG), False, CAUSAL, SPARSE, False,
    )  # fmt: skip


@gluon.jit
def _dq_rows(
    q_buf, do_buf, qdo_bar, qdo_phase, k_smem, v_smem, k_ready, v_ready, kv_empty, dq_desc, O, LSE, DELTA,  # noqa: E741
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
    off_b, off_h, first_row, n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale, sm_scale, ring0,
    prev_qdo_empty, release_prev, CAUSAL: gl.constexpr, SPARSE: gl.constexpr, RELEASE: gl.constexpr,
):  # fmt: skip
    """A warpgroup's BLOCK_M query rows from first_row (Q and dO in shared memory q_buf and do_buf, (1, 1,
    BLOCK_M, HEAD_DIM) each, once qdo_bar completes phase qdo_phase) against the key tiles of steps 0 ..
    n_kv - 1, whose stages start at ring position ring0 (`stream_kv`): their delta stored, and dq
    stored through q_buf. RELEASE (the persistent kernel): the store is not waited for here; once step
    0's products are issued, wait for this warpgroup's last store (the previous item's dq, through its Q
    buffer) and, if release_prev, hand that item's Q and dO buffers back on prev_qdo_empty. Without
    RELEASE the store is done when this returns."""
    BLOCK_M: gl.constexpr = q_buf.shape[2]
    HEAD_DIM: gl.constexpr = q_buf.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    STAGES: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    tile_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte row pieces
    rows = first_row + gl.arange(0, BLOCK_M, layout=row_s)
    diag = seqlen_k - seqlen_q
    n_masked = masked_steps(n_kv, n_listed_masked, first_row, seqlen_k, diag, BLOCK_N, CAUSAL, SPARSE)

    lse_rows = off_b.to(gl.int64) * stride_lb + off_h * stride_lh + rows
    lse = gl.load(LSE + lse_rows, mask=rows < seqlen_q, other=0.0)
    if SPARSE:  # kernels.block_sparse_attention's lse is in natural log
        lse = lse * 1.4426950408889634  # log2(e)
    lse = gl.where(lse == float("-inf"), 0.0, lse)  # rows that saw no key: every score is masked anyway
    # delta = rowsum(dO * O) of this group's rows (rows past the sequence: dO and O are 0). O is loaded
    # before waiting for Q and dO, its latency under theirs: block-sparse fwd+bwd at n4k 1.00-1.01x at d64
    # and 1.01-1.04x at d128, where each program's item holds one or two key tiles (session 60, against
    # loading it after the wait; summing delta under step 0's products instead gained less)
    # The group's first row and its head are offset in int64, its rows from there in int32 (BLOCK_M rows),
    # so one sequence past 2**31 elements reads right without a build of its own
    o_base = O + off_b.to(gl.int64) * stride_ob + first_row.to(gl.int64) * stride_om
    o_base += off_h.to(gl.int64) * stride_oh
    o_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, tile_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, tile_layout))
    o_ptrs = o_base + o_rows[:, None] * stride_om + o_cols[None, :]
    o = gl.load(o_ptrs, mask=(first_row + o_rows < seqlen_q)[:, None], other=0.0)
    mbarrier.wait(qdo_bar, qdo_phase)
    q = q_buf.reshape([BLOCK_M, HEAD_DIM])
    do = do_buf.reshape([BLOCK_M, HEAD_DIM])
    delta = gl.sum(o.to(gl.float32) * do.load(tile_layout).to(gl.float32), axis=1)
    delta = gl.convert_layout(delta, row_s)
    gl.store(DELTA + lse_rows, delta, mask=rows < seqlen_q)

    # step 0 (always masked: the only step of n_kv = 1)
    s, dp = _issue_scores(
        q, do, k_smem, v_smem, k_ready, v_ready, ring0 % STAGES, (ring0 // STAGES) & 1, s_layout
    )
    if RELEASE:
        tma.store_wait(0)
        gl.thread_barrier()
        if release_prev:
            mbarrier.arrive(prev_qdo_empty, count=1)
    s = warpgroup_mma_wait(1, deps=(s,))
    s = masked_scores(s, key_tile(tiles, 0, n_kv, SPARSE) * BLOCK_N, rows, seqlen_k, diag, CAUSAL, s_layout)
    p = gl.exp2(s * qk_scale - lse[:, None])
    dp = warpgroup_mma_wait(0, deps=(dp,))
    ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(q.dtype), op_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    dq, ds_op = _steps(
        dq, ds_op, 1, n_masked, n_kv, tiles, q, do, k_smem, v_smem, k_ready, v_ready, kv_empty, rows, lse,
        delta, seqlen_k, diag, qk_scale, ring0, CAUSAL, True, SPARSE, s_layout, op_layout,
    )  # fmt: skip
    dq, ds_op = _steps(
        dq, ds_op, n_masked, n_kv, n_kv, tiles, q, do, k_smem, v_smem, k_ready, v_ready, kv_empty, rows, lse,
        delta, seqlen_k, diag, qk_scale, ring0, CAUSAL, False, SPARSE, s_layout, op_layout,
    )  # fmt: skip
    # the last tile's dq product
    last = (ring0 + n_kv - 1) % STAGES
    dq = warpgroup_mma(ds_op, k_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
    dq, ds_op = warpgroup_mma_wait(0, deps=(dq, ds_op))
    gl.thread_barrier()
    mbarrier.arrive(kv_empty.index(last), count=1)
    # dq through this group's Q buffer (no product reads it any more)
    coord = [off_b, off_h, first_row, 0]
    pipeline.store_rows((dq * sm_scale).to(q.dtype), q_buf, dq_desc, coord, not RELEASE)


@gluon.jit
def _attn_bwd_dq_hopper(
    q_desc, do_desc, k_desc, v_desc, dq_desc, O, LSE, DELTA,  # noqa: E741
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, PDL: gl.constexpr,
):  # fmt: skip
    """Descriptors as in `_attn_fwd_hopper` (4-D (batch, heads, seqlen, headdim) views; q's, do's and
    dq's blocks (1, 1, BLOCK_M, HEAD_DIM), k's and v's (1, 1, BLOCK_N, HEAD_DIM)); O is the forward's
    output (B, Sq, H, D) by pointer, LSE its base-2 lse, DELTA written here (both (B, H, Sq)).
    SPARSE: a block-sparse call (tile lists and natural-log lse, as in `_attn_fwd_hopper`).
    PDL: the dK/dV kernel comes next as a programmatic dependent launch; each program lets it launch
    at its start (its programs then start as these end, and wait for delta: `_flash_dkdv_hopper`)."""
    if PDL:
        pipeline.launch_dependents()
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    m0, off_h, off_hk, off_b, n_kv, n_masked, tiles = program_rows(
        sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS, lay_heads, n_list_rows, list_len,
        BLOCK_M * NUM_CONSUMERS, BLOCK_N, CAUSAL, SPARSE,
    )  # fmt: skip

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(
        do_desc.dtype, [NUM_CONSUMERS] + do_desc.block_type.shape, do_desc.layout
    )
    qdo_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(qdo_ready.index(c), count=1)
    k_smem, v_smem, k_ready, v_ready, kv_empty = pipeline.kv_ring(k_desc, v_desc, STAGES, NUM_CONSUMERS)

    # (partition tuples written out in the call: see _attn_fwd_hopper)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups")
    gl.warp_specialize(
        [
            (_consumer, (q_smem, do_smem, k_smem, v_smem, qdo_ready, k_ready, v_ready, kv_empty, dq_desc, O, LSE,
                         DELTA, stride_ob, stride_om, stride_oh, stride_lb, stride_lh, off_b, off_h, m0, n_kv,
                         tiles, n_masked, seqlen_q, seqlen_k, qk_scale, sm_scale, 0, CAUSAL, SPARSE)),
            (_consumer, (q_smem, do_smem, k_smem, v_smem, qdo_ready, k_ready, v_ready, kv_empty, dq_desc, O, LSE,
                         DELTA, stride_ob, stride_om, stride_oh, stride_lb, stride_lh, off_b, off_h, m0, n_kv,
                         tiles, n_masked, seqlen_q, seqlen_k, qk_scale, sm_scale, 1, CAUSAL, SPARSE)),
            (_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_ready, k_ready,
                         v_ready, kv_empty, off_b, off_h, off_hk, m0, n_kv, tiles, SPARSE)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


@gluon.jit
def _persistent_consumer(
    q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_empty, k_ready, v_ready, kv_empty, dq_desc, O, LSE, DELTA,  # noqa: E741
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_row_tiles, nheads, n_batch, WG: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
):  # fmt: skip
    """One warpgroup: rows WG * BLOCK_M .. + BLOCK_M of each work item of this program (`_consumer`'s
    work, item after item); dq through the item's Q buffer, whose store the next item waits for before
    handing the buffers back."""
    NUM_CONSUMERS: gl.constexpr = q_smem.shape[0] // 2
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    n_mine, programs, pid = pipeline.my_items(n_row_tiles * nheads * n_batch)
    ring0 = 0
    for j in range(n_mine):
        m0, off_h, off_hk, off_b, n_kv, n_listed_masked, tiles = pipeline.work_rows(
            j, programs, pid, n_row_tiles, nheads, n_batch, sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS,
            lay_heads, n_list_rows, list_len, BLOCK_M * NUM_CONSUMERS, BLOCK_N, CAUSAL, SPARSE,
        )  # fmt: skip
        buf = (j % 2) * NUM_CONSUMERS + WG
        prev = ((j + 1) % 2) * NUM_CONSUMERS + WG
        _dq_rows(
            q_smem.index(buf), do_smem.index(buf), qdo_ready.index(buf), (j // 2) & 1, k_smem, v_smem, k_ready,
            v_ready, kv_empty, dq_desc, O, LSE, DELTA, stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
            off_b, off_h, m0 + WG * BLOCK_M, n_kv, tiles, n_listed_masked, seqlen_q, seqlen_k, qk_scale,
            sm_scale, ring0, qdo_empty.index(prev), j > 0, CAUSAL, SPARSE, True,
        )  # fmt: skip
        ring0 += n_kv
    tma.store_wait(0)


@gluon.jit
def _attn_bwd_dq_hopper_persistent(
    q_desc, do_desc, k_desc, v_desc, dq_desc, O, LSE, DELTA,  # noqa: E741
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_row_tiles, nheads, n_batch,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, PDL: gl.constexpr,
):  # fmt: skip
    """`_attn_bwd_dq_hopper` on a 1-D grid of at most one program per SM, each walking its share of the
    work items of the (n_row_tiles, nheads, n_batch) grid (`_hopper_pipeline.my_items`), with two sets
    of Q and dO buffers so that the next item's load overlaps this one. PDL as `_attn_bwd_dq_hopper`'s."""
    if PDL:
        pipeline.launch_dependents()
    q_smem, do_smem, qdo_ready, qdo_empty = pipeline.item_buffers(q_desc, do_desc, NUM_CONSUMERS, True)
    k_smem, v_smem, k_ready, v_ready, kv_empty = pipeline.kv_ring(k_desc, v_desc, STAGES, NUM_CONSUMERS)

    # (partition tuples written out in the call: see _attn_fwd_hopper)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups")
    gl.warp_specialize(
        [
            (_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_empty, k_ready, v_ready,
                                    kv_empty, dq_desc, O, LSE, DELTA, stride_ob, stride_om, stride_oh, stride_lb,
                                    stride_lh, seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES,
                                    COUNTS, lay_heads, n_list_rows, list_len, n_row_tiles, nheads, n_batch, 0,
                                    CAUSAL, SPARSE)),
            (_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_empty, k_ready, v_ready,
                                    kv_empty, dq_desc, O, LSE, DELTA, stride_ob, stride_om, stride_oh, stride_lb,
                                    stride_lh, seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES,
                                    COUNTS, lay_heads, n_list_rows, list_len, n_row_tiles, nheads, n_batch, 1,
                                    CAUSAL, SPARSE)),
            (pipeline.persistent_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
                                              qdo_ready, qdo_empty, k_ready, v_ready, kv_empty, seqlen_q, seqlen_k,
                                              group, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
                                              n_row_tiles, nheads, n_batch, CAUSAL, SPARSE, True)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# configs and launcher
# ---------------------------------------------------------------------------------------------------


class HopperDqConfig(fwd_hopper.HopperFwdConfig):
    """One launch shape of `_attn_bwd_dq_hopper`: the forward's fields, the same roles (but for
    v_stages: K and V share one ring here)."""

    one_kv_ring = "the dq kernel's K and V share one ring"
    no_turns = "the dq kernel's consumers take no turns"


# Head dim 64 is left to the portable kernel: there the three products of a 64 x 128 tile are no longer
# than its exp2 and elementwise work, and this kernel measured 0.94-1.00x inside the backward
# (benchmarks/NOTES_attention.md, "Gluon dq"); its best config there was 64, 128, 2, 3, 240.
CONFIGS = {
    128: HopperDqConfig(block_m=64, block_n=64, consumers=2, stages=4, consumer_regs=240),
    # Q and dO of both consumers take 128 KB: 32-key tiles, three stages (64-key ones overflow shared memory)
    256: HopperDqConfig(block_m=64, block_n=32, consumers=2, stages=3, consumer_regs=240),
}

# The persistent variant (`_attn_bwd_dq_hopper_persistent`): two sets of Q and dO buffers (128 KB at
# d128) leave room for two K/V stages.
PERSISTENT_CONFIGS = {128: dataclasses.replace(CONFIGS[128], stages=2, persistent=True)}

# FLASHTRAIN_HOPPER_DQ=0 sends every backward to the portable dq kernel (A/B measurements, a safety valve)
ENABLED = os.environ.get("FLASHTRAIN_HOPPER_DQ", "1") != "0"


def faster_here(headdim: int, seqlen_q: int, causal: bool) -> bool:
    """Where this kernel beat the portable dq kernel inside the backward, on one H200 (bf16, batch x
    seqlen = 16k tokens): head dim 128 at 1k-16k, causal and full, 1.03-1.08x the whole backward; head
    dim 256 1.08-1.15x (with the portable dK/dV kernel). At 256 and 512 queries, with the dK/dV kernel
    (results/s40/call3, kernel time of fwd+bwd on the Gluon forward): 1.01-1.21x at d128, 1.30-1.45x at
    d256; shorter calls as the dK/dV kernel's rule (`_flash_dkdv_hopper.MIN_SEQLEN_Q`), measured with it."""
    return headdim in (128, 256) and dkdv_hopper.faster_here(headdim, seqlen_q, causal)


def reads_out(out) -> bool:
    """Whether this kernel can read `out` (dense and block-sparse calls alike): it reads it by pointer, so
    with a unit last stride (a sequence past 2**31 elements included: each row group starts at a 64-bit
    offset). Its other tensors go through TMA descriptors (64-bit strides)."""
    return out.stride(-1) == 1


def supports(q, k, v, do, out, dq, *, win_left, win_right, key_padding_mask, dropout_p, varlen) -> bool:
    """Whether this backward call's dq takes this kernel: what the Hopper forward takes (dense bf16/fp16
    on sm_90, full or causal, no dropout or key padding), with do, out and dq TMA/pointer-readable and
    where `faster_here` says it pays."""
    return ENABLED and reads_out(out) and fwd_hopper.usable(
        q, k, v, win_left=win_left, win_right=win_right, key_padding_mask=key_padding_mask,
        dropout_p=dropout_p, varlen=varlen, merge=False, rule=faster_here, also=(do, dq),
    )  # fmt: skip


def flash_attn_dq_hopper(
    q, k, v, do, out, lse, delta, dq, *, sm_scale: float, causal: bool, config=None, lists=None,
    dependent_dkdv: bool = False,
):  # fmt: skip
    """dq (stored into `dq`, q's shape and dtype, any TMA-readable strides) and delta = rowsum(dO * O)
    (stored into `delta`, laid out like lse) of one dense backward call; the caller checked `supports`.
    config: None takes CONFIGS[headdim]. lists: a block-sparse call's (tiles, counts)
    (`kernels._block_sparse_hopper.row_lists`), whose lse is in natural log. dependent_dkdv: the dK/dV
    kernel follows as a programmatic dependent launch (`_flash_dkdv_hopper.flash_attn_dkdv_hopper`'s
    `dependent`), which this kernel's programs let start as they begin."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    cfg = config or CONFIGS[headdim]
    rows = cfg.block_m * cfg.consumers
    grid = (cdiv(seqlen_q, rows), nheads, batch)
    descriptors = ((q, cfg.block_m), (do, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (dq, cfg.block_m))
    args = (out, lse, delta, out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
            seqlen_q, seqlen_k, nheads // nheads_kv, sm_scale * LOG2E, sm_scale,
            *list_args(lists, lse, q.device, causal))  # fmt: skip
    constexprs = dict(
        CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        PRODUCER_REGS=cfg.producer_regs, SPARSE=lists is not None, PDL=dependent_dkdv, num_warps=4,
    )  # fmt: skip
    if cfg.persistent:
        items = grid[0] * grid[1] * grid[2]
        _launch_dq_persistent((min(items, sm_count(q.device)),), descriptors, (*args, *grid), constexprs)
    else:
        _launch_dq(grid, descriptors, args, constexprs)
    return dq, delta


_launch_dq = CompiledLaunch(_attn_bwd_dq_hopper, descriptor)
_launch_dq_persistent = CompiledLaunch(_attn_bwd_dq_hopper_persistent, descriptor)
