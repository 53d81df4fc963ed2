"""The pieces the Gluon Hopper kernels share (the forward `_flash_fwd_hopper`, the dq kernel
`_flash_dq_hopper`, the dK/dV kernel `_flash_dkdv_hopper` and the one-kernel backward
`_flash_bwd_fused_hopper`, dense or over block-sparse tile lists):

- shared-memory rings that one producer warp fills with TMA bulk copies, mbarriers saying when a stage
  is full and when every consumer is done with it (`kv_ring`, `stream_kv`), and a persistent program's
  two sets of query-row buffers (`item_buffers`, `persistent_producer`);
- the element masks of the tiles that need them (`masked_scores`, `masked_steps`);
- which query rows (or, for the dK/dV kernel, key rows) a program takes: from its grid position, in the
  causal calls' heaviest-first order (`row_program`), from a block-sparse call's lists
  (`listed_row_program`), or as a persistent program's share of the same grid (`my_items`, `work_rows`);
- a programmatic dependent launch's two sides (`launch_dependents`, `wait_for_prior_grid`);
- on the host, the TMA descriptors (`descriptor`) and the kernels' schedule or list arguments
  (`list_args`).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._common import sched_slots_for, tile_ids, tile_program_ids
from ._launch import TmaView, tma_view

# ---------------------------------------------------------------------------------------------------
# programmatic dependent launch (PDL; sm_90): the dq kernel, then the dK/dV kernel reading its delta
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def launch_dependents():
    """griddepcontrol.launch_dependents: a kernel launched after this one as a programmatic dependent
    launch may start once every program of this one has issued it or ended (the first issue in a program
    counts; the dependent's programs then take SMs as this kernel's free them). Without a dependent
    launch, nothing."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def wait_for_prior_grid():
    """griddepcontrol.wait: the calling thread waits until the kernel this one was launched dependent on
    has ended and its writes are visible; launched the ordinary way, it returns at once. Per thread: only
    the threads that read what that kernel wrote need it."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


# ---------------------------------------------------------------------------------------------------
# shared memory rings fed by TMA, and the rows' stores
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def kv_ring(k_desc, v_desc, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, V_STAGES: gl.constexpr = 0):
    """The K/V stage ring `stream_kv` fills: (k_smem, v_smem, k_ready, v_ready, kv_empty), each
    stage's barriers initialised (kv_empty waits for every consumer). V_STAGES > 0: K and V in rings of
    their own, STAGES K tiles and V_STAGES V tiles, kv_empty's first STAGES barriers K's and the
    V_STAGES after them V's. The forward reads a step's V a step after its K, so a shared stage holds
    an idle K tile for a step: there two shared stages let the producer load nothing ahead, while rings
    of 2 K and 2 V tiles (the forward hands each K back as soon as its scores are in) let it load a
    step ahead, as three shared stages do, in 128 KB instead of 192 at 128 x 128 tiles."""
    V_RING: gl.constexpr = V_STAGES if V_STAGES > 0 else STAGES  # (V's tiles: its own ring, or K's stages)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [V_RING] + v_desc.block_type.shape, v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_RING, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES + V_STAGES, 1], mbarrier.MBarrierLayout())
    if V_STAGES == 0:  # one ring: each stage's three barriers
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=NUM_CONSUMERS)
    else:
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
        for i in gl.static_range(V_STAGES):
            mbarrier.init(v_ready.index(i), count=1)
        for i in gl.static_range(STAGES + V_STAGES):
            mbarrier.init(kv_empty.index(i), count=NUM_CONSUMERS)
    return k_smem, v_smem, k_ready, v_ready, kv_empty


@gluon.jit
def item_buffers(q_desc, do_desc, NUM_CONSUMERS: gl.constexpr, WITH_DO: gl.constexpr):
    """A persistent kernel's query rows in flight (`persistent_producer`): two sets, this item's and the
    next one's, of each consumer's Q buffer and, with WITH_DO (the dq kernel), its dO buffer (else Q's
    stands in, never read), with their ready and empty barriers (one arrival each):
    (q_smem, do_smem, ready, empty)."""
    q_smem = gl.allocate_shared_memory(
        q_desc.dtype, [2 * NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout
    )
    if WITH_DO:
        do_smem = gl.allocate_shared_memory(
            do_desc.dtype, [2 * NUM_CONSUMERS] + do_desc.block_type.shape, do_desc.layout
        )
    else:
        do_smem = q_smem
    ready = gl.allocate_shared_memory(gl.int64, [2 * NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2 * NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2 * NUM_CONSUMERS):
        mbarrier.init(ready.index(c), count=1)
        mbarrier.init(empty.index(c), count=1)
    return q_smem, do_smem, ready, empty


@gluon.jit
def load_item_rows(a_desc, b_desc, a_smem, b_smem, ready, empty, j, off_b, off_h, row0, WITH_B: gl.constexpr):
    """A persistent producer's loads of its j-th item's rows into `item_buffers`' set j % 2: each
    consumer's rows row0 + c * rows of head off_h from a_desc, and with WITH_B the same rows from b_desc
    beside them on the same barrier, once the consumers have let the item two before go."""
    NUM_CONSUMERS: gl.constexpr = a_smem.shape[0] // 2
    ROWS: gl.constexpr = a_smem.shape[3]
    for c in gl.static_range(NUM_CONSUMERS):
        buf = (j % 2) * NUM_CONSUMERS + c
        mbarrier.wait(empty.index(buf), ((j // 2) & 1) ^ 1)  # (a buffer's first use passes at once)
        coord = [off_b, off_h, row0 + c * ROWS, 0]
        if WITH_B:
            mbarrier.expect(ready.index(buf), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, coord, ready.index(buf), a_smem.index(buf))
            tma.async_copy_global_to_shared(b_desc, coord, ready.index(buf), b_smem.index(buf))
        else:
            mbarrier.expect(ready.index(buf), a_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, coord, ready.index(buf), a_smem.index(buf))


@gluon.jit
def key_tile(tiles, i, n_kv, SPARSE: gl.constexpr):
    """The key tile of step i: dense, n_kv - 1 - i (the last tile first, where the masks are);
    block-sparse (`kernels._block_sparse_hopper`), entry i of the program's tile list."""
    if SPARSE:
        return gl.load(tiles + i)
    else:
        return n_kv - 1 - i


@gluon.jit
def stream_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, off_b, off_hk, n_kv, tiles, ring0,
              SPARSE: gl.constexpr):  # fmt: skip
    """The K and V tiles of steps 0 .. n_kv - 1 (`key_tile`) of one key head into the ring of stages
    (the producer's loop; the Hopper dq kernel streams K and V the same way). ring0: the ring position
    of step 0 (0 for a program's only rows; a persistent program's later rows go on where the last
    ones ended, so every stage's barrier phases stay in step)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    V_STAGES: gl.constexpr = v_smem.shape[0]
    SPLIT: gl.constexpr = kv_empty.shape[0] != STAGES  # (`kv_ring` with V_STAGES)
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    for i in range(n_kv):
        stage = (ring0 + i) % STAGES
        start_n = key_tile(tiles, i, n_kv, SPARSE) * BLOCK_N  # (a listed tile's load overlaps the wait)
        # a stage's first use passes at once: a fresh mbarrier counts as having completed phase 1
        mbarrier.wait(kv_empty.index(stage), (((ring0 + i) // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [off_b, off_hk, start_n, 0], k_ready.index(stage), k_smem.index(stage)
        )
        if SPLIT:  # (V's own ring: its stage, and its own wait)
            stage = (ring0 + i) % V_STAGES
            mbarrier.wait(kv_empty.index(STAGES + stage), (((ring0 + i) // V_STAGES) & 1) ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [off_b, off_hk, start_n, 0], v_ready.index(stage), v_smem.index(stage)
        )


@gluon.jit
def persistent_producer(
    q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
    kv_empty, seqlen_q, seqlen_k, group, sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    n_row_tiles, nheads, n_batch, CAUSAL: gl.constexpr, SPARSE: gl.constexpr, WITH_DO: gl.constexpr,
):  # fmt: skip
    """One warp: per work item, each consumer's Q rows, and with WITH_DO (the Hopper dq kernel) its dO
    rows beside them on the same barrier, into the item's buffers (once the consumers have let the item
    two before go), then its K/V tiles into the ring, which goes on from the last item's. Without
    WITH_DO, do_desc and do_smem are never read (the forward passes Q's)."""
    NUM_CONSUMERS: gl.constexpr = q_smem.shape[0] // 2
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    n_mine, programs, pid = my_items(n_row_tiles * nheads * n_batch)
    ring0 = 0
    for j in range(n_mine):
        m0, off_h, off_hk, off_b, n_kv, n_masked, tiles = work_rows(
            j, programs, pid, n_row_tiles, nheads, n_batch, sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS,
            lay_heads, n_list_rows, list_len, BLOCK_M * NUM_CONSUMERS, BLOCK_N, CAUSAL, SPARSE,
        )  # fmt: skip
        load_item_rows(q_desc, do_desc, q_smem, do_smem, q_ready, q_empty, j, off_b, off_h, m0, WITH_DO)
        stream_kv(
            k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, off_b, off_hk, n_kv, tiles, ring0, SPARSE
        )  # fmt: skip
        ring0 += n_kv


@gluon.jit
def store_rows(value, smem, desc, coord, WAIT: gl.constexpr):
    """value (BLOCK_M, HEAD_DIM) to global memory at coord through smem (a free (1, 1, BLOCK_M,
    HEAD_DIM) buffer) and a TMA store, which clips the rows past the sequence (the forward's out, the dq
    kernel's dq). WAIT: return once the store has read smem (else the caller waits before reusing it,
    as the persistent forward does)."""
    smem.reshape(value.shape).store(value)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, coord, smem)
    if WAIT:
        tma.store_wait(0)


