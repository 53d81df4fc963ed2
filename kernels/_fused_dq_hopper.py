"""The one-kernel backward's dQ, step by step, for Hopper (sm_90) in Gluon: what the dK/dV kernel's consumers
(`_flash_dkdv_hopper._steps` with FUSED_DQ) run for dQ when `_flash_bwd_fused_hopper` launches it.

Each step's dS^T goes to shared memory and each consumer multiplies both consumers' dS by its half of K's
columns (`fused_dq_product`); the half is then added into the fp32 dq buffer by a TMA reduce-add, at once
(`fused_dq_store`: the nondeterministic backward) or, ordered, handed to a warp of the program's own that
adds it in the item's turn (`fused_dq_stage`, `_flash_bwd_fused_hopper._releaser`), the turn counted from
the program's place among its key head's (`ordered_rank_step`, `ordered_causal_rank`).
"""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma


@gluon.jit
def ordered_rank_step(rank, step, later_programs, spacing, extra):
    """The ordered backward's rank at this step: how many programs of the key head add into this step's
    item before this one, given the rank at the step before. Program p starts at item p * spacing
    (spacing = items // programs >= 1); another program q reached this step's item d steps earlier,
    where d = (q - p) * spacing for the later_programs = programs - 1 - p programs after p, and
    d = items - (p - q) * spacing for those before it: the k-th smallest d is k * spacing, plus extra =
    items - programs * spacing once k passes later_programs. Each step passes at most one of them."""
    return rank + (step >= (rank + 1) * spacing + gl.where(rank >= later_programs, extra, 0)).to(gl.int32)


@gluon.jit
def ordered_causal_rank(tile, program, later_programs, TILES_PER_PROGRAM: gl.constexpr):
    """The ordered causal backward's rank at a step on query tile `tile` (seqlen_q == seqlen_k): how many
    programs of this one's key group add into the step's item before it. Program j (keys from j * KEYS)
    first meets query tile j * TILES_PER_PROGRAM (TILES_PER_PROGRAM = KEYS // BLOCK_M: its diagonal's)
    and walks the tiles from there to the last in one loop, head by head of its GQA group (SECTION 5).
    So program j + 1 reaches item (head g, tile t) 2 (g + 1) steps before program j does, if both started
    together: an item's adders come in descending program order, and those before j are the programs
    j + 1 .. of its key group that see the tile, min(tile // TILES_PER_PROGRAM - j, later_programs) of
    them. In grid order a key group's programs start in ascending order, so a program waits only on
    programs started after it (which is why all of them must run at once, as in full attention). The
    causal convoy (`_flash_bwd_fused_hopper`) starts them last keys first, and walking down (DOWN) program
    j + 1 reaches each item as many steps before program j as it started before it: the same order."""
    return gl.minimum(tile // TILES_PER_PROGRAM - program, later_programs)


@gluon.jit
def fused_dq_product(ds_t, it, dq_io, WG: gl.constexpr, BLOCK_M: gl.constexpr):
    """A fused step's dQ product (`_flash_bwd_fused_hopper`), issued asynchronously: dS^T (this
    consumer's keys x the step's queries, 16 bits) goes to shared memory, and once the other consumer's
    has too, this one computes its half of dQ's columns over both consumers' keys:
    dQ[:, WG half] = dS (queries x all keys) K[:, WG half]. The dS^T buffers alternate between steps: a
    consumer writes a buffer again only two steps later, after the other one arrived at the buffer in
    between, which it does after its wait for the products that read this one."""
    _, ds_smem, ds_ready, keys_free, dq_smem, dq_desc, k_smem, _, _, _ = dq_io
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    HALF: gl.constexpr = HEAD_DIM // 2
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16]
    )
    buf = (it % 2) * 2
    ds_smem.index(buf + WG).store(ds_t)
    fence_async_shared()
    gl.thread_barrier()  # every warp's share is stored before the (one-thread) arrive
    mbarrier.arrive(ds_ready.index(it % 2), count=1)
    mbarrier.wait(ds_ready.index(it % 2), (it // 2) & 1)
    k0 = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).slice(WG * HALF, HALF, dim=1)
    k1 = k_smem.index(1).reshape([BLOCK_N, HEAD_DIM]).slice(WG * HALF, HALF, dim=1)
    dq = gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout)
    dq = warpgroup_mma(ds_smem.index(buf).permute((1, 0)), k0, dq, use_acc=False, is_async=True)
    return warpgroup_mma(ds_smem.index(buf + 1).permute((1, 0)), k1, dq, is_async=True)


