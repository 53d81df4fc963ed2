"""The backward's dK/dV kernel for Hopper (sm_90) in Gluon: warp-specialised, TMA-fed, wgmma pipelined.

Like the portable `_flash_bwd._bwd_dkdv` it owns a tile of keys and loops over the query tiles that see
it, so dK and dV are summed in registers (deterministic, no atomics); the dq kernel, which writes delta =
rowsum(dO * O), runs before it. One producer warp loads each consumer's K and V rows once, then streams
Q and dO tiles (of every query head of the GQA group) through a ring of shared-memory stages with TMA,
each with its rows' lse and delta; two consumer warpgroups of BLOCK_N keys share the stages. Per query
tile a consumer issues

    S^T = K Q^T and dP^T = V dO^T      (both asynchronous; P^T = exp2(S^T * scale - lse) beside dP^T)
    dV += P^T dO                       (asynchronous; dS^T = P^T * (dP^T - delta) beside it)
    dK += dS^T Q

and hands the stage back once dK's product is done; the other warpgroup's products fill the tensor
cores meanwhile. Nothing is carried from one step to the next: at head dim 128 dK and dV alone hold 128
registers a thread, and a 64-query tile then leaves no room for a second step's scores. Even one step
fits the 240 registers only because S^T and dP^T start from -lse / scale and -delta (see `_steps`) and
the query tiles run in `sections`. Those two columns reach the consumers through shared memory (the
producer loads them, `_stream_qdo`): loaded from global memory at the top of each step, their latency
was the step's wait once the producer ran ahead (one H200, d128 n16k: the kernel 7.7% faster full, 9%
causal, 5-8% on block-sparse layouts; benchmarks/NOTES_attention.md "lse and delta through shared memory").
At head dim 256 dK and dV would hold 256 registers, so the kernel runs twice (`passes`): dV alone
(which needs no V, so its Q/dO tiles may be larger), then dK alone.

Scope as the Hopper dq kernel (`_flash_dq_hopper`). With SPARSE=True both walk a block-sparse layout's
tile lists instead of ranges, reading a natural-log lse (`kernels._block_sparse_hopper`). For short
lists, its persistent variant (`_flash_dkdv_persistent_hopper`) runs the same work on one program per
SM, each walking many key tiles' lists with the next one's K and V loads under the current one's steps.
With FUSED_DQ the consumers also add each step's dQ into global memory (`_flash_bwd_fused_hopper`: the opt-in
nondeterministic backward, and with ORDERED the deterministic one, whose adds into each dq tile come in
a fixed order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import _flash_fwd_hopper as fwd_hopper
from . import _fused_dq_hopper as fused_dq
from ._common import LOG2E, cdiv, sm_count, tile_program_ids
from ._hopper_pipeline import descriptor, list_args, listed_row_program, wait_for_prior_grid
from ._launch import CompiledLaunch


@gluon.jit
def _producer(
    q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready,
    qdo_empty, LSE, DELTA, lse_row0, stride_lh, off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k,
    qk_scale, CAUSAL: gl.constexpr, SPARSE: gl.constexpr, PART: gl.constexpr, HOT_FIRST: gl.constexpr = 0,
    ORDERED: gl.constexpr = False, rot=0, DOWN: gl.constexpr = False, kv_repeat=1, PDL: gl.constexpr = False,
):  # fmt: skip
    """One warp: each consumer's K and V rows once (K alone for the dV pass), then the Q and dO tiles
    lo .. hi - 1 of every query head of the group into the stage ring, with their rows' lse and delta,
    section by section (block-sparse: the hi tiles listed; HOT_FIRST: see `sections`). ORDERED (the
    ordered one-kernel backward): all (head, tile) items in one run, with full attention from item rot on
    and round to the items before it, with DOWN each head's tiles from the last (`_steps`). kv_repeat: K
    and V from head off_hk // kv_repeat (GQA run as MHA, `_attn_bwd_fused_hopper`). PDL: launched
    dependent on the dq kernel, which writes delta: the K and V loads go out first, then this warp waits
    for that kernel's end (the only reads of what it wrote are this warp's)."""
    NUM_CONSUMERS: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    for c in gl.static_range(NUM_CONSUMERS):
        coord = [off_b, off_hk // kv_repeat, n0 + c * BLOCK_N, 0]
        if PART == 1:  # dV = P^T dO needs no V
            mbarrier.expect(kv_ready.index(c), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, coord, kv_ready.index(c), k_smem.index(c))
        else:
            mbarrier.expect(kv_ready.index(c), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, coord, kv_ready.index(c), k_smem.index(c))
            tma.async_copy_global_to_shared(v_desc, coord, kv_ready.index(c), v_smem.index(c))
    if PDL:
        wait_for_prior_grid()
    stats = (LSE, DELTA, lse_row0, stride_lh, seqlen_q, qk_scale)
    it = 0  # (a variable: a literal 0 would be passed as a constant, and the loop changes it)
    if SPARSE:
        _stream_qdo(q_desc, do_desc, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, stats, off_b,
                    off_hk, group, it, 0, hi, tiles, SPARSE, PART)  # fmt: skip
    elif ORDERED:
        _stream_qdo(q_desc, do_desc, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, stats, off_b,
                    off_hk, group, it, lo, hi - lo, tiles, SPARSE, PART, not CAUSAL, rot, DOWN)  # fmt: skip
    else:
        for section in gl.static_range(HOT_FIRST, 3 + HOT_FIRST):  # the consumers' order (see `sections`)
            start, count = sections(
                n0, lo, hi, seqlen_q, seqlen_k, section % 3, CAUSAL, BLOCK_M, NUM_CONSUMERS * BLOCK_N
            )
            it = _stream_qdo(q_desc, do_desc, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, stats,
                             off_b, off_hk, group, it, start, count, tiles, SPARSE, PART)  # fmt: skip


@gluon.jit
def _stream_qdo(q_desc, do_desc, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, stats, off_b, off_hk,
                group, it, start, count, tiles, SPARSE: gl.constexpr, PART: gl.constexpr,
                ROTATED: gl.constexpr = False, rot=0, DOWN: gl.constexpr = False):  # fmt: skip
    """The Q and dO tiles of one section's steps (`_query_tile`) into the stage ring, from ring position it,
    and their rows' -lse / scale (base 2) and -delta, which the consumers' score products start from (see
    `_steps`); returns the position after them. A stage is ready when its TMA bytes have landed and this
    warp has arrived once more, after storing those rows. ROTATED: the steps start at step rot and wrap
    round to the ones before it. DOWN: each head's tiles from the last (`_query_tile`)."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    LSE, DELTA, lse_row0, stride_lh, seqlen_q, qk_scale = stats
    row_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    for j in range(count if SPARSE else group * count):
        stage = it % STAGES
        if ROTATED:
            step = j + rot
            t, g = _query_tile(
                tiles, gl.where(step >= group * count, step - group * count, step), start, count, SPARSE
            )
        else:
            t, g = _query_tile(tiles, j, start, count, SPARSE, DOWN)
        # the rows' statistics, read while the stage may still be in use (registers, not shared memory)
        rows = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        row0 = lse_row0 + (off_hk * group + g) * stride_lh
        in_seq = rows < seqlen_q  # (queries past the sequence: lse and delta 0, see `_steps`)
        lse = gl.load(LSE + row0 + rows, mask=in_seq, other=0.0)
        if SPARSE:  # kernels.block_sparse_attention's lse is in natural log
            lse = lse * 1.4426950408889634  # log2(e)
        # a query that saw no key has lse = -inf (only in a masked tile, where its scores are all
        # masked): any finite lse gives it P = 0
        lse = gl.where(lse == float("-inf"), 0.0, lse)
        if PART != 1:  # (the dV pass needs no delta)
            delta = gl.load(DELTA + row0 + rows, mask=in_seq, other=0.0)
        # a stage's first use passes at once: a fresh mbarrier counts as having completed phase 1
        mbarrier.wait(qdo_empty.index(stage), ((it // STAGES) & 1) ^ 1)
        coord = [off_b, off_hk * group + g, t * BLOCK_M, 0]
        bar = qdo_ready.index(stage)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, coord, bar, q_smem.index(stage))
        tma.async_copy_global_to_shared(do_desc, coord, bar, do_smem.index(stage))
        lse_smem.index(stage).store(0.0 - lse / qk_scale)
        if PART != 1:
            delta_smem.index(stage).store(0.0 - delta)
        gl.thread_barrier()  # every lane's rows are stored before the (one-thread) arrive releases them
        mbarrier.arrive(bar, count=1)
        it += 1
    return it


@gluon.jit
def _query_tile(tiles, j, start, count, SPARSE: gl.constexpr, DOWN: gl.constexpr = False):
    """(query tile, query head within the group) of a section's step j: dense, the section's tiles
    start .. start + count - 1 of each head in turn (DOWN: from the last down); block-sparse, entry
    start + j of the program's list (`kernels._block_sparse_hopper.col_lists`: head << 16 | tile)."""
    if SPARSE:
        entry = gl.load(tiles + start + j)
        return entry & 0xFFFF, entry >> 16
    elif DOWN:
        return start + count - 1 - j % count, j // count
    else:
        return start + j % count, j // count


@gluon.jit
def sections(n0, lo, hi, seqlen_q, seqlen_k, section: gl.constexpr, CAUSAL: gl.constexpr,
             BLOCK_M: gl.constexpr, KEYS: gl.constexpr):  # fmt: skip
    """(first query tile, number of tiles) of a program's section: 0 the tiles that meet its keys on the
    causal diagonal (masked), 1 the tiles that see all its keys, 2 the partial last tile (masked). Each
    section runs over every query head of the group before the next one starts: the masks' loop
    invariants then live through their own loop only (around a loop over heads they spilled). A program
    runs them in order 0, 1, 2, or with HOT_FIRST = 1 (the fused backward, `_flash_bwd_fused_hopper`) in
    order 1, 2, 0: its causal build then spilled 71 instructions in its loops instead of 100, the full
    tiles' loop one local load a step (results/s42/call9; causal fwd+bwd 1.02-1.06x, not 0.89-0.96x,
    the deterministic backward's at 4k-16k)."""
    full_hi = gl.maximum(seqlen_q // BLOCK_M, lo)
    # query i sees key j iff i >= j - (seqlen_k - seqlen_q): all the program's keys from its last one's row
    if CAUSAL:
        full_lo = gl.cdiv(gl.maximum(n0 + KEYS - 1 - (seqlen_k - seqlen_q), 0), BLOCK_M)
        full_lo = gl.minimum(gl.maximum(full_lo, lo), full_hi)
    else:
        full_lo = lo
    if section == 0:
        return lo, full_lo - lo
    elif section == 1:
        return full_lo, full_hi - full_lo
    else:
        return full_hi, hi - full_hi


@gluon.jit
def _steps(
    dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, keys, start, count, tiles,
    group, diag, qk_scale, CAUSAL: gl.constexpr, SECTION: gl.constexpr, SPARSE: gl.constexpr, PART: gl.constexpr,
    st_layout: gl.constexpr, acc_layout: gl.constexpr, n_partial=0, WG: gl.constexpr = 0,
    FUSED_DQ: gl.constexpr = False, dq_io=None, ORDERED: gl.constexpr = False, order=None, full_tiles=None,
    DOWN: gl.constexpr = False,
):  # fmt: skip
    """Query tiles start .. start + count - 1 of each query head of the group (head-major), all in one
    of `sections` (block-sparse: entries start .. start + count - 1 of the list; SECTION 3, its partial
    tiles, are masked as sections 0 and 2 both; SECTION 4, a whole list whose first n_partial entries are
    partial, masks step by step; SECTION 5, with FUSED_DQ, a dense causal program's whole range, whose
    steps outside the full tiles full_tiles = (first, end) are masked); `it` counts the steps taken (the
    stage ring's position). PART 0 sums dK and dV, 1 dV alone, 2 dK alone (the other one is passed
    through untouched). FUSED_DQ (PART 0, dense): each step's dQ too, added into fp32 global memory
    (`_flash_bwd_fused_hopper`, which gives dq_io; the dQ steps: `_fused_dq_hopper`); block-sparse, a
    whole list in one SECTION 4 loop, each step's dQ added to the item its entry names.
    ORDERED (with FUSED_DQ): every program of a key head adds each (head, tile) item's dQ in one fixed
    order, through a semaphore per item and consumer. The consumer only stages each step's dQ half in
    shared memory (`_fused_dq_hopper.fused_dq_stage`); a warp of its own (`_flash_bwd_fused_hopper.
    _releaser`) waits for the item's turn, adds it and counts it (order: the semaphores,
    `_flash_bwd_fused_hopper`'s rotation and rank arguments, and the staging barriers). Full attention
    (start 0, one loop): program p walks the items from item rot = p * spacing on, round to the ones
    before it, so at any step the programs of a key head are on different items, and each item's adders
    come in the order they reach it (`_fused_dq_hopper.ordered_rank_step`); in the convoy order (one key
    group, `_flash_bwd_fused_hopper`'s convoy) without the rotation, every item's adders in program order.
    The consumer follows the producer's stages and only tracks its tile where the causal mask needs it.
    Causal (SECTION 5, no rotation): see `_fused_dq_hopper.ordered_causal_rank`; DOWN (the causal
    convoy) walks each head's tiles from the last down to the diagonal's."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k.shape[0]
    MASKED: gl.constexpr = CAUSAL and SECTION != 1
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dq_tile, dq_head = start, 0  # (FUSED_DQ: the step's tile, counted along: no division by count)
    if DOWN:
        dq_tile = start + count - 1
    # (block-sparse with unordered dQ: the step's item, where its dQ is added)
    LIST_ITEM: gl.constexpr = SPARSE and FUSED_DQ and not ORDERED
    for j in range(count if SPARSE else group * count):
        stage = it % STAGES
        if MASKED or LIST_ITEM:
            if SECTION == 5:
                t = dq_tile
            else:
                t, g = _query_tile(tiles, j, start, count, SPARSE)
        if MASKED:  # this tile's queries (columns here), for the causal mask
            rows = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_layout)
            if FUSED_DQ:  # (keys: the first key, the rows' keys made here, not held through the loops)
                key_rows = keys + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            else:
                key_rows = keys
        mbarrier.wait(qdo_ready.index(stage), (it // STAGES) & 1)
        q = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        # the products start from -lse / scale and -delta instead of 0, so neither column is held in
        # registers through the step: S^T * scale - lse and dP^T - delta come out of the tensor cores.
        # The producer staged both columns with the tile: a load from global memory here would stall
        # each step for its latency
        zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        if FUSED_DQ:
            # keys past the sequence (dq_io[0]: their bias) start from -inf, so their P^T is 0: their K rows
            # are zeros, but exp2(0 - lse) may overflow, and dQ would get inf * 0
            s_init = lse_smem.index(stage).load(col_layout)[None, :] + dq_io[0][:, None]
        else:
            s_init = zeros + lse_smem.index(stage).load(col_layout)[None, :]
        s_t = warpgroup_mma(k, q.permute((1, 0)), s_init, is_async=True)
        if PART == 1:
            s_t = warpgroup_mma_wait(0, deps=(s_t,))
        else:
            neg_delta = delta_smem.index(stage).load(col_layout)
            dp_t = warpgroup_mma(v, do.permute((1, 0)), zeros + neg_delta[None, :], is_async=True)
            s_t = warpgroup_mma_wait(1, deps=(s_t,))  # S^T is in; dP^T may still run
        # queries past the sequence need no mask: their Q and dO rows are zeros (TMA fills them), lse and
        # delta 0, so P^T = 1 multiplies dO = 0 into dV and dS^T = 1 * (0 - 0) adds nothing to dK
        if MASKED:
            if SECTION == 4:
                s_t = gl.where(
                    (key_rows[:, None] <= rows[None, :] + diag) | (j >= n_partial), s_t, float("-inf")
                )
            elif SECTION == 5:  # (a uniform branch: the full tiles' steps skip the mask's work)
                if (t < full_tiles[0]) | (t >= full_tiles[1]):
                    s_t = gl.where(key_rows[:, None] <= rows[None, :] + diag, s_t, float("-inf"))
            else:
                s_t = gl.where(key_rows[:, None] <= rows[None, :] + diag, s_t, float("-inf"))
        p_t = gl.exp2(s_t * qk_scale)
        if PART == 0:
            p_op = gl.convert_layout(p_t.to(q.dtype), op_layout)
            dv = warpgroup_mma(p_op, do, dv, is_async=True)
            dp_t = warpgroup_mma_wait(1, deps=(dp_t,))  # dP^T - delta is in; dV may still run
            ds_t = (p_t * dp_t).to(q.dtype)
            ds_op = gl.convert_layout(ds_t, op_layout)
            dk = warpgroup_mma(ds_op, q, dk, is_async=True)
            if FUSED_DQ:
                dq = fused_dq.fused_dq_product(ds_t, it, dq_io, WG, BLOCK_M)
                dv, dk, p_op, ds_op, dq = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op, dq))
            else:
                dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
        elif PART == 1:
            p_op = gl.convert_layout(p_t.to(q.dtype), op_layout)
            dv = warpgroup_mma(p_op, do, dv, is_async=True)
            dv, p_op = warpgroup_mma_wait(0, deps=(dv, p_op))
        else:
            dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
            ds_op = gl.convert_layout((p_t * dp_t).to(q.dtype), op_layout)
            dk = warpgroup_mma(ds_op, q, dk, is_async=True)
            dk, ds_op = warpgroup_mma_wait(0, deps=(dk, ds_op))
        gl.thread_barrier()  # every warp of the group is past its products before the stage is handed back
        mbarrier.arrive(qdo_empty.index(stage), count=1)
        if FUSED_DQ:
            if ORDERED:
                fused_dq.fused_dq_stage(dq, it, dq_io, order, WG)
            elif SPARSE:
                fused_dq.fused_dq_store(dq, t, g, dq_io, WG)
            else:
                fused_dq.fused_dq_store(dq, dq_tile, dq_head, dq_io, WG)
        if FUSED_DQ and not SPARSE:
            if DOWN:
                wrap = dq_tile == start
                dq_tile = gl.where(wrap, start + count - 1, dq_tile - 1)
            else:
                wrap = dq_tile == start + count - 1
                dq_tile = gl.where(wrap, start, dq_tile + 1)
            dq_head += wrap.to(gl.int32)
        it += 1
    return dk, dv, it


@gluon.jit
def _consumer(
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready, qdo_empty, dk_desc, dv_desc,
    off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale, sm_scale,
    WG: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr, PART: gl.constexpr,
    FUSED_DQ: gl.constexpr = False, dq_io=None, HOT_FIRST: gl.constexpr = 0, ORDERED: gl.constexpr = False,
    order=None, DOWN: gl.constexpr = False,
):  # fmt: skip
    """One warpgroup: keys n0 + WG * BLOCK_N .. + BLOCK_N against query tiles lo .. hi - 1 of each query
    head of the group (block-sparse: the hi tiles listed, of which the first lo are partial); then dK
    (times the softmax scale) and dV through TMA stores (PART 1: dV alone, 2: dK alone). FUSED_DQ: dQ
    too (PART 0; dq_io: `_flash_bwd_fused_hopper`'s buffers, see `_fused_dq_hopper.fused_dq_product`). HOT_FIRST:
    the sections' order (`sections`). ORDERED: dQ added in a fixed order (see `_steps`, also DOWN)."""
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    st_layout: gl.constexpr = wgmma_layout(BLOCK_M)  # S^T, dP^T: keys x the step's queries
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)  # dK, dV
    first_key = n0 + WG * BLOCK_N
    keys = first_key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    diag = seqlen_k - seqlen_q
    KEYS: gl.constexpr = k_smem.shape[0] * BLOCK_N  # the program's keys (one BLOCK_N per consumer)
    mbarrier.wait(kv_ready.index(WG), 0)
    if FUSED_DQ:  # dQ's products read both consumers' K; keys past the sequence get P^T = 0
        mbarrier.wait(kv_ready.index(1 - WG), 0)
        key_bias = gl.where(
            first_key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout)) < seqlen_k,
            0.0,
            float("-inf"),
        )
        ds_smem, ds_ready, keys_free, dq_smem, dq_desc = dq_io
        if ORDERED:  # (the batch of its key group's dq buffer: `_flash_bwd_fused_hopper`)
            dq_b = order[6]
        else:
            dq_b = off_b
        dq_io = (key_bias, ds_smem, ds_ready, keys_free, dq_smem, dq_desc, k_smem, dq_b, off_hk * group,
                 sm_scale)  # fmt: skip
    k = k_smem.index(WG).reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.index(WG).reshape([BLOCK_N, HEAD_DIM])  # (the dV pass's v_smem is k_smem, never read)
    # a pass's other accumulator is a scalar it passes through: no registers held
    if PART == 1:
        dk = 0.0
    else:
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    if PART == 2:
        dv = 0.0
    else:
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    it = 0
    if SPARSE and FUSED_DQ:  # the whole list in one loop, its first lo entries masked (two loops spilled)
        dk, dv, it = _steps(
            dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, first_key, 0, hi, tiles,
            group, diag, qk_scale, CAUSAL, 4, SPARSE, PART, st_layout, acc_layout, lo, WG, FUSED_DQ, dq_io, ORDERED,
            order,
        )  # fmt: skip
    elif SPARSE:  # the partial tiles, then the full ones
        dk, dv, it = _steps(
            dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, keys, 0, lo, tiles,
            group, diag, qk_scale, CAUSAL, 3, SPARSE, PART, st_layout, acc_layout,
        )  # fmt: skip
        dk, dv, it = _steps(
            dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, keys, lo, hi - lo, tiles,
            group, diag, qk_scale, CAUSAL, 1, SPARSE, PART, st_layout, acc_layout,
        )  # fmt: skip
    elif ORDERED:  # (every tile in one loop: causal, the diagonal's and a partial last tile's steps masked)
        if CAUSAL:
            full_lo, n_full = sections(n0, lo, hi, seqlen_q, seqlen_k, 1, CAUSAL, BLOCK_M, KEYS)
            full_tiles = (full_lo, full_lo + n_full)
        else:
            full_tiles = None
        dk, dv, it = _steps(
            dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, first_key, lo, hi - lo,
            tiles, group, diag, qk_scale, CAUSAL, 5 if CAUSAL else 1, SPARSE, PART, st_layout, acc_layout, 0, WG,
            FUSED_DQ, dq_io, ORDERED, order, full_tiles, DOWN,
        )  # fmt: skip
    else:
        for section in gl.static_range(
            HOT_FIRST, 3 + HOT_FIRST
        ):  # (unrolled: three loops, each with its own masks)
            start, count = sections(n0, lo, hi, seqlen_q, seqlen_k, section % 3, CAUSAL, BLOCK_M, KEYS)
            dk, dv, it = _steps(
                dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty,
                first_key if FUSED_DQ else keys, start, count,
                tiles, group, diag, qk_scale, CAUSAL, section % 3, SPARSE, PART, st_layout, acc_layout, 0, WG,
                FUSED_DQ, dq_io,
            )  # fmt: skip
    if FUSED_DQ:  # the other consumer's dQ products are done reading this one's K before dK overwrites it
        keys_free = dq_io[3]
        gl.thread_barrier()
        mbarrier.arrive(keys_free, count=1)
        mbarrier.wait(keys_free, 0)
    _store_grads(dk, dv, k_smem.index(WG), v_smem.index(WG), dk_desc, dv_desc, [off_b, off_hk, first_key, 0],
                 sm_scale, PART)  # fmt: skip


@gluon.constexpr_function
def wgmma_layout(n):
    """A consumer warpgroup's wgmma accumulator layout for products n columns wide."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _store_grads(dk, dv, k_out, v_out, dk_desc, dv_desc, coord, sm_scale, PART: gl.constexpr):
    """dK (times the softmax scale) and dV through a warpgroup's K and V buffers k_out and v_out (no
    product reads them any more) to rows coord of dk and dv (PART 1: dV alone, through k_out; 2: dK
    alone); the TMA store clips the rows past the sequence. Done reading the buffers when this returns."""
    BLOCK_N: gl.constexpr = k_out.shape[2]
    HEAD_DIM: gl.constexpr = k_out.shape[3]
    if PART == 0:
        k_out.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(k_out.dtype))
        v_out.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(k_out.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, coord, k_out)
        tma.async_copy_shared_to_global(dv_desc, coord, v_out)
    elif PART == 1:
        k_out.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(k_out.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dv_desc, coord, k_out)
    else:
        k_out.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(k_out.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, coord, k_out)
    tma.store_wait(0)


@gluon.jit
def dense_program(
    sched_slots, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, KEYS: gl.constexpr, CAUSAL: gl.constexpr,
    REVERSED: gl.constexpr = False, block=1, key_groups=1,
):  # fmt: skip
    """A dense call's program: (first key n0, key head, batch, lo, hi), the query tiles lo .. hi - 1 that
    see its KEYS keys. (The first key tiles are seen by the most queries (causal), so the grid order is
    already heaviest first.) REVERSED, with sched_slots 0: a key head's key tiles split into key_groups
    runs of cdiv(tiles, key_groups) consecutive tiles, the runs in order (the heaviest first), each run's
    tiles in blocks of `block`, the last block first, each block's tiles in order (block 1: the run's last
    key tile first)."""
    pid_n, n_tiles, off_hk, off_b = tile_program_ids(sched_slots)
    if REVERSED:
        per_group = gl.cdiv(n_tiles, key_groups)
        group_first = pid_n // per_group * per_group  # (its run's first key tile and launch position)
        group_tiles = gl.minimum(per_group, n_tiles - group_first)
        in_group = pid_n - group_first
        first = in_group // block * block  # (launch position in its run of this program's block's first)
        pid_n = group_first + gl.maximum(group_tiles - first - block, 0) + in_group - first
    n0 = pid_n * KEYS
    hi = gl.cdiv(seqlen_q, BLOCK_M)
    if CAUSAL:  # queries before the first key's diagonal see none of this program's keys
        lo = gl.minimum(gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BLOCK_M, hi)
    else:
        lo = 0
    return n0, off_hk, off_b, lo, hi


@gluon.jit
def kv_buffers(k_desc, v_desc, NUM_CONSUMERS: gl.constexpr, PART: gl.constexpr):
    """Each consumer's K and V rows, loaded once (`_producer`), and their barriers, initialised:
    (k_smem, v_smem, kv_ready). The dV pass (PART 1) reads no V: its v_smem is k_smem."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_CONSUMERS] + k_desc.block_type.shape, k_desc.layout)
    if PART == 1:
        v_smem = k_smem
    else:
        v_smem = gl.allocate_shared_memory(
            v_desc.dtype, [NUM_CONSUMERS] + v_desc.block_type.shape, v_desc.layout
        )
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(kv_ready.index(c), count=1)
    return k_smem, v_smem, kv_ready