# ---------------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def masked_scores(s, start_n, rows, seqlen_k, diag, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """Scores of keys past the sequence (or, causal, right of each row's diagonal) set to -inf."""
    BLOCK_N: gl.constexpr = s.shape[1]
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if CAUSAL:
        keep = (cols[None, :] < seqlen_k) & (cols[None, :] <= rows[:, None] + diag)
    else:
        keep = (cols[None, :] < seqlen_k) & (rows[:, None] >= 0)  # (the full tile's shape)
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def masked_steps(n_kv, n_listed_masked, first_row, seqlen_k, diag, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                 SPARSE: gl.constexpr):  # fmt: skip
    """How many of a warpgroup's first steps need the element mask (the forward's and the dq kernel's):
    block-sparse, the count its list gives (the lists put the partial tiles first); dense, the tiles
    past n_full - 1, which come first as steps run from tile n_kv - 1 down (tiles 0 .. n_full - 1 are
    in bounds and visible to every row from first_row on). Step 0 is always masked (the only step of
    n_kv = 1)."""
    if SPARSE:
        return n_listed_masked
    else:
        n_full = seqlen_k // BLOCK_N
        if CAUSAL:
            n_full = gl.minimum(n_full, gl.maximum(first_row + diag + 1, 0) // BLOCK_N)
        return gl.maximum(n_kv - n_full, 1)


# ---------------------------------------------------------------------------------------------------
# which rows a program takes: its grid position, or a persistent program's work items
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def row_program(
    sched_slots, seqlen_q, seqlen_k, group, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr
):
    """(first query row, head, key head, batch, number of key tiles it sees) of a program over ROWS query
    rows in the (row tiles, heads, batch) grid; causal calls take the rows that see the most keys first,
    in the chunked order of `tile_program_ids`. The forward and the Hopper dq kernel share it."""
    if CAUSAL:
        pid_m, n_tiles, off_h, off_b = tile_program_ids(sched_slots)
        pid_m = n_tiles - 1 - pid_m  # the rows that see the most keys first
    else:
        pid_m = gl.program_id(0)
        off_h = gl.program_id(1)
        off_b = gl.program_id(2)
    return _rows_at(pid_m, off_h, off_b, seqlen_q, seqlen_k, group, ROWS, BLOCK_N, CAUSAL)


@gluon.jit
def _rows_at(pid_m, off_h, off_b, seqlen_q, seqlen_k, group, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr):  # fmt: skip
    """`row_program` of query tile pid_m of head off_h of batch off_b."""
    off_hk = off_h // group  # (computed here, before m0: the dq kernel's build then matches its tested one)
    m0 = pid_m * ROWS
    n_kv = gl.cdiv(seqlen_k, BLOCK_N)
    if CAUSAL:  # keys past the last row's diagonal are never seen
        last_key = gl.minimum(m0 + ROWS + seqlen_k - seqlen_q, seqlen_k)
        n_kv = gl.cdiv(gl.maximum(last_key, 1), BLOCK_N)  # >= 1: fully masked rows still get out = 0
    return m0, off_h, off_hk, off_b, n_kv


@gluon.jit
def listed_row_program(TILES, COUNTS, lay_heads, n_list_rows, list_len, group, ROWS: gl.constexpr):
    """`row_program` of a block-sparse call (grid order): (first query row, head, key head, batch,
    number of listed key tiles, how many of them come first and need the element mask, the program's
    tile list). TILES (layout heads, n_list_rows, list_len) and COUNTS (layout heads, n_list_rows, 2)
    as `kernels._block_sparse_hopper.row_lists` builds them; lay_heads is 1 (shared) or nheads. The
    dK/dV kernel's key programs read `col_lists` the same way (rows of keys, key heads, group 1)."""
    return _listed_rows_at(
        gl.program_id(0), gl.program_id(1), gl.program_id(2), TILES, COUNTS, lay_heads, n_list_rows, list_len,
        group, ROWS,
    )  # fmt: skip


@gluon.jit
def _listed_rows_at(
    pid_m, off_h, off_b, TILES, COUNTS, lay_heads, n_list_rows, list_len, group, ROWS: gl.constexpr
):
    """`listed_row_program` of query tile pid_m of head off_h of batch off_b."""
    off_hk = off_h // group
    row = (off_h % lay_heads) * n_list_rows + pid_m
    n_kv = gl.load(COUNTS + row * 2)
    n_masked = gl.load(COUNTS + row * 2 + 1)
    return pid_m * ROWS, off_h, off_hk, off_b, n_kv, n_masked, TILES + row.to(gl.int64) * list_len


@gluon.jit
def program_rows(
    sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS, lay_heads, n_list_rows, list_len,
    ROWS: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPARSE: gl.constexpr,
):  # fmt: skip
    """(first query row, head, key head, batch, steps, masked steps, tile list) of a forward or dq
    program: `listed_row_program` for a block-sparse call, else `row_program` (its masked steps are
    left to the consumers: 0, and the tile list is TILES, never read)."""
    if SPARSE:
        return listed_row_program(TILES, COUNTS, lay_heads, n_list_rows, list_len, group, ROWS)
    else:
        m0, off_h, off_hk, off_b, n_kv = row_program(
            sched_slots, seqlen_q, seqlen_k, group, ROWS, BLOCK_N, CAUSAL
        )
        return m0, off_h, off_hk, off_b, n_kv, 0, TILES


@gluon.jit
def my_items(n_items):
    """(items, programs, program id): this program's share of n_items work items. Program p takes
    item j * programs + p in even rounds j and j * programs + (programs - 1 - p) in odd ones: causal items
    come heaviest first, so plain round-robin would give program 0 the heaviest of every round."""
    programs = gl.num_programs(0)
    pid = gl.program_id(0)
    rounds = n_items // programs
    last_slot = _snake_slot(rounds, programs, pid)
    return rounds + (last_slot < n_items % programs).to(gl.int32), programs, pid


@gluon.jit
def _snake_slot(j, programs, pid):
    """This program's place in round j of `my_items`' order."""
    return gl.where(j % 2 == 0, pid, programs - 1 - pid)


@gluon.jit
def work_rows(
    j, programs, pid, n_row_tiles, nheads, n_batch, sched_slots, seqlen_q, seqlen_k, group, TILES, COUNTS,
    lay_heads, n_list_rows, list_len, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
    SPARSE: gl.constexpr,
):  # fmt: skip
    """`program_rows` of this program's j-th work item (`my_items`' order; producer and consumers walk
    the same items through it): item w is the program of the (n_row_tiles, nheads, n_batch) grid that
    would have launched w-th (causal dense calls: in `tile_ids`' order)."""
    w = j * programs + _snake_slot(j, programs, pid)
    if CAUSAL and not SPARSE:
        tile, n_tiles, off_h, off_b = tile_ids(w, n_row_tiles, nheads, nheads * n_batch, sched_slots)
        pid_m = n_tiles - 1 - tile  # the rows that see the most keys first
    else:  # grid order
        pid_m = w % n_row_tiles
        rest = w // n_row_tiles
        off_h = rest % nheads
        off_b = rest // nheads
    if SPARSE:
        return _listed_rows_at(
            pid_m, off_h, off_b, TILES, COUNTS, lay_heads, n_list_rows, list_len, group, ROWS
        )
    else:
        m0, off_h, off_hk, off_b, n_kv = _rows_at(
            pid_m, off_h, off_b, seqlen_q, seqlen_k, group, ROWS, BLOCK_N, CAUSAL
        )
        return m0, off_h, off_hk, off_b, n_kv, 0, TILES


# ---------------------------------------------------------------------------------------------------
# host side: TMA descriptors and the programs' order or tile lists
# ---------------------------------------------------------------------------------------------------


def tma_ready(t: torch.Tensor) -> bool:
    """TMA reads a tensor through a descriptor: 16-byte aligned base and strides (unit last stride)."""
    # (a plain loop: half the host time of all() over a generator, and a call asks this of up to 9 tensors)
    *outer, last = t.stride()
    if last != 1 or t.data_ptr() % 16:
        return False
    size = t.element_size()
    for stride in outer:
        if (stride * size) % 16:
            return False
    return True


def all_tma_ready(tensors) -> bool:
    """`tma_ready` of every tensor."""
    for t in tensors:
        if not tma_ready(t):
            return False
    return True


def descriptor(t: torch.Tensor | TmaView, rows: int) -> TensorDescriptor:
    """A (batch, heads, seqlen, headdim) TMA view of t (batch, seqlen, heads, headdim), read in blocks
    of `rows` tokens of one head: the descriptor's bounds give each head its own zero-filled tail (and
    clip a store's rows past the sequence). A TmaView given whole (with its block) is taken as it is."""
    if isinstance(t, TmaView):
        return TensorDescriptor(
            t.base, t.shape, t.strides, list(t.block), _smem_layout(t.block, t.base.dtype)
        )
    view = tma_view(t)  # (the same view the compiled launches pass: kernels/_launch.py)
    block = (1, 1, rows, t.shape[-1])
    return TensorDescriptor(t, view.shape, view.strides, list(block), _smem_layout(block, t.dtype))


@functools.cache
def _smem_layout(block: tuple, dtype: torch.dtype):
    # cached: building the layout took 7 of the 10 us a descriptor cost on the host
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])


_GL_DTYPES = {
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
    torch.float32: gl.float32,
}  # (fp32: the fused backward's dq)


def list_args(lists, placeholder: torch.Tensor, device, causal: bool) -> tuple:
    """The Hopper kernels' (sched_slots, TILES, COUNTS, lay_heads, n_list_rows, list_len) arguments:
    a block-sparse call's (tiles, counts) in grid order, or a dense call's program order and
    `placeholder` for the lists, which its build never reads."""
    if lists is None:
        return sched_slots_for(device, causal), placeholder, placeholder, 1, 1, 1
    tiles, counts = lists
    return 0, tiles, counts, *tiles.shape