@gluon.jit
def dq_coord(dq_b, half_head, row, tile):
    """The TMA coordinates of a dQ half's tile in the fp32 dq buffer: batch dq_b (its key group's, ordered),
    view head half_head (head h's half WG: 2h + WG), first row `row`. The rank of `tile` (a consumer's share
    of dq_smem, as `stage_dq_half` stores it) says which view of the buffer (B, Sq, H, D) its descriptor has
    (`_flash_bwd_fused_hopper.dq_view`): (B, 2H, Sq, D / 2), or, rows paired, (B, Sq / 8, 4, 2, H * D) with the
    half's columns at half_head x D / 2."""
    PAIRED: gl.constexpr = len(tile.shape) == 5
    if PAIRED:
        coord = [dq_b, row // 8, 0, 0, half_head * tile.shape[4]]
    else:
        coord = [dq_b, half_head, row, 0]
    return coord


@gluon.jit
def stage_dq_half(dst, dq):
    """Stores a dQ half (BLOCK_M x D / 2 fp32, the dQ product's register layout) into dst, one consumer's
    share of dq_smem, which the TMA then copies out.
    Why rows paired: the product's layout gives each thread two adjacent columns (8 bytes) of rows r and
    r + 8, and a 64-bit store runs in two phases of 16 threads, rows r0 .. r0 + 3 each. Stored in row order
    into the 128-byte swizzled tile, rows r and r ^ 1 swap the same two 16-byte chunks, so every store
    took 4 shared-memory wavefronts instead of 2: Nsight Compute on d128 n16k (one H200, results/s84/call1)
    counted 68M / 134M excess wavefronts at causal / full, cuDNN's backward none. With dst's rank 5
    (`_flash_bwd_fused_hopper.dq_view`, the ordered kernel's: the buffer's row 8g + 4a + b at tile row
    8g + 2b + a) the phase's four rows fall on four XOR patterns 0, 2, 4, 6 (then 1, 3, 5, 7): two wavefronts,
    and the TMA writes each row back where it belongs. Otherwise (rank 4) the rows go in order."""
    BLOCK_M: gl.constexpr = dq.shape[0]
    HALF: gl.constexpr = dq.shape[1]
    PAIRED: gl.constexpr = len(dst.shape) == 5
    if PAIRED:
        dq = dq.reshape([BLOCK_M // 8, 2, 4, HALF]).permute((0, 2, 1, 3)).reshape([BLOCK_M, HALF])
    dst.reshape([BLOCK_M, HALF]).store(dq)


@gluon.jit
def fused_dq_store(dq, t, g, dq_io, WG: gl.constexpr):
    """Adds a fused step's dQ half (times the softmax scale) into the fp32 dq through TMA (a bulk
    reduce-add: the global memory's adds run in L2, asynchronously), at the tile `dq_coord` gives for
    query tile t of head head0 + g. The buffer's last add is waited for first."""
    _, _, _, _, dq_smem, dq_desc, _, off_b, head0, sm_scale = dq_io
    tma.store_wait(0)
    gl.thread_barrier()  # (the thread that issued the last add has seen it read)
    stage_dq_half(dq_smem.index(WG), dq * sm_scale)
    fence_async_shared()
    coord = dq_coord(off_b, 2 * (head0 + g) + WG, t * dq.shape[0], dq_smem.index(WG))
    tma_reduce_add(dq_desc, coord, dq_smem.index(WG))


@gluon.jit
def fused_dq_stage(dq, it, dq_io, order, WG: gl.constexpr):
    """The ordered backward's store of step it's dQ half (times the softmax scale): into this consumer's
    dQ buffer, once its releasing warp has read the last step's out of it (`_releaser` arrives on
    order's free barrier), then handed to that warp (staged barrier), which adds it in its item's turn.
    The consumer waits for nothing else: not for the item's turn, nor for the add to complete."""
    _, _, _, _, dq_smem, _, _, _, _, sm_scale = dq_io
    staged, free = order[8], order[9]
    mbarrier.wait(free.index(WG), (it & 1) ^ 1)  # (the first step's passes)
    stage_dq_half(dq_smem.index(WG), dq * sm_scale)
    fence_async_shared()
    gl.thread_barrier()  # every warp's share is stored before the (one-thread) arrive
    mbarrier.arrive(staged.index(WG), count=1)


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """`tma.async_copy_shared_to_global` that adds into global memory instead of storing
    (cp.reduce.async.bulk.tensor .add): Triton 3.6 builds the op, its Gluon has no wrapper for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )
