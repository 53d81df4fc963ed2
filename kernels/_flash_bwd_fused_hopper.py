"""The whole backward in one Gluon kernel on Hopper (sm_90): the dK/dV kernel that also adds each step's dQ.

The default backward runs two kernels, dq (`_flash_dq_hopper`) and dK/dV (`_flash_dkdv_hopper`), each
summing its gradient in registers, so the dq kernel recomputes S and dP: 7 products of the attention
matrix's size against the 5 a single kernel needs. Here the dK/dV kernel's consumers also run FlashAttention-3's
dQ step (`_fused_dq_hopper.fused_dq_product`): each writes its dS^T (its 64 keys x the step's queries)
to shared memory, and once both have, each multiplies all 128 keys' dS by its half of K's columns and
adds that half of the step's dQ tile into an fp32 buffer in global memory with a TMA reduce-add. Those
adds arrive in no fixed order, so dq differs from run to run in its last bits: this path is opt-in
(`kernels.flash_attention(..., deterministic=False)`), as the issue asks of any atomic variant.

With ORDERED (deterministic calls, `supports_ordered`) each dq tile's adds come in one fixed order, so dq
repeats bit for bit (the FlashAttention-3 and cuDNN deterministic modes' idea: a semaphore per tile
counting the adds done). The order has to follow the programs' own pace, or they would queue at every
tile. With full attention program p of a key head walks the query tiles from tile p * spacing on and
round (spacing = tiles // programs, >= 2), so at any step the programs are on different tiles, and a
tile's adders come in the order they reach it, each 2 steps after the last
(`_fused_dq_hopper.ordered_rank_step`). Causal programs need no rotation: each starts on its own
diagonal, so a later program (later keys) reaches a tile they share 2 steps or more before the one
before it, and a tile's adders come in descending program order (`_fused_dq_hopper.ordered_causal_rank`;
the diagonal's steps run in the same loop, masked). The consumers do not wait for the order: each only
stages its step's dQ half in shared memory (`_fused_dq_hopper.fused_dq_stage`), and a warp of the
program's own per consumer (`_releaser`) adds it once the tile's semaphore counts the
adders before it, and counts the add once it is complete in global memory, with a GPU-scope release (a
relaxed count let later adds overtake it, session 46). Until session 52 the consumers waited for the
turn and the add's completion themselves: one H200, five rounds alternating, the backward alone against
the two deterministic kernels (results/s52/call3, call4) went from 1.068-1.102x to 1.083-1.127x at causal
16k-64k and from 1.103-1.113x to 1.121-1.147x at full 4k-64k, where the unordered kernel's time is
now 0.96-1.01x its own (0.93-0.98x before). A program may wait on
any other of its key head, so all of them must run at once: `supports_ordered` allows at most half the
SMs' worth. Full attention past two such key groups, and causal calls past one without GQA up to 64k
tokens, take the convoy order instead (`ordered_convoy`): each program walks its tiles in order and
each tile's adds come in the order the programs started, so a program waits only on ones started before
it (causal past 20k each program walks its tiles from the last down, `causal_convoy_walks_down`).

Scope: what the Hopper dK/dV kernel takes, at head dim 128, full attention and causal from 4k queries
(`supports`; ordered: `supports_ordered`; a call asking for atomic dq that the ordered kernel takes runs that one
where it measured faster, `ordered_is_faster`), dense; and block-sparse calls' long lists
(`kernels._block_sparse_hopper.ONE_KERNEL_BACKWARD`, SPARSE). delta = rowsum(dO * O) comes from the portable
preprocess (`_flash_bwd.backward_delta`) before the launch, and dq from the fp32 buffer after it. The
unordered causal consumers run the full tiles' section first (`_flash_dkdv_hopper.sections`, HOT_FIRST),
which spills less in that build.

Measured on one H200 (bf16, batch x seqlen = 16k tokens, 16 heads; benchmarks/NOTES_attention.md "The
one-kernel backward"): the backward alone against the deterministic two kernels, alternating, 1.08-1.13x
causal at 4k-16k and 1.14-1.16x full at 8k-16k (results/s42/call11); fwd+bwd in the issue's benchmark
0.93-1.04x SDPA cuDNN full and 0.91-1.05x causal from 4k (results/s42/call10). The adds' round trip
through shared memory costs ~0.75 ms at 16k (results/s42/call5). Ordered (results/s44/call8, one H200,
the backward alone, alternating): 0.95-0.97x the unordered kernel and 1.02 / 1.10 / 1.11 / 1.09x the two
deterministic kernels at full 1k / 2k / 4k / 8k; its gradients repeated bit for bit in every check.
Ordered causal: see ORDERED_CAUSAL_FROM.
"""

from __future__ import annotations

import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import _flash_dkdv_hopper as dkdv
from . import _fused_dq_hopper as fused_dq
from ._common import LOG2E, cdiv, is_int, sched_slots_for, sm_count
from ._grad_sums import sum_key_groups
from ._hopper_pipeline import descriptor, listed_row_program
from ._launch import CompiledLaunch, TmaView