@gluon.jit
def _qdo_ring(q_desc, do_desc, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, PART: gl.constexpr):
    """The Q/dO stage ring the producer streams and both consumers read (`_stream_qdo`, `_steps`), with
    per stage its query rows' -lse / scale and -delta (the dV pass needs no delta: lse's buffer stands
    in) and its ready (TMA loads and producer) and empty (one per consumer) barriers:
    (q_smem, do_smem, lse_smem, delta_smem, ready, empty)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # (indexed by stage: 1-D)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout)
    delta_smem = (
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout) if PART != 1 else lse_smem
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=2)  # the TMA loads' arrival and the producer's
        mbarrier.init(empty.index(i), count=NUM_CONSUMERS)
    return q_smem, do_smem, lse_smem, delta_smem, ready, empty


@gluon.jit
def _attn_bwd_dkdv_hopper(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, PART: gl.constexpr = 0, PDL: gl.constexpr = False,
):  # fmt: skip
    """Descriptors are 4-D (batch, heads, seqlen, headdim) views: q's and dO's blocks (1, 1, BLOCK_M,
    HEAD_DIM), k's, v's, dk's and dv's (1, 1, BLOCK_N, HEAD_DIM). A program owns NUM_CONSUMERS * BLOCK_N
    keys of one key head. PART 0 computes dK and dV; wide heads run the kernel twice, PART 1 (dV alone,
    no V loaded) then PART 2 (dK alone), so each pass holds one fp32 accumulator in registers. LSE
    (base 2) and DELTA are (B, H, Sq) fp32. SPARSE: a block-sparse call, whose query tiles come from
    TILES (key heads of the layout, n_list_rows, list_len) and COUNTS (same, 2: tiles listed, partial
    ones among them), as `kernels._block_sparse_hopper.col_lists` builds them, and whose LSE is in
    natural log; dense calls pass any pointer there (never read). PDL: launched as a programmatic
    dependent launch of the dq kernel, whose delta the producer waits for (`_producer`)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    # block-sparse: grid order, key heads (group 1); lo, hi: the partial tiles first, the tiles listed
    if SPARSE:
        n0, off_hk, _, off_b, hi, lo, tiles = listed_row_program(
            TILES, COUNTS, lay_heads, n_list_rows, list_len, 1, BLOCK_N * NUM_CONSUMERS
        )
    else:
        n0, off_hk, off_b, lo, hi = dense_program(sched_slots, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N * NUM_CONSUMERS,
                                                  CAUSAL)  # fmt: skip
        tiles = TILES

    k_smem, v_smem, kv_ready = kv_buffers(k_desc, v_desc, NUM_CONSUMERS, PART)
    q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty = _qdo_ring(
        q_desc, do_desc, STAGES, NUM_CONSUMERS, PART
    )

    # (partition tuples written out in the call: see `_flash_fwd_hopper._attn_fwd_hopper`)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups")
    gl.warp_specialize(
        [
            (_consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready, qdo_empty,
                         dk_desc, dv_desc, off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale,
                         sm_scale, 0, CAUSAL, SPARSE, PART)),
            (_consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready, qdo_empty,
                         dk_desc, dv_desc, off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale,
                         sm_scale, 1, CAUSAL, SPARSE, PART)),
            (_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                         kv_ready, qdo_ready, qdo_empty, LSE, DELTA, off_b.to(gl.int64) * stride_lb, stride_lh,
                         off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale, CAUSAL, SPARSE,
                         PART, 0, False, 0, False, 1, PDL)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# configs and launcher
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HopperDkdvConfig(fwd_hopper.HopperFwdConfig):
    """One launch shape of `_attn_bwd_dkdv_hopper`: the forward's fields with the roles of the two tiles
    swapped (block_n keys per consumer warpgroup, wgmma's M: 64; block_m queries per streamed Q/dO
    tile; stages: Q/dO tiles in flight). dv_block_m, dv_stages: the dV pass's own (`passes`: it holds
    no V, so larger Q/dO tiles fit there); None takes block_m, stages."""

    dv_block_m: int | None = None
    dv_stages: int | None = None

    one_kv_ring = "the dK/dV kernel streams Q and dO, not K and V"
    no_turns = "the dK/dV kernel's consumers take no turns"

    def for_pass(self, part: int) -> HopperDkdvConfig:
        """The launch shape of pass `part` (0 both gradients, 1 dV, 2 dK)."""
        if part != 1:
            return self
        return replace(self, block_m=self.dv_block_m or self.block_m, stages=self.dv_stages or self.stages)


CONFIGS = {
    # (d64: its 64-wide heads leave registers for a step of 128 queries, S^T and dP^T 64 x 128, whose
    # products are twice as long as 64 queries' (one H200: the backward 0.94-1.08x 64-query tiles on four
    # stages, 1.02x at the median of 14 timings; GPT-2 medium 8k 1.01x: results/s34/call5))
    64: HopperDkdvConfig(block_m=128, block_n=64, consumers=2, stages=2, consumer_regs=240),
    128: HopperDkdvConfig(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240),
    # two passes (`passes`): the dK pass holds K and V (128 KB), so 32-query Q/dO tiles (64 spill); the dV
    # pass holds K alone and streams 64-query tiles (one H200: its backward 1.02-1.07x the one with 32)
    # (a producer of 32 registers: at 24 its loads of the rows' lse and delta spilled in the dK pass)
    256: HopperDkdvConfig(block_m=32, block_n=64, consumers=2, stages=2, consumer_regs=240, producer_regs=32,
                          dv_block_m=64, dv_stages=2),
}  # fmt: skip

# FLASHTRAIN_HOPPER_DKDV=0 sends every backward to the portable dK/dV kernel (A/B measurements)
ENABLED = os.environ.get("FLASHTRAIN_HOPPER_DKDV", "1") != "0"

