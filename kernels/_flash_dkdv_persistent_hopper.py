"""The dK/dV kernel's persistent variant for Hopper (sm_90) in Gluon, for block-sparse calls' short lists.

`_attn_bwd_dkdv_hopper_persistent` runs the work of `_flash_dkdv_hopper._attn_bwd_dkdv_hopper` (a 128-key
program of one key head walking its `col_lists` entry) on a 1-D grid of at most one program per SM: each
walks its share of the key tiles' lists, with two sets of K and V buffers so that the next item's loads run
under this one's steps, and the Q/dO stage ring carried from item to item. Its steps are the grid kernel's
(`_flash_dkdv_hopper._steps`, `_stream_qdo`); `kernels._block_sparse_hopper.PERSISTENT_DKDV` says where it
runs (moved out of `_flash_dkdv_hopper` in session 63, unchanged).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import _flash_dkdv_hopper as dkdv
from . import _hopper_pipeline as pipeline
from ._hopper_pipeline import descriptor
from ._launch import CompiledLaunch


@gluon.jit
def _my_items(work):
    """(items of this program, programs, this program) of the grid of work items (`_hopper_pipeline.my_items`).
    work: the kernel's (seqlen_q, seqlen_k, TILES, COUNTS, lay_heads, n_list_rows, list_len, n_key_tiles,
    nheads_kv, n_batch)."""
    n_key_tiles, nheads_kv, n_batch = work[7], work[8], work[9]
    return pipeline.my_items(n_key_tiles * nheads_kv * n_batch)


@gluon.jit
def _item(j, programs, pid, work, NUM_CONSUMERS: gl.constexpr, BLOCK_N: gl.constexpr):
    """This program's work item j (`_hopper_pipeline.work_rows` on the key tiles' lists): its first key n0,
    key head, batch, list length hi, partial entries lo and list."""
    seqlen_q, seqlen_k, TILES, COUNTS, lay_heads, n_list_rows, list_len, n_key_tiles, nheads_kv, n_batch = (
        work
    )
    n0, off_hk, _, off_b, hi, lo, tiles = pipeline.work_rows(
        j, programs, pid, n_key_tiles, nheads_kv, n_batch, 0, seqlen_q, seqlen_k, 1, TILES, COUNTS, lay_heads,
        n_list_rows, list_len, BLOCK_N * NUM_CONSUMERS, BLOCK_N, False, True,
    )  # fmt: skip
    return n0, off_hk, off_b, hi, lo, tiles


@gluon.jit
def _persistent_producer(
    q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, kv_empty,
    qdo_ready, qdo_empty, LSE, DELTA, stride_lb, stride_lh, group, qk_scale, work, PDL: gl.constexpr,
):  # fmt: skip
    """One warp: per work item (`_flash_dkdv_hopper._producer`'s program), each consumer's K and V rows into
    the item's buffers, once the consumers have stored the item two before through them, then the Q and dO
    tiles listed into the stage ring, which goes on from the last item's. PDL: the first item's K and V
    loads go out before the wait for the dq kernel's delta (`_flash_dkdv_hopper._producer`)."""
    NUM_CONSUMERS: gl.constexpr = k_smem.shape[0] // 2
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    seqlen_q = work[0]
    n_mine, programs, pid = _my_items(work)
    it = 0
    for j in range(n_mine):
        n0, off_hk, off_b, hi, _, tiles = _item(j, programs, pid, work, NUM_CONSUMERS, BLOCK_N)
        pipeline.load_item_rows(
            k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, j, off_b, off_hk, n0, True
        )
        if PDL:
            if j == 0:
                pipeline.wait_for_prior_grid()
        stats = (LSE, DELTA, off_b.to(gl.int64) * stride_lb, stride_lh, seqlen_q, qk_scale)
        it = dkdv._stream_qdo(q_desc, do_desc, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, stats,
                              off_b, off_hk, group, it, 0, hi, tiles, True, 0)  # fmt: skip


@gluon.jit
def _persistent_consumer(
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, kv_empty, qdo_ready, qdo_empty, dk_desc,
    dv_desc, group, qk_scale, sm_scale, work, WG: gl.constexpr, CAUSAL: gl.constexpr,
):  # fmt: skip
    """One warpgroup: keys WG * BLOCK_N .. + BLOCK_N of each work item of this program
    (`_flash_dkdv_hopper._consumer`'s work on a block-sparse list, item after item); dK and dV through the
    item's K and V buffers, which go back to the producer once the stores have read them."""
    NUM_CONSUMERS: gl.constexpr = k_smem.shape[0] // 2
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    st_layout: gl.constexpr = dkdv.wgmma_layout(q_smem.shape[3])  # S^T, dP^T: keys x the step's queries
    acc_layout: gl.constexpr = dkdv.wgmma_layout(HEAD_DIM)  # dK, dV
    diag = work[1] - work[0]  # (seqlen_k - seqlen_q)
    n_mine, programs, pid = _my_items(work)
    it = 0
    for j in range(n_mine):
        n0, off_hk, off_b, hi, lo, tiles = _item(j, programs, pid, work, NUM_CONSUMERS, BLOCK_N)
        buf = (j % 2) * NUM_CONSUMERS + WG
        first_key = n0 + WG * BLOCK_N
        keys = first_key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        mbarrier.wait(kv_ready.index(buf), (j // 2) & 1)
        k = k_smem.index(buf).reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.index(buf).reshape([BLOCK_N, HEAD_DIM])
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        # the whole list in one loop, its partial tiles (the first lo) masked step by step: with a loop
        # over them and one over the full tiles, as the grid kernel runs, calls whose first loop ran no
        # step read shared memory out of range (one H200, results/s36/call5-8)
        dk, dv, it = dkdv._steps(
            dk, dv, it, k, v, q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty, keys, 0, hi, tiles,
            group, diag, qk_scale, CAUSAL, 4, True, 0, st_layout, acc_layout, n_partial=lo,
        )  # fmt: skip
        dkdv._store_grads(dk, dv, k_smem.index(buf), v_smem.index(buf), dk_desc, dv_desc,
                          [off_b, off_hk, first_key, 0], sm_scale, 0)  # fmt: skip
        gl.thread_barrier()  # every warp's share of the stores has been read before the buffers go back
        mbarrier.arrive(kv_empty.index(buf), count=1)


@gluon.jit
def _attn_bwd_dkdv_hopper_persistent(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, qk_scale, sm_scale, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_key_tiles, nheads_kv, n_batch,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, SPARSE: gl.constexpr, PART: gl.constexpr = 0, PDL: gl.constexpr = False,
):  # fmt: skip
    """`_flash_dkdv_hopper._attn_bwd_dkdv_hopper` for block-sparse calls (SPARSE, PART 0) on a 1-D grid of at most one
    program per SM, each walking its share of the (n_key_tiles, nheads_kv, n_batch) grid's work items
    (`_hopper_pipeline.my_items`), with two sets of K and V buffers so that the next item's loads run
    under this one's steps and stores; the Q/dO stage ring runs on from item to item. Short lists are
    where this pays: a program of the grid kernel loads K and V, waits for them, and stores dK and dV
    with the tensor cores idle, once per handful of steps. (sched_slots: the grid kernel's argument,
    unused here.) PDL: launched dependent on the dq kernel, as the grid kernel's."""
    gl.static_assert(SPARSE and PART == 0, "block-sparse lists, both gradients in one pass")
    # K and V: this item's and the next one's (`_hopper_pipeline.item_buffers`, V where the dq kernel has dO)
    k_smem, v_smem, kv_ready, kv_empty = pipeline.item_buffers(k_desc, v_desc, NUM_CONSUMERS, True)
    q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty = dkdv._qdo_ring(
        q_desc, do_desc, STAGES, NUM_CONSUMERS, PART
    )
    # (what both partitions walk the work items by: `_my_items`, `_item`)
    work = (
        seqlen_q,
        seqlen_k,
        TILES,
        COUNTS,
        lay_heads,
        n_list_rows,
        list_len,
        n_key_tiles,
        nheads_kv,
        n_batch,
    )

    # (partition tuples written out in the call: see `_flash_fwd_hopper._attn_fwd_hopper`)
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups")
    gl.warp_specialize(
        [
            (_persistent_consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, kv_empty,
                                    qdo_ready, qdo_empty, dk_desc, dv_desc, group, qk_scale, sm_scale, work, 0,
                                    CAUSAL)),
            (_persistent_consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, kv_empty,
                                    qdo_ready, qdo_empty, dk_desc, dv_desc, group, qk_scale, sm_scale, work, 1,
                                    CAUSAL)),
            (_persistent_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                                    delta_smem, kv_ready, kv_empty, qdo_ready, qdo_empty, LSE, DELTA, stride_lb,
                                    stride_lh, group, qk_scale, work, PDL)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


launch = CompiledLaunch(_attn_bwd_dkdv_hopper_persistent, descriptor)