@gluon.jit
def _attn_bwd_fused_hopper(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, LSE, DELTA, stride_lb, stride_lh,
    seqlen_q, seqlen_k, group, kv_repeat, qk_scale, sm_scale, sched_slots, SEM, key_groups, convoy_block,
    TILES, COUNTS, RANKS, lay_heads, n_list_rows, list_len,
    CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, ORDERED: gl.constexpr = False, CONVOY: gl.constexpr = False,
    DOWN: gl.constexpr = False, SPARSE: gl.constexpr = False, FIRST_STORES: gl.constexpr = False,
):  # fmt: skip
    """`_flash_dkdv_hopper._attn_bwd_dkdv_hopper` (dense, PART 0) with dQ: dq_desc views the fp32 dq buffer
    as `dq_view` gives it, a block being one consumer's dQ half of a query tile: (batch, 2 x heads, seqlen,
    headdim / 2) in blocks (1, 1, BLOCK_M, headdim / 2), or ORDERED with its rows paired (batch, seqlen / 8, 4, 2,
    heads x headdim) in blocks (1, BLOCK_M / 8, 4, 2, headdim / 2) (`_fused_dq_hopper.dq_coord`, `stage_dq_half`);
    LSE is base 2. ORDERED (causal: seqlen_q == seqlen_k): each (query head,
    tile) item's dQ halves are added in one fixed order, through SEM, int32 zeros (key_groups x batch,
    heads, query tiles, 2): one semaphore per item and half, counting the adds done (`_steps`). The
    programs of a key head split into key_groups runs of consecutive programs, each adding into its own
    dq buffer (dq_desc's batch key_group x batch + b), so only one run's programs wait on each other.
    CONVOY (`ordered_convoy`): full attention (key_groups 1), every program walks the items from the
    first, and each item's adds come in program order, so each program waits only on programs started
    before it; causal, each key group's programs (`ordered_dq_groups`; the heaviest group first)
    start in blocks of convoy_block key tiles, the group's last block first, each block's in order
    (`dkdv.dense_program`'s REVERSED), and the causal order of adds (descending programs, within a key
    group) is the same as without it: a program waits on its group's programs of earlier blocks, started
    before it, and on the later ones of its own block, started after it (so a block holds at most half
    the SMs' worth, as a key group does; with convoy_block 1 it waits only on started programs). DOWN
    (causal CONVOY): each program walks each head's query tiles from the last down to its diagonal's, so
    a program and the one started before it read a tile a launch interval apart instead of that plus two
    steps (`causal_convoy_walks_down`); the order of adds is the same.
    SPARSE: a block-sparse call (key_groups 1, no CONVOY or DOWN), whose query tiles come from TILES and
    COUNTS as in `_flash_dkdv_hopper._attn_bwd_dkdv_hopper` (LSE in natural log); ORDERED, each item's
    adders in key-tile order, which is the grid's: RANKS (shaped as TILES) gives, per list entry, how
    many key tiles before this program's list the entry's item (`_sparse_releases`). Dense calls pass
    any pointer for TILES, COUNTS and RANKS (never read).
    FIRST_STORES (ORDERED): each item's first adder (rank 0) stores its dQ half instead of adding it, so
    the dq buffer needs zeros only where no program adds (`dq_buffer`).
    kv_repeat: K and V's heads each serve kv_repeat of the grid's key heads (GQA run as MHA): the program
    of key head h reads K / V head h // kv_repeat and stores its own dK / dV at head h (dk_desc, dv_desc
    have the grid's heads), which the host sums; 1 otherwise."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    KEYS: gl.constexpr = BLOCK_N * NUM_CONSUMERS
    gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups, each computing half of dQ's columns")
    gl.static_assert(not (SPARSE and (CONVOY or DOWN)), "block-sparse lists add in their own order")
    if SPARSE:  # (grid order; lo: the partial tiles, first in the list of hi)
        n0, off_hk, _, off_b, hi, lo, tiles = listed_row_program(
            TILES, COUNTS, lay_heads, n_list_rows, list_len, 1, KEYS
        )
    else:
        # (causal CONVOY: a key head's programs start in blocks, the last block first, `causal_convoy_block`)
        n0, off_hk, off_b, lo, hi = dkdv.dense_program(
            sched_slots, seqlen_q, seqlen_k, BLOCK_M, KEYS, CAUSAL, CAUSAL and CONVOY, convoy_block, key_groups
        )  # fmt: skip
        tiles = TILES
    if ORDERED and SPARSE:
        staged, free = _handover_barriers(NUM_CONSUMERS)
        n_query_tiles = gl.cdiv(seqlen_q, BLOCK_M)
        sem_off = (off_b * gl.num_programs(1) + off_hk) * (group * n_query_tiles * 2)
        ranks = RANKS + ((off_hk % lay_heads) * n_list_rows + gl.program_id(0)).to(gl.int64) * list_len
        # (the order tuple's shape is the dense one's: the consumers read dq_b, staged and free from it)
        order = (SEM, sem_off, ranks, n_query_tiles, 0, 0, off_b, 0, staged, free)
        rot = 0
    elif ORDERED:  # (grid order, sched_slots 0: programs of a key head, then key heads, then batches)
        n_items = group * hi  # (query head, tile) items
        all_programs = gl.cdiv(seqlen_k, KEYS)
        per_group = gl.cdiv(all_programs, key_groups)
        key_group = n0 // KEYS // per_group
        program = n0 // KEYS - key_group * per_group  # (within its key group)
        programs = gl.minimum(per_group, all_programs - key_group * per_group)
        dq_b = key_group * gl.num_programs(2) + off_b
        sem_off = (dq_b * gl.num_programs(1) + off_hk) * (n_items * 2)
        if CAUSAL or CONVOY:  # (no rotation: causal programs are spaced by their own starts,
            # `fused_dq.ordered_causal_rank`; in the convoy each waits on the one started before it, `_releaser`)
            spacing = 0
            rot = 0
        else:  # (lo = 0)
            spacing = n_items // programs  # the host asks for >= 2
            rot = program * spacing
        staged, free = _handover_barriers(NUM_CONSUMERS)
        order = (SEM, sem_off, programs - 1 - program, spacing, n_items - programs * spacing, rot, dq_b,
                 n0 // KEYS, staged, free)  # fmt: skip
    else:
        rot = 0
        order = 0

    k_smem, v_smem, kv_ready = dkdv.kv_buffers(k_desc, v_desc, NUM_CONSUMERS, 0)
    q_smem, do_smem, lse_smem, delta_smem, qdo_ready, qdo_empty = dkdv._qdo_ring(
        q_desc, do_desc, STAGES, NUM_CONSUMERS, 0
    )
    # dS^T of each consumer, two steps' worth (buffer 2 * (step % 2) + consumer), and each consumer's
    # dQ half on its way to the reduce-add
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], q_desc.dtype)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_CONSUMERS, BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(
        dq_desc.dtype, [NUM_CONSUMERS] + dq_desc.block_type.shape, dq_desc.layout
    )
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    keys_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=NUM_CONSUMERS)
    mbarrier.init(keys_free.index(0), count=NUM_CONSUMERS)
    dq_io = (ds_smem, ds_ready, keys_free.index(0), dq_smem, dq_desc)

    # (partition tuples written out in the call: see `_flash_fwd_hopper._attn_fwd_hopper`); ORDERED adds
    # two partitions, each consumer's warp that adds its dQ halves in order and counts them (`_releaser`)
    gl.warp_specialize(
        [
            (dkdv._consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready, qdo_empty,
                              dk_desc, dv_desc, off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale,
                              sm_scale, 0, CAUSAL, SPARSE, 0, True, dq_io, 1, ORDERED, order, DOWN)),
            (dkdv._consumer, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, qdo_ready, qdo_empty,
                              dk_desc, dv_desc, off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale,
                              sm_scale, 1, CAUSAL, SPARSE, 0, True, dq_io, 1, ORDERED, order, DOWN)),
            (dkdv._producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                              kv_ready, qdo_ready, qdo_empty, LSE, DELTA, off_b.to(gl.int64) * stride_lb, stride_lh,
                              off_b, off_hk, n0, group, lo, hi, tiles, seqlen_q, seqlen_k, qk_scale, CAUSAL, SPARSE,
                              0, 1, ORDERED, rot, DOWN, kv_repeat)),
            (_releaser, (order, lo, hi, group, dq_smem, dq_desc, off_hk * group, 0, CAUSAL, CONVOY, DOWN,
                              KEYS // BLOCK_M, SPARSE, tiles, FIRST_STORES)),
            (_releaser, (order, lo, hi, group, dq_smem, dq_desc, off_hk * group, 1, CAUSAL, CONVOY, DOWN,
                              KEYS // BLOCK_M, SPARSE, tiles, FIRST_STORES)),
        ][: 3 + 2 * ORDERED],
        [4, 1, 1, 1][: 2 + 2 * ORDERED],
        [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS, PRODUCER_REGS][: 2 + 2 * ORDERED],
    )  # fmt: skip


@gluon.jit
def _handover_barriers(NUM_CONSUMERS: gl.constexpr):
    """The ordered backward's hand-over barriers, initialised: per consumer, (staged) its step's dQ half
    staged in its buffer (consumer -> its releasing warp) and (free) the buffer free again (the warp's
    add has read it)."""
    staged = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(staged.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    return staged, free


@gluon.jit
def _releaser(
    order, lo, hi, group, dq_smem, dq_desc, head0, WG: gl.constexpr, CAUSAL: gl.constexpr,
    CONVOY: gl.constexpr, DOWN: gl.constexpr, TILES_PER_PROGRAM: gl.constexpr, SPARSE: gl.constexpr = False,
    tiles=None, FIRST_STORES: gl.constexpr = False,
):  # fmt: skip
    """One warp of the ordered one-kernel backward per consumer warpgroup WG: item by item in the
    consumer's order (`_steps`; full attention from item rot round, causal from its first: rot 0), once
    the consumer has staged its dQ half (`fused_dq.fused_dq_stage`), waits until the item's semaphore for that half
    counts the programs that add before this one (`fused_dq.ordered_causal_rank`, `ordered_rank_step`; the convoy:
    its program index), adds the half into dq by TMA, frees the buffer once the add has read it, and once
    the add is complete in global memory counts it with a GPU-scope release add, which lets the item's
    next adder go. (Each count it sees was made by a release add after the adds it counts were complete,
    so an add issued once the count is seen reaches L2 after them.)
    Why the consumers only stage: when they waited for the turn, for the add's completion and for the
    count's slot themselves (session 46's design), Nsight Compute's warp sampling of the ordered causal
    16k backward (one H200, results/s52/call2) put 3.6% of one consumer's samples on the completion wait
    alone, and the other waited for it at the dS^T exchange twice as long as in the unordered kernel.
    Why a release add: a relaxed count let a later add overtake one it counted (session 46,
    results/s46/call1, call3).
    SPARSE: a block-sparse program's, entry by entry of its list of hi (`_sparse_releases`).
    FIRST_STORES: an item's first add (rank 0) is a TMA store (`_add_in_turn`)."""
    if SPARSE:
        _sparse_releases(order, hi, tiles, dq_smem, dq_desc, head0, WG, FIRST_STORES)
    else:
        _dense_releases(
            order, lo, hi, group, dq_smem, dq_desc, head0, WG, CAUSAL, CONVOY, DOWN, TILES_PER_PROGRAM, FIRST_STORES
        )  # fmt: skip