# Where the Gluon dq kernel runs just before this one (the two-kernel backward, dense or block-sparse) on at
# most DEPENDENT_MAX_ITEMS_PER_SM of its 128-row work items per SM, this kernel launches as its programmatic
# dependent launch (`flash_attn_dkdv_hopper`'s `dependent`, `dependent_after_dq`): launch, barrier set-up and
# the first K and V loads under the dq kernel's last work. On one H200, block-sparse fwd+bwd from CUDA graphs
# (butterfly, 16 heads, batch 1: 512 dq items, 3.9 an SM), dependent ÷ ordinary at n4k 0.972-0.991 (d128, 3-24%)
# and 0.981-0.997 (d64, 3-49%), two runs alike (results/s88/call1/, call3/); at n16k (2048 items) 0.97-1.05,
# within that run's spread (its ordinary timings 1-9% apart between alternations) and more often slower
# (results/s88/call2/, call3/), so longer calls keep the ordinary launch. Dense calls follow the same rule on the
# same kernels, untimed with it (those that qualify hold at most ~4k tokens of 16 heads, host-bound eagerly; the
# issue's 16k-token shapes stay ordinary). (The dq kernel's programs letting it
# launch late instead, each at its last item: level, results/s88/call3/late_trigger.patch.)
# FLASHTRAIN_DEPENDENT_DKDV=0: the ordinary launch everywhere (A/B measurements, a safety valve).
DEPENDENT_AFTER_DQ = os.environ.get("FLASHTRAIN_DEPENDENT_DKDV", "1") != "0"
DEPENDENT_MAX_ITEMS_PER_SM = 4
DQ_ITEM_ROWS = 128  # (a dq work item's query rows: two consumer warpgroups of 64, every config)


def dependent_after_dq(q) -> bool:
    """Whether this call's dK/dV kernel launches dependent on the Gluon dq kernel just before it (the caller's
    two-kernel route): `DEPENDENT_AFTER_DQ`, and the dq kernel's work items (128-row query tiles of every head
    and sequence of q, (batch, seqlen_q, nheads, headdim)) at most DEPENDENT_MAX_ITEMS_PER_SM per SM."""
    if not DEPENDENT_AFTER_DQ:
        return False
    batch, seqlen_q, nheads = q.shape[:3]
    return cdiv(seqlen_q, DQ_ITEM_ROWS) * nheads * batch <= DEPENDENT_MAX_ITEMS_PER_SM * sm_count(q.device)


# Shortest query length per (head dim, causal) from which the Gluon backward measured faster than the
# portable kernels: d128 and d256 this kernel with the Gluon dq kernel (whose rule reads this too), timed
# together at 64-512 queries (results/s40/call3, s41/call2; d128 causal at 128: 0.98x); d64 this kernel
# alone, level or slower below 1k
MIN_SEQLEN_Q = {
    (64, False): 1024, (64, True): 1024,
    (128, False): 128, (128, True): 256,
    (256, False): 128, (256, True): 128,
}  # fmt: skip


def faster_here(headdim: int, seqlen_q: int, causal: bool) -> bool:
    """Where this kernel beat the portable dK/dV kernel, on one H200 (bf16, batch x seqlen = 16k tokens;
    benchmarks/NOTES_attention.md "Gluon backward", "Below 1k queries"): head dim 128 at 1k-16k, the causal
    backward 1.05-1.09x the one with the Hopper dq kernel alone (one call), full fwd+bwd 375-459 -> 406-498
    TFLOP/s (two calls); head dim 256 (two passes) 1.11-1.20x the backward with the Hopper dq kernel
    alone, 1.23-1.32x the portable one (one call); at 256 and 512 queries, with the dq kernel, fwd+bwd
    1.01-1.21x (d128) and 1.30-1.45x (d256) in kernel time (results/s40/call3); at 128 queries 1.13x
    (d128 full; causal 0.98x, so from 256) and 1.33-1.35x (d256), at 64 queries 0.74-0.78x (d128) and
    level (d256) (results/s41/call2). Head dim 64 since its lse and delta come through shared memory
    (session 33, one call, with the portable dq kernel): the backward 1.04-1.09x causal and 1.08-1.13x
    full at 1k-16k, 1.10x on GPT-2 medium's packed layer at 8k; at 128-512 queries level or slower
    (fwd+bwd 0.92-1.02x at 256 and 512, 0.89-0.95x at 128), so it starts at 1k."""
    shortest = MIN_SEQLEN_Q.get((headdim, causal))
    return shortest is not None and seqlen_q >= shortest


def supports(q, k, v, do, dk, dv, *, win_left, win_right, key_padding_mask, dropout_p, varlen) -> bool:
    """Whether this backward call's dK/dV take this kernel: what the Hopper forward takes (dense
    bf16/fp16 on sm_90, full or causal, no dropout or key padding), with do, dk and dv TMA-readable and
    where `faster_here` says it pays."""
    return ENABLED and fwd_hopper.usable(
        q, k, v, win_left=win_left, win_right=win_right, key_padding_mask=key_padding_mask,
        dropout_p=dropout_p, varlen=varlen, merge=False, rule=faster_here, also=(do, dk, dv),
    )  # fmt: skip


def flash_attn_dkdv_hopper(
    q, k, v, do, dk, dv, lse2, delta, *, sm_scale: float, causal: bool, config=None, lists=None,
    dependent: bool = False,
):  # fmt: skip
    """dK, dV into dk, dv (shaped like k, v; TMA-ready) given delta from the dq kernel. The caller
    checked `_flash_dq_hopper.supports` for the call, and dk, dv. lists: a block-sparse call's (tiles,
    counts) (`kernels._block_sparse_hopper.col_lists`), whose lse (passed as lse2) is in natural log.
    dependent: launched as a programmatic dependent launch of the dq kernel just launched with
    `dependent_dkdv` (`dependent_after_dq` says where): its programs start as the dq kernel's end, their K and V
    loads under that kernel's last work, and wait for its delta (of two passes, the first: the second
    follows it the ordinary way)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    config = config or CONFIGS[headdim]
    grid = (cdiv(seqlen_k, config.consumers * config.block_n), nheads_kv, batch)
    args = (lse2, delta, lse2.stride(0), lse2.stride(1), seqlen_q, seqlen_k, nheads // nheads_kv,
            sm_scale * LOG2E, sm_scale, *list_args(lists, lse2, q.device, causal))  # fmt: skip
    views = {}  # (the passes read the same tensors in other tiles)
    launch = _launch_dkdv
    if config.persistent:  # (block-sparse lists, one pass: the kernel asserts both)
        launch = persistent_dkdv.launch
        args = (*args, *grid)
        grid = (min(grid[0] * grid[1] * grid[2], sm_count(q.device)),)
    for i, part in enumerate(passes(headdim)):
        cfg = config.for_pass(part)
        pdl = dependent and i == 0
        launch(
            grid,
            ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (do, cfg.block_m), (dk, cfg.block_n),
             (dv, cfg.block_n)),
            args,
            dict(CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                 PRODUCER_REGS=cfg.producer_regs, SPARSE=lists is not None, PART=part, PDL=pdl, num_warps=4,
                 launch_pdl=pdl),
            views,
        )  # fmt: skip
    return dk, dv


_launch_dkdv = CompiledLaunch(_attn_bwd_dkdv_hopper, descriptor)


def passes(headdim: int) -> tuple[int, ...]:
    """The kernel's PART per launch: one pass for both gradients up to head dim 128; above it dK and dV
    of 64 keys would hold 256 fp32 registers a thread, so dV (1), then dK (2), each with one."""
    return (0,) if headdim <= SPLIT_ABOVE else (1, 2)


SPLIT_ABOVE = 128


# (last: the persistent variant's kernel walks this module's steps)
from . import _flash_dkdv_persistent_hopper as persistent_dkdv  # noqa: E402