@gluon.jit
def _dense_releases(
    order, lo, hi, group, dq_smem, dq_desc, head0, WG: gl.constexpr, CAUSAL: gl.constexpr,
    CONVOY: gl.constexpr, DOWN: gl.constexpr, TILES_PER_PROGRAM: gl.constexpr, FIRST_STORES: gl.constexpr,
):  # fmt: skip
    """`_releaser` of a dense program."""
    SEM, sem_off, later_programs, spacing, extra, rot, dq_b, program, staged, free = order
    BLOCK_M: gl.constexpr = dq_smem.shape[-2] * dq_smem.shape[-3] * dq_smem.shape[-4]  # (`dq_view`'s blocks)
    count = hi - lo
    items = group * count
    rank = 0  # programs that add into this item before this one
    for j in range(items):
        step = j + rot
        t, g = dkdv._query_tile(None, gl.where(step >= items, step - items, step), lo, count, False, DOWN)
        sem = SEM + sem_off + (g * hi + t) * 2 + WG
        if CAUSAL:
            rank = fused_dq.ordered_causal_rank(t, program, later_programs, TILES_PER_PROGRAM)
        elif CONVOY:  # (the programs before this one, in the key head's one key group)
            rank = program
        else:
            rank = fused_dq.ordered_rank_step(rank, j, later_programs, spacing, extra)
        _add_in_turn(sem, rank, j, staged, free, dq_smem, dq_desc, dq_b, 2 * (head0 + g) + WG, t * BLOCK_M, WG,
                     FIRST_STORES)  # fmt: skip


@gluon.jit
def _sparse_releases(
    order, count, tiles, dq_smem, dq_desc, head0, WG: gl.constexpr, FIRST_STORES: gl.constexpr
):
    """`_releaser` of a block-sparse program: entry by entry of its list (the consumers' order), once the
    consumer has staged the entry's dQ half, waits until the item's semaphore counts the key tiles before
    this one that list the item (order's ranks, `_block_sparse_hopper.col_ranks`), adds the half, frees
    the buffer once the add has read it, and counts the add with a GPU-scope release once it is complete
    in global memory. A program waits only on programs of its key head with lower key tiles, started
    before it (grid order), so none waits on one that cannot run."""
    SEM, sem_off, ranks, n_query_tiles, _, _, dq_b, _, staged, free = order
    BLOCK_M: gl.constexpr = dq_smem.shape[-2] * dq_smem.shape[-3] * dq_smem.shape[-4]  # (`dq_view`'s blocks)
    for j in range(count):
        entry = gl.load(tiles + j)
        t = entry & 0xFFFF
        g = entry >> 16
        rank = gl.load(ranks + j)
        sem = SEM + sem_off + (g * n_query_tiles + t) * 2 + WG
        _add_in_turn(sem, rank, j, staged, free, dq_smem, dq_desc, dq_b, 2 * (head0 + g) + WG, t * BLOCK_M, WG,
                     FIRST_STORES)  # fmt: skip


@gluon.jit
def _add_in_turn(
    sem, rank, j, staged, free, dq_smem, dq_desc, dq_b, half_head, row, WG: gl.constexpr, FIRST_STORES: gl.constexpr
):  # fmt: skip
    """A releasing warp's step j: once its consumer has staged the step's dQ half (staged) and the item's
    count sem has reached rank, adds the half into dq at its tile (`fused_dq.dq_coord` of batch dq_b, view
    head half_head, first row `row`; FIRST_STORES: the item's first adder, rank 0,
    stores it), frees the buffer once the add has read it, and counts the add with a GPU-scope release once
    it is complete in global memory.
    Why the first add may store: the buffer's zero fill then goes (a dq-sized fp32 write, ~35 us at 16k
    tokens of 16 heads of 128). Session 47 had the consumers branch between store and add, which cost 4-8%
    in their loop (results/s47/call1); here it is this warp's, off the consumers' path. Both ops are
    issued, one on rows past the buffer, instead of a branch between them: with the branch the sm_90
    builds spilled 6-13 instructions in the consumers' loops (none without; session 63, CPU builds)."""
    seen = _load_acquire(sem)  # (read before the consumer's half is staged: its latency hidden)
    mbarrier.wait(staged.index(WG), j & 1)
    while seen != rank:
        seen = _load_acquire(sem)
    tile = dq_smem.index(WG)
    if FIRST_STORES:  # (both issued, the one not meant aimed past the buffer, where TMA writes nothing)
        first = rank == 0
        stored = fused_dq.dq_coord(dq_b, half_head, gl.where(first, row, _PAST_ROWS), tile)
        tma.async_copy_shared_to_global(dq_desc, stored, tile)
        row = gl.where(first, _PAST_ROWS, row)
    fused_dq.tma_reduce_add(dq_desc, fused_dq.dq_coord(dq_b, half_head, row, tile), tile)
    tma.store_wait(0)  # (its source read: the consumer may stage the next step's)
    mbarrier.arrive(free.index(WG), count=1)
    _bulk_wait_all()  # (complete in global memory)
    gl.thread_barrier()
    gl.atomic_add(sem, 1, sem="release", scope="gpu")


# A row coordinate past any dq buffer (TMA's coordinates are int32): a box there is wholly out of bounds (with
# the rows paired, `dq_view`, its row group 1 << 27 is too)
_PAST_ROWS = gl.constexpr(1 << 30)


@gluon.jit
def _load_acquire(ptr):
    """ptr's int32, loaded with GPU-scope acquire semantics (Gluon's load has none)."""
    return gl.inline_asm_elementwise(
        "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _bulk_wait_all():
    """cp.async.bulk.wait_group 0: this thread's bulk copies and reduces are complete in global memory
    (Gluon's `tma.store_wait` is the .read form: their sources read)."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


# FLASHTRAIN_FUSED_BWD=0 sends deterministic=False calls to the deterministic Gluon kernels instead
ENABLED = os.environ.get("FLASHTRAIN_FUSED_BWD", "1") != "0"

# Per head dim, the dK/dV kernel's config (two consumers of 64 keys, each owning half of dQ's columns).
# d128 only: d64 (64-query tiles, three stages: its own config's 128-query tiles spill here) measured
# 0.98-1.00x the default backward at 4k-16k and 1.09x at causal 16k in one run (results/s42/call1),
# against a default whose dq kernel is the portable one. Again in session 55 on 64-query steps and two
# stages (no spills; `benchmarks/ab_fused_bwd.py --headdim 64 --fused-configs 64:2`), one H200, 16 heads:
# the backward alone, ordered, 1.02-1.06x the two kernels at causal 8k-64k and full 4k-32k, 0.93-0.99x at
# causal 2k-4k (results/s55/call1-2); but GPT-2 medium 8k trained slower with it, 125.3k / 125.3k
# tokens/s against 126.9k / 126.6k on the two kernels (alternating, results/s55/call3), so d64 stays off.
CONFIGS = {128: dkdv.CONFIGS[128]}


def supports(headdim: int, causal: bool, seqlen_q: int) -> bool:
    """Whether a call that `_flash_dkdv_hopper.supports` takes runs here when asked for atomic dq: head
    dim 128 (CONFIGS), full attention, and causal from CAUSAL_FROM queries. One H200, fwd+bwd against the
    deterministic two kernels (results/s42/call9): causal 0.93x at 1k, 1.04x / 1.06x / 1.02x at 4k / 8k / 16k."""
    return headdim in CONFIGS and (not causal or seqlen_q >= CAUSAL_FROM)


CAUSAL_FROM = 4096


def ordered_is_faster(headdim: int, causal: bool, seqlen_q: int, seqlen_k: int, group: int, sms: int) -> bool:
    """Whether a call asking for atomic dq (deterministic=False) that `supports` takes runs the ordered kernel
    instead, because that measured faster, where `supports_ordered` takes it: causal at every length (with
    ORDERED_OVER_UNORDERED_CAUSAL), full attention from ORDERED_OVER_UNORDERED_FULL_FROM. Timed at the
    H200's power cap (settled, three rounds, fwd+bwd, 16 heads, 16k tokens a call), the ordered kernel ÷ the
    unordered one's time: causal 4k / 8k / 10k 0.946-0.957 / 0.979-0.989 / 0.989-0.999 per round; from 12k the
    unordered one led (12k / 14k / 16k / 32k / 64k 1.020-1.026 / 1.026-1.027 / 1.013-1.028 / 1.004-1.011 /
    1.021-1.027), and with full attention (4k-16k 1.002-1.024, 32k-64k level; results/s83/call3-5). The
    unordered kernel draws more power per unit of work (its dQ adds in every step, from every program at
    once; at causal 4k 1530 MHz against the ordered kernel's 1635 at the same ~692 W), which is what a call at
    the cap pays for. Since the ordered kernel's conflict-free dQ staging (session 84) and its key groups' dq
    sum in one pass (session 86), full attention 4k / 8k / 16k / 32k / 64k 0.974 / 0.981 / 0.992 / 0.972 /
    0.980 (cuDNN ÷ each, the same rounds; results/s84/call6, s86/call2-3); causal 16k / 32k level (0.997 /
    1.000, s84, before the sum), 64k 1.026 (s86/call2). Since the causal convoy's three key groups (session 87,
    `ordered_dq_groups`): causal 24k / 32k / 64k 0.992 / 0.989 / 0.989, every round 0.982-0.997 (cuDNN ÷ each
    1.066 / 1.067 / 1.071 against 1.058 / 1.056 / 1.059; results/s87/call4), and 12k / 16k (two key groups) /
    20k (the convoy) 0.997 / 0.995 / 0.983, every round 0.982-0.9996 (results/s87/call5). So causal calls take
    it at every length it takes (4k-64k measured; with 2 query heads a key head, not timed against each other)."""
    if not supports_ordered(headdim, causal, seqlen_q, seqlen_k, group, sms):
        return False
    if causal:
        return ORDERED_OVER_UNORDERED_CAUSAL
    return seqlen_q >= ORDERED_OVER_UNORDERED_FULL_FROM


# (A/B runs: False keeps causal deterministic=False calls on the unordered kernel)
ORDERED_OVER_UNORDERED_CAUSAL = True
ORDERED_OVER_UNORDERED_FULL_FROM = 4096  # (shorter full calls: not measured against each other)

# FLASHTRAIN_ORDERED_BWD=0 keeps deterministic calls on the two Gluon kernels (dq, then dK/dV)
ORDERED_ENABLED = os.environ.get("FLASHTRAIN_ORDERED_BWD", "1") != "0"


def supports_ordered(headdim: int, causal: bool, seqlen_q: int, seqlen_k: int, group: int, sms: int) -> bool:
    """Whether a deterministic call that `_flash_dkdv_hopper.supports` takes runs here with its dQ adds in
    a fixed order: head dim 128, full attention, or causal from ORDERED_CAUSAL_FROM queries on as many keys
    (`_fused_dq_hopper.ordered_causal_rank` counts on each program's first query tile being its
    diagonal's) in at most ORDERED_CAUSAL_KEY_GROUPS key groups, with at most ORDERED_CAUSAL_MAX_GROUP
    query heads a key head, or past them in the convoy order (`ordered_convoy`, without GQA), and
    - at most MAX_KEY_GROUPS key groups (`ordered_key_groups`): the programs (128 keys each) that add
      into one dq buffer wait on each other, so all of them must be able to run at once, and a key
      group holds at most half the SMs' worth (sms: the GPU's SMs). Programs start in grid order, so only
      the last key group started can wait on one not yet started, and the other SMs finish theirs and
      free their places. Half the SMs leaves that true beside a kernel that holds up to half of them
      (another stream's, another process's under MPS);
    - full attention, at least 2 query tiles (64 rows, of all the group's heads) per program of a key
      group: programs start 2 items apart, so an item's next adder gets there 2 steps after the last one,
      and does not wait (causal programs are spaced by their own starts: `ordered_causal_rank`), and at
      most ORDERED_ROTATION_MAX_GROUP query heads a key head;
    - or full attention past MAX_KEY_GROUPS key groups in the convoy order (`ordered_convoy`), with at
      least 2 query tiles per program."""
    cfg = CONFIGS.get(headdim)
    if not ORDERED_ENABLED or cfg is None:
        return False
    programs = cdiv(seqlen_k, cfg.consumers * cfg.block_n)
    key_groups = ordered_key_groups(seqlen_k, sms)
    if causal:
        return (
            seqlen_q == seqlen_k >= ORDERED_CAUSAL_FROM
            and group <= ORDERED_CAUSAL_MAX_GROUP
            and (
                key_groups <= ORDERED_CAUSAL_KEY_GROUPS
                or ordered_convoy(seqlen_q, seqlen_k, causal, group, sms)
            )
        )
    items = group * cdiv(seqlen_q, cfg.block_m)
    if ordered_convoy(seqlen_q, seqlen_k, causal, group, sms):
        return items >= 2 * programs
    return (
        key_groups <= MAX_KEY_GROUPS
        and group <= ORDERED_ROTATION_MAX_GROUP
        and items >= 2 * cdiv(programs, key_groups)
    )


def ordered_key_groups(seqlen_k: int, sms: int) -> int:
    """Key groups of the ordered backward (each its own fp32 dq buffer, summed in order after): as few
    as keep a key group's programs to half the SMs (a call in the convoy order, `ordered_convoy`, takes
    one instead)."""
    cfg = CONFIGS[128]
    return cdiv(cdiv(seqlen_k, cfg.consumers * cfg.block_n), max(sms // 2, 1))


def ordered_convoy(seqlen_q: int, seqlen_k: int, causal: bool, group: int, sms: int) -> bool:
    """Whether an ordered call adds in the convoy order. Full attention, past MAX_KEY_GROUPS key groups:
    every program of a key head (one key group, one dq buffer) walks the query tiles from the first, and
    each tile's adds come in program order, so a program waits only on the one started before it (grid
    order): no program waits on one not yet started, whatever runs beside it, so any length can take it.
    The programs trail each other by the count's latency (~2 steps); where a program walks many steps
    (at least 2 per program, `supports_ordered`) and programs start as others finish, that costs little.
    One H200, five rounds alternating: the backward alone 1.11-1.12x the two deterministic kernels at full
    32k and 64k (0.96-0.98x the unordered one-kernel backward), bitwise repeats (results/s48/call6, call7);
    fwd+bwd 1.029x / 1.022x SDPA cuDNN's at 32k / 64k, where the two kernels gave 0.966x / 0.950x
    (results/s48/call7). At 16k it ran 0.98x the rotation in two key groups, which keeps 16k (call6).

    Causal calls past ORDERED_CAUSAL_KEY_GROUPS key groups (16896 keys on 132 SMs), without GQA
    (ORDERED_CAUSAL_CONVOY_MAX_GROUP) and up to ORDERED_CAUSAL_CONVOY_MAX_SEQLEN queries: in each key group
    (`ordered_dq_groups`: three since session 87, one before), a key head's programs started last keys first (past 20k each walking its tiles from the last down,
    `causal_convoy_walks_down`), each tile's adds in the causal order (descending programs), so each waits
    only on started programs. The backward alone against the two deterministic kernels, one H200, five
    rounds alternating, group 1 (before session 54 it took 8449-16896 keys too): 1.05-1.08x at 16k,
    1.08-1.13x at 32k, 1.03x at 48k, 0.96-0.97x at 64k (results/s48/call8, s49/call1-2; walking down, 1.08x at 48k and 64k, s51/call2),
    bitwise repeats; fwd+bwd against SDPA cuDNN 1.056x / 1.002x / 0.94x at 16k / 32k / 64k,
    where the two kernels gave 1.012x / 0.961x / 0.97x (s49/call1). The 64k loss
    was the head's locality (`causal_convoy_block`): a key head's programs reuse each other's Q, dO and
    dq tiles a few steps apart, and interleaving all 16 heads' programs tile by tile ran 0.69-0.71x the
    two kernels at 16k-64k (s49/call2). With GQA
    (each program walking group x the query tiles) the causal convoy ran 0.97-0.98x the two kernels at
    group 2 (16k-32k) and 0.86-0.90x at group 4 (12k-16k, s49/call5), while full attention's gains
    held: 1.10-1.12x at group 2 (20k, 32k), 1.08x at group 4 (32k, s49/call6). With the staged dQ
    (session 53) the causal convoy at group 2 ran 1.03 / 0.98 / 0.99x at 16k / 32k / 64k (s53/call1)."""
    # (causal: a key head's programs start in blocks, the last block first, `_attn_bwd_fused_hopper`)
    if not ORDERED_CONVOY:
        return False
    if causal:
        return (
            ORDERED_CAUSAL_CONVOY
            and ordered_key_groups(seqlen_k, sms) > ORDERED_CAUSAL_KEY_GROUPS
            and group <= ORDERED_CAUSAL_CONVOY_MAX_GROUP
            and seqlen_q <= ORDERED_CAUSAL_CONVOY_MAX_SEQLEN
        )
    return ordered_key_groups(seqlen_k, sms) > MAX_KEY_GROUPS


def ordered_dq_groups(seqlen_k: int, causal: bool, convoy: bool, sms: int) -> int:
    """Key groups (fp32 dq buffers, summed in order after) of an ordered call: `ordered_key_groups`'s, or
    in the convoy order (convoy: `ordered_convoy`'s) one with full attention and CAUSAL_CONVOY_KEY_GROUPS
    causal, each group a convoy of its own, the heaviest launched first (`_attn_bwd_fused_hopper`).
    The causal convoy starts a key head's programs lightest first, so the last program it starts is a
    heaviest one, and the kernel ends in a tail: in groups, the last program started is the lightest
    group's heaviest. The convoy model (`benchmarks/model_convoy_schedule.py --schemes blocks:1
    groups:2`) keeps 86 / 89% of the SMs busy at causal 16k, 8 heads, in 1 / 2 groups, 93.5 / 96% at 32k.
    Measured, the backward alone, two deterministic kernels ÷ the convoy in 1 / 2 / 3 key groups, one
    H200, seven rounds alternating (results/s54/call9): 8 heads 1.091 / 1.094 / 1.078 at 24k, 1.113 /
    1.113 / 1.106 at 32k, 1.141 / 1.129 / 1.121 at 40k, 1.106 / 1.111 / 1.119 at 48k, 1.094 / 1.102 /
    1.105 at 64k; 16 heads in 1 / 2, 1.102 / 1.100 at 24k, 1.125 / 1.126 at 48k, 1.097 / 1.102 at 64k.
    Level within the 1-2% two identical variants spread by, so one group until session 87. Each group past
    the first costs its buffer's read in the final sum, since session 86 one Triton pass at copy bandwidth over
    the rows its programs wrote (`sum_dq_buffers`; torch's adds of whole buffers before). Then, fwd+bwd against
    SDPA cuDNN settled at the power cap, three rounds alternating, 16 heads (results/s87/call2), two / three
    ÷ one, every round faster: 0.981 / 0.976 at 24k, 0.987 / 0.980 at 32k, 0.984 / 0.981 at 48k, 0.992
    / 0.975 at 64k (cuDNN ÷ ours in three groups 1.078 / 1.077 / 1.076 / 1.069; in one 1.052 / 1.055 / 1.055 /
    1.043). So three (CAUSAL_CONVOY_KEY_GROUPS, FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS for A/B runs); at 64k
    tokens of 16 heads of 128 each group's buffer is 0.5 GiB."""
    if convoy:
        return CAUSAL_CONVOY_KEY_GROUPS if causal else 1
    return ordered_key_groups(seqlen_k, sms)


def causal_convoy_block() -> int:
    """The causal convoy's launch block (`_attn_bwd_fused_hopper`): 1, or FLASHTRAIN_CAUSAL_CONVOY_BLOCK's
    (A/B runs). Session 50 launched the convoy past 32k in blocks of 16; since session 51 it walks down
    there instead (`causal_convoy_walks_down`), which measured faster than blocks.

    With blocks of 1 a key head's programs start last keys first: the lightest finish first, so the next
    programs start further apart with each wave, and their reads of a query tile drift apart. Nsight
    Compute on one H200 (d128, batch 1, 16 heads; results/s50/call4-5): the convoy's L2 hit rate 95% /
    81% / 69% at causal 32k / 48k / 64k, 5 / 50 / 151 GB of DRAM traffic, against the unordered kernel's
    96-97% (7 GB at 48k, 12 at 64k) and the full-attention convoy's 97.5% at 64k. Blocks of programs
    started heaviest first keep their starts together (`benchmarks/model_convoy_schedule.py --schemes`:
    LRU reuse distances 2-3x shorter, at 2-8% more waiting). The backward alone, two deterministic kernels
    / convoy, three rounds alternating (results/s50/call6), blocks of 1 / 8 / 16 / 33: 1.112 / 1.093 /
    1.065 / 1.042 at 32k, 1.033 / 1.051 / 1.049 / 1.036 at 48k, 0.975 / 1.047 / 1.052 / 1.018 at 64k;
    bitwise repeats."""
    return 1 if CONVOY_BLOCK_SETTING is None else CONVOY_BLOCK_SETTING


def causal_convoy_walks_down(seqlen_q: int) -> bool:
    """Whether a causal convoy of seqlen_q queries walks each program's query tiles from the last down
    (`_attn_bwd_fused_hopper`'s DOWN): past ORDERED_CAUSAL_CONVOY_DOWN_ABOVE queries (WALK_DOWN_SETTING,
    where set, at every length: A/B runs).

    Walking up, program j + 1 (launched a launch interval L before j) is 2 steps ahead of j on a tile
    they share (its diagonal is 2 tiles later), so j reads each tile L + 2 steps after j + 1; walking
    down both start on the last tile and j reads it L steps after, but waits when L is under an add's
    hand-over. L grows with the length: about the mean program's steps / the SMs, ~1 step at 16k, ~4 at
    64k. The CPU model (`benchmarks/model_convoy_schedule.py --schemes down:blocks:1`, session 51) put it
    at 0.973 / 0.961 of the SMs busy at causal 64k / 48k, against 0.942 / 0.933 in blocks of 16, its LRU
    cache of 400 tiles hit 99.6% / 99.5% (blocks of 16: 96.9% / 99.4%), and at 32k it waited more (0.923,
    against 0.965 walking up). On one H200, the backward alone, two deterministic kernels / convoy, three
    rounds alternating (results/s51/call2), walking up in blocks of 1 / 16 and down in blocks of 1 / 16:
    1.090 / 1.056 / 1.071 / 0.990 at 32k, 1.031 / 1.044 / 1.081 / 1.027 at 48k, 1.010 / 1.046 / 1.078 /
    1.033 at 64k; gradients repeated bit for bit (dk and dv, summed over the tiles in another order, within
    0.5% of their largest value of the two kernels'). Since session 52's staged dQ the hand-over's wait
    has left the consumers, and walking down gained at 24k and 32k too (results/s53/call1-2, two calls of
    five rounds, two kernels / convoy walking up and down): 1.105 / 1.114 at 16k, 1.120 / 1.107 at 20k,
    1.072 / 1.086 and 1.092 / 1.107 at 24k, 1.094 / 1.113 and 1.104 / 1.129 at 32k, 1.071 / 1.117 at 40k;
    so past 20k."""
    if WALK_DOWN_SETTING is not None:
        return WALK_DOWN_SETTING
    return seqlen_q > ORDERED_CAUSAL_CONVOY_DOWN_ABOVE


ORDERED_CAUSAL_CONVOY_DOWN_ABOVE = 20480
WALK_DOWN_SETTING: bool | None = None  # (A/B runs: benchmarks/ab_fused_bwd.py --walk-down)


def _positive_int_setting(name: str, unit: str, default, environ=os.environ):
    """Environment variable name's value: unset or empty, default; else a positive integer (of unit)."""
    text = environ.get(name)
    if not text:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive integer ({unit}), got {text!r}")
    return int(text)


# (A/B runs, tests) None: blocks of 1, `causal_convoy_block` (how many of the SMs a block may take is
# checked at each call)
CONVOY_BLOCK_SETTING = _positive_int_setting("FLASHTRAIN_CAUSAL_CONVOY_BLOCK", "programs a block", None)
# (`ordered_dq_groups`; A/B runs and GPU tests set it)
CAUSAL_CONVOY_KEY_GROUPS = _positive_int_setting("FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS", "key groups", 3)
# FLASHTRAIN_ORDERED_CAUSAL_CONVOY=0 keeps causal calls past ORDERED_CAUSAL_KEY_GROUPS key groups (16896
# keys on 132 SMs) on the two deterministic kernels
ORDERED_CAUSAL_CONVOY = os.environ.get("FLASHTRAIN_ORDERED_CAUSAL_CONVOY", "1") != "0"
# The causal convoy's longest call (`ordered_convoy`): the longest timed (64k: 1.08x the two kernels walking
# down, `causal_convoy_walks_down`, 0.96-1.01x walking up in blocks of 1, results/s49/call1-2, s51/call2)
ORDERED_CAUSAL_CONVOY_MAX_SEQLEN = 65536
# GQA, the backward alone against the two kernels, one H200, five rounds alternating (results/s49/call5,
# call8, call9): causal with 2 query heads a key head 1.00-1.03x in one key group (4k, 8k) and 0.97-0.98x
# in the convoy (16k-32k), with 4 0.88-0.94x and 0.86-0.90x; full attention in key groups (the rotation)
# 1.07x with 2 (8k) and 0.83-0.87x with 4 (4k, 16k). The full-attention convoy kept its gain with 2 and 4
# (1.08-1.12x at 20k-32k), so it has no such limit. Again with the staged dQ (session 53, results/s53/
# call1-2): causal with 2 in one key group 1.06 / 1.05-1.07 / 1.03 / 1.04-1.05x at 2k / 4k / 6k / 8k, so
# it takes those; in the convoy 1.03 / 0.98 / 0.99x at 16k / 32k / 64k, with 4 0.92-0.95x (8k, 32k); full
# attention in key groups with 4 0.83-0.94x (4k-16k). Causal with 2 in two key groups (session 54,
# results/s54/call5): 1.019 / 1.053x at 12k / 16k, so it takes those too (ORDERED_CAUSAL_KEY_GROUPS).
ORDERED_CAUSAL_MAX_GROUP = 2
ORDERED_CAUSAL_CONVOY_MAX_GROUP = 1
ORDERED_ROTATION_MAX_GROUP = 2
# FLASHTRAIN_ORDERED_CONVOY=0 keeps full-attention calls past MAX_KEY_GROUPS key groups on the two kernels
ORDERED_CONVOY = os.environ.get("FLASHTRAIN_ORDERED_CONVOY", "1") != "0"


# Each key group costs a dq-sized fp32 buffer and its read in the final sum; 2 (16.9k keys on 132 SMs,
# the longest full-attention point) measured (session 44), more did not run.
MAX_KEY_GROUPS = 2
# Causal calls, on one H100 (session 45, alternating, results/s45/call1-3 and call7): the backward alone
# 0.97x the two deterministic kernels at 1k, 1.04-1.05x at 2k, 1.03-1.06x at 4k and 1.03-1.14x at 8k (one
# key group), fwd+bwd 1.02-1.05x at 2k-8k; at 16k (two key groups) the backward alone 1.02-1.04x, but
# 0.88-0.91x the unordered one-kernel backward, whose programs start heaviest first over all heads (a key
# group's programs here start in grid order as SMs free up, and one that starts more than 2 steps after
# the one before it holds up every lower program of its group), and fwd+bwd level with the two kernels'
# within the spread of separate runs. So one key group, from 2k queries. (Those ran the relaxed count;
# with the release warp, one H200: 1.05-1.06x / 1.05-1.07x / 1.11x at 2k / 4k / 8k, results/s46/call4-5.)
# Two key groups since session 54: with the staged dQ (session 52) they ran past the causal convoy that had
# taken 8449-16896 keys, the backward alone, two kernels ÷ key groups / ÷ convoy, one H200, five rounds
# (results/s54/call3-4): 8 heads (a GPT-2 medium-width model's heads of 128) 1.055 / 1.034 at 12k, 1.082 /
# 1.063 and 1.108 / 1.087 at 16k; 16 heads 1.066 / 1.039 at 12k, 1.138 / 1.136 and 1.111 / 1.098 at 16k.
# The convoy starts a key head's heaviest program last, so its tail is longer with fewer heads (the convoy
# model, `benchmarks/model_convoy_schedule.py`: 86% of the SMs busy at 8 heads, 92% at 16). Three and four
# key groups lost to the convoy walking down at 24k and 32k (1.092 / 1.080, 1.101 / 1.130 at 8 heads;
# 1.093 / 1.125, 1.110 / 1.158 at 16).
ORDERED_CAUSAL_FROM = 2048
ORDERED_CAUSAL_KEY_GROUPS = 2


# The ordered backward's first adder of each item stores (`_add_in_turn`), so its fp32 dq buffers are not
# zero-filled (`dq_buffer`). One H200, d128, 16k tokens x 16 heads, fwd+bwd, five rounds alternating,
# zero-filled ÷ first stores (results/s63/call1, call4): causal 4k / 8k / 16k 1.032 / 1.024 / 1.003, full
# 1.006 / 0.999 / 1.014, 32k-64k 0.995-1.004 (the fill is a smaller share there); block-sparse d128 on the
# ordered kernel 1.03-1.13x at n4k, 1.00-1.06x at n16k (call2); gradients bitwise the same.
# FLASHTRAIN_FIRST_STORES=0 adds into zero-filled buffers instead (A/B runs, a safety valve).
FIRST_STORES = os.environ.get("FLASHTRAIN_FIRST_STORES", "1") != "0"

# The ordered kernel's dQ halves staged in shared memory rows paired (`dq_view`, `_fused_dq_hopper.stage_dq_half`),
# where the queries are a multiple of 8: its 64-bit stores free of bank conflicts. One H200, d128 causal 16k
# (results/s84/call2): Nsight Compute's shared-store bank conflicts in the backward kernel 69.2M -> 1.7M, store
# wavefronts 228M -> 145M, the kernel 5.87 -> 5.69 ms at its locked clocks; fwd+bwd settled at the power cap, three
# rounds alternating, rows in order ÷ paired 1.016 (cuDNN ÷ ours 1.029 -> 1.045; 1.011-1.017 at causal 8k / 16k
# and full 16k, 1.004 at causal 64k: results/s84/call3, call5). The unordered kernel (deterministic=False from
# causal 12k) keeps the row order: paired it ran 0.906x as fast at causal 16k (its build spills 58 instructions
# in its loops instead of 71 causal, but 66 instead of 21 with full attention).
# FLASHTRAIN_PAIRED_DQ_ROWS=0 stages them in row order (A/B runs).
PAIRED_DQ_ROWS = os.environ.get("FLASHTRAIN_PAIRED_DQ_ROWS", "1") != "0"
# (tests) what `dq_buffer` fills the elements it leaves to the first stores with: None leaves
# torch.empty's bytes; NaN shows any element read before it is written
UNWRITTEN_FILL: float | None = None


# The key groups' dq buffers summed into dq in one Triton pass (`_grad_sums.sum_key_groups`) that reads only
# the rows their programs wrote, so a first-stores buffer needs no zeros at all. FLASHTRAIN_TORCH_DQ_SUM=1:
# torch's adds of whole buffers instead, zeros stored where no program adds (A/B runs, a safety valve).
TORCH_DQ_SUM = os.environ.get("FLASHTRAIN_TORCH_DQ_SUM", "0") == "1"


def dq_rows_written(seqlen_k: int, causal: bool, key_groups: int) -> tuple[int, int]:
    """(groups_written, first_row_step) of the ordered backward's key groups' dq buffers: the groups from
    groups_written on hold no program; with causal attention (seqlen_q == seqlen_k) group g's programs start
    on their diagonals and add only into the queries from g * first_row_step on (0: full attention, every
    query). Group g holds programs g * per_group .. of 128 keys each, as `ordered_key_groups` counts them."""
    cfg = CONFIGS[128]
    keys = cfg.consumers * cfg.block_n
    programs = max(cdiv(seqlen_k, keys), 1)  # (no keys: group 0's buffer as it is, zeros or stored)
    per_group = cdiv(programs, key_groups)
    return cdiv(programs, per_group), per_group * keys if causal else 0


def dq_buffer(
    q, seqlen_k: int, causal: bool, key_groups: int = 1, first_stores: bool = False
) -> torch.Tensor:
    """The one-kernel backward's fp32 dq buffers (ordered: one per key group), (key_groups x batch, *q's
    other dims): zeros, or with first_stores (ordered, `_add_in_turn`: each item's first adder stores)
    left unwritten (`sum_dq_buffers` reads only what the programs wrote; with TORCH_DQ_SUM zeros where no
    program of a key group adds, `dq_rows_written`). For a block-sparse call (one key group) the caller
    passes first_stores only when every item is listed (`_block_sparse_hopper._col_lists`)."""
    shape = (key_groups * q.shape[0], *q.shape[1:])
    if not first_stores:
        return torch.zeros(shape, device=q.device, dtype=torch.float32)
    buffer = torch.empty(shape, device=q.device, dtype=torch.float32)
    if UNWRITTEN_FILL is not None:
        buffer.fill_(UNWRITTEN_FILL)
    if TORCH_DQ_SUM:
        zero_unwritten(buffer.view(key_groups, *q.shape), *dq_rows_written(seqlen_k, causal, key_groups))
    return buffer


def zero_unwritten(per_key_group: torch.Tensor, groups_written: int, first_row_step: int) -> None:
    """Zeros in the rows of (key_groups, batch, seqlen, ..) buffers that no program writes (`dq_rows_written`)."""
    per_key_group[groups_written:].zero_()
    for g in range(1, groups_written):  # (group 0 holds program 0, which adds into every item)
        per_key_group[g, :, : g * first_row_step].zero_()


def sum_dq_buffers(dq_acc, dq, seqlen_k: int, causal: bool, key_groups: int = 1) -> torch.Tensor:
    """dq = the key groups' buffers (`dq_buffer`, after the kernel added dQ times the softmax scale) summed
    in group order in fp32 and rounded once to dq's dtype (one group written: a copy); returns dq."""
    groups_written, first_row_step = dq_rows_written(seqlen_k, causal, key_groups)
    if groups_written == 1:  # (torch's copy: the one pass ran 0.97-0.99x its speed, results/s86/call1)
        return dq.copy_(dq_acc[: dq.shape[0]])
    if not TORCH_DQ_SUM:
        return sum_key_groups(dq_acc, dq, groups_written, first_row_step)
    per_group = dq_acc.view(key_groups, *dq.shape)  # (torch's way: whole buffers, the last add into dq)
    total = per_group[0]
    for g in range(1, key_groups - 1):
        total = total + per_group[g]
    return torch.add(total, per_group[-1], out=dq)


def flash_attn_bwd_fused_hopper(
    q, k, v, do, lse2, delta, dq_acc, dk, dv, *, sm_scale: float, causal: bool, config=None, ordered=False,
    key_groups=1, convoy=False, convoy_block=None, walk_down=None, lists=None, first_stores=False, kv_repeat=1,
):  # fmt: skip
    """dK, dV into dk, dv (shaped like k, v) and dQ times the softmax scale added into dq_acc (fp32,
    contiguous, zeros: q's shape, with ordered (key_groups x batch, ...): key group g adds into
    dq_acc[g * batch:][:batch], and dq is their sum in that order), given the base-2 lse and delta. The
    caller checked `_flash_dkdv_hopper.supports` and `supports` (with ordered, `supports_ordered`, and
    key_groups from `ordered_key_groups`). ordered: the adds into each dq tile in one fixed order, so dq
    repeats bit for bit; with convoy (`ordered_convoy`; key_groups from `ordered_dq_groups`: 1 with full
    attention) in the order the programs start.
    convoy_block: a causal convoy's launch blocks (`_attn_bwd_fused_hopper`), 1 to half the SMs; None takes
    `causal_convoy_block`'s for a causal convoy, 1 (unread) otherwise. walk_down: a causal convoy's programs
    walk their query tiles from the last (`_attn_bwd_fused_hopper`'s DOWN); None takes
    `causal_convoy_walks_down`'s.
    lists: a block-sparse call's (tiles, counts, ranks) (`kernels._block_sparse_hopper.col_lists` and
    `col_ranks`: ranks read only when ordered), whose lse (passed as lse2) is in natural log; one key group,
    no convoy.
    first_stores (ordered): each item's first adder stores its dQ half instead of adding it, so dq_acc
    needs zeros only where no program adds (`dq_buffer`).
    kv_repeat: a GQA call run as MHA without repeating K and V in memory: dk and dv have kv_repeat times
    k's heads, and each of their heads h gets the dK / dV of attending with K / V head h // kv_repeat (its
    query heads' share alone; the caller sums them per K / V head). 1: dk and dv shaped like k and v."""
    if lists is not None and (key_groups != 1 or convoy or walk_down):
        raise ValueError(
            "a block-sparse call (lists) adds each dq tile in its key tiles' order: it takes key_groups=1, "
            f"convoy=False and walk_down False or None; got {key_groups}, {convoy}, {walk_down}"
        )
    if convoy and (not ordered or (key_groups != 1 and not causal)):
        raise ValueError(
            "convoy=True (ordered_convoy) needs ordered=True, and key_groups=1 with full attention; "
            f"got ordered={ordered}, key_groups={key_groups}, causal={causal}"
        )
    if not (is_int(kv_repeat) and kv_repeat >= 1) or (lists is not None and kv_repeat != 1):
        raise ValueError(
            f"kv_repeat must be an int >= 1 (1 for a block-sparse call: lists), got {kv_repeat!r}"
        )
    if dk.shape[2] != kv_repeat * k.shape[2] or q.shape[2] % dk.shape[2]:
        raise ValueError(
            f"dk, dv need k's heads times kv_repeat ({k.shape[2]} x {kv_repeat}), a divisor of q's "
            f"{q.shape[2]}; got {dk.shape[2]}"
        )
    if first_stores and not ordered:
        raise ValueError("first_stores=True stores each item's first add in its turn: it needs ordered=True")
    if convoy_block is None:  # (only the causal convoy reads it)
        convoy_block = causal_convoy_block() if causal and convoy else 1
    if walk_down is None:
        walk_down = causal and convoy and causal_convoy_walks_down(q.shape[1])
    elif walk_down and not (causal and convoy):
        raise ValueError("walk_down=True is the causal convoy's order: it needs causal=True and convoy=True")
    sms = sm_count(q.device)
    if not 1 <= convoy_block <= max(sms // 2, 1):
        raise ValueError(
            f"convoy_block={convoy_block}: a block's programs wait on each other, so it takes 1 to half the "
            f"GPU's {sms} SMs"
        )
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], dk.shape[2]  # (the grid's key heads: kv_repeat x k's)
    cfg = config or CONFIGS[headdim]
    grid = (cdiv(seqlen_k, cfg.consumers * cfg.block_n), nheads_kv, batch)
    dq_tiles = dq_view(dq_acc, cfg.block_m, ordered)
    # ordered: per (key group and batch, query head, query tile, half) the adds done so far (else a
    # pointer never read)
    sems = lse2
    if ordered:
        sems = torch.zeros(
            key_groups * batch,
            nheads,
            cdiv(seqlen_q, cfg.block_m),
            2,
            device=q.device,
            dtype=torch.int32,
        )
    if lists is None:  # (the list arguments never read)
        sched_slots = sched_slots_for(q.device, causal and not ordered)
        list_args = (lse2, lse2, lse2, 1, 1, 1)
    else:  # (grid order: a key head's key tiles in turn, the order of each item's adds)
        tiles, counts, ranks = lists
        sched_slots, list_args = 0, (tiles, counts, ranks, *tiles.shape)
    args = (lse2, delta, lse2.stride(0), lse2.stride(1), seqlen_q, seqlen_k, nheads // nheads_kv, kv_repeat,
            sm_scale * LOG2E, sm_scale, sched_slots, sems, key_groups, convoy_block, *list_args)  # fmt: skip
    _launch_fused(
        grid,
        ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (do, cfg.block_m), (dk, cfg.block_n),
         (dv, cfg.block_n), (dq_tiles, cfg.block_m)),
        args,
        dict(CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
             PRODUCER_REGS=cfg.producer_regs, ORDERED=ordered, CONVOY=convoy, DOWN=bool(walk_down),
             SPARSE=lists is not None, FIRST_STORES=first_stores, num_warps=4),
    )  # fmt: skip
    return dk, dv


def dq_view(dq_acc: torch.Tensor, block_m: int, ordered: bool) -> torch.Tensor | TmaView:
    """What the kernel's dq descriptor views of the fp32 dq buffer dq_acc (B', Sq, H, D), a TMA block being
    one consumer's half of a query tile's dQ (block_m x D / 2). Ordered, with PAIRED_DQ_ROWS and Sq a multiple
    of 8: (B', Sq / 8, 4, 2, H * D), its strides Sq, 8, 1 and 4 rows and one element, blocks (1, block_m / 8,
    4, 2, D / 2), so the shared tile holds row 8g + 4a + b at tile row 8g + 2b + a (`_fused_dq_hopper.stage_dq_half`,
    which stores without bank conflicts in that order). Otherwise each head's two column halves as heads of
    their own, (B', 2H, Sq, D / 2) as `descriptor` views it, the tile in row order."""
    batch, seqlen_q, nheads, headdim = dq_acc.shape
    if not (ordered and PAIRED_DQ_ROWS) or seqlen_q % 8:
        return dq_acc.view(batch, seqlen_q, 2 * nheads, headdim // 2)
    row = nheads * headdim
    return TmaView(
        dq_acc, [batch, seqlen_q // 8, 4, 2, row], [seqlen_q * row, 8 * row, row, 4 * row, 1],
        block=(1, block_m // 8, 4, 2, headdim // 2),
    )  # fmt: skip


_launch_fused = CompiledLaunch(_attn_bwd_fused_hopper, descriptor)
