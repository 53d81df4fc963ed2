"""The ordered one-kernel backward's dq in q's dtype, written while the kernel's last programs still run.

The ordered backward (`_flash_bwd_fused_hopper`, ORDERED) adds each (query head, query tile) item's dQ
into fp32 buffers, one per key group, and counts every add in the item's semaphores. dq is then their sum in
group order, rounded once: a pass that reads the buffers and writes dq (at 16k tokens of 16 heads of 128,
~200-335 MB: 1-1.6% of a d128 fwd+bwd at full 4k and causal 16k, which cuDNN spends too, in its own dq
conversion). Here that pass runs in the backward's tail instead of after it: this kernel is launched as a
programmatic dependent launch, and the backward lets it start (`griddepcontrol.launch_dependents`) once all
its own programs have started, so its programs take the SMs the backward's last wave leaves idle. Each
program converts its share of the items, each once the item's semaphores count every add (`item_adds`; a
GPU-scope acquire, against the backward's release adds), and ends in `griddepcontrol.wait`, so that nothing
after it in the stream runs before the backward has finished too (its dK and dV stores).

The sums are the same additions in the same order as the pass they replace (group 0 + group 1 + ..., in
fp32, rounded to q's dtype once, to nearest even), so dq is bitwise what it was.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ._common import INTERPRET, cdiv, compute_capability, padded_head_dim, sm_count
from ._launch import CompiledLaunch

# FLASHTRAIN_DQ_TAIL=0: the pass after the backward instead (A/B runs, a safety valve)
ENABLED = os.environ.get("FLASHTRAIN_DQ_TAIL", "1") != "0"
PROGRAMS_PER_SM = 4  # (a program converts one 64-row item at a time: several a SM keep loads in flight)


@triton.jit
def _item_adds(tile, key_group, per_group, all_programs, key_offset, CAUSAL: tl.constexpr,
               BLOCK_M: tl.constexpr, KEYS: tl.constexpr):  # fmt: skip
    """`item_adds` in the kernel."""
    first = key_group * per_group
    programs = tl.maximum(tl.minimum(per_group, all_programs - first), 0)
    if CAUSAL:
        seen = tl.cdiv((tile + 1) * BLOCK_M + key_offset, KEYS) - first
        programs = tl.minimum(tl.maximum(seen, 0), programs)
    return programs


@triton.jit
def _wait_count(sem, target):
    """Spin until the int32 at sem counts target (a GPU-scope acquire: the adds it counts are visible)."""
    while tl.atomic_add(sem, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _dq_tail(
    ACC, SEM, DQ, batch, nheads, seqlen_q, n_tiles, n_items, per_group, all_programs, key_offset,
    stride_ab, stride_am, stride_ah, stride_db, stride_dm, stride_dh,
    KEY_GROUPS: tl.constexpr, CAUSAL: tl.constexpr, KEYS: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, WAIT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """DQ[b, rows, h] = ACC[0 * batch + b, rows, h] + ACC[1 * batch + b, rows, h] + ... (KEY_GROUPS buffers,
    fp32, in that order), rounded once to DQ's dtype, item by item: item i is (b, h, query tile t) in that
    order (the order the backward's grid finishes them), program p takes items p, p + programs, ...
    WAIT: first wait for each key group's two semaphores of the item (SEM: int32 (KEY_GROUPS x batch, nheads,
    n_tiles, 2)) to count `item_adds`. PDL: end in `griddepcontrol.wait` (see the module's docstring)."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        t = item % n_tiles
        h = (item // n_tiles) % nheads
        b = item // (n_tiles * nheads)
        m = t * BLOCK_M + rows
        mask = (m < seqlen_q)[:, None] & (cols < HEAD_DIM)[None, :]
        offs = m.to(tl.int64)[:, None] * stride_am + h * stride_ah + cols[None, :]
        if WAIT:
            sem = SEM + ((b * nheads + h) * n_tiles + t) * 2
            target = _item_adds(t, 0, per_group, all_programs, key_offset, CAUSAL, BLOCK_M, KEYS)
            _wait_count(sem, target)
            _wait_count(sem + 1, target)
        total = tl.load(ACC + b.to(tl.int64) * stride_ab + offs, mask=mask, other=0.0)
        for g in tl.static_range(1, KEY_GROUPS):
            if WAIT:
                sem = SEM + (((g * batch + b) * nheads + h) * n_tiles + t) * 2
                target = _item_adds(t, g, per_group, all_programs, key_offset, CAUSAL, BLOCK_M, KEYS)
                _wait_count(sem, target)
                _wait_count(sem + 1, target)
            total += tl.load(ACC + (g * batch + b).to(tl.int64) * stride_ab + offs, mask=mask, other=0.0)
        out = (
            DQ
            + b.to(tl.int64) * stride_db
            + m.to(tl.int64)[:, None] * stride_dm
            + h * stride_dh
            + cols[None, :]
        )
        tl.store(out, total.to(DQ.dtype.element_ty), mask=mask)
    if PDL:
        gdc_wait()


_launch_tail = CompiledLaunch(_dq_tail)


def item_adds(tile: int, key_group: int, per_group: int, all_programs: int, key_offset: int, causal: bool,
              block_m: int, keys: int) -> int:  # fmt: skip
    """How many programs of a key group add into query tile `tile` (block_m rows) of each head: the ordered
    backward's programs each take `keys` keys (program j: keys j * keys ..), key group g the programs
    g * per_group .. (fewer in the last, none past all_programs). With full attention every one of them adds;
    causal (key_offset = seqlen_k - seqlen_q), program j adds into the tiles from the one holding its first
    key's diagonal, query row j * keys - key_offset (`_flash_dkdv_hopper.dense_program`'s lo), on."""
    first = key_group * per_group
    programs = max(min(per_group, all_programs - first), 0)
    if causal:
        programs = min(max(cdiv((tile + 1) * block_m + key_offset, keys) - first, 0), programs)
    return programs


def dq_from_key_groups(
    dq_acc: torch.Tensor, dq: torch.Tensor, key_groups: int, *, sems: torch.Tensor | None = None,
    causal: bool = False, seqlen_k: int = 0, keys: int = 128, block_m: int = 64, pdl: bool = False,
) -> torch.Tensor:  # fmt: skip
    """dq = the sum of dq_acc's key_groups fp32 buffers ((key_groups x batch, seqlen_q, nheads, headdim),
    contiguous) in group order, rounded once to dq's dtype (dq: q's shape, any strides with a unit last one).
    sems: the ordered backward's semaphores (key_groups x batch, nheads, cdiv(seqlen_q, block_m), 2), each
    item waited for until they count `item_adds` (the backward's programs of `keys` keys over seqlen_k keys,
    causal or not); None: the buffers are complete already. pdl: launched as a programmatic dependent launch
    (the backward, launched just before, lets it start early); on a GPU from sm_90 only."""
    batch, seqlen_q, nheads, headdim = dq.shape
    if (
        dq_acc.dtype != torch.float32
        or not dq_acc.is_contiguous()
        or dq_acc.shape != (key_groups * batch, seqlen_q, nheads, headdim)
        or dq.stride(-1) != 1
    ):
        raise ValueError(
            f"dq_from_key_groups sums a contiguous fp32 ({key_groups} x batch, seqlen, heads, headdim) buffer "
            f"into dq with a unit last stride; got {dq_acc.dtype} {tuple(dq_acc.shape)} (contiguous: "
            f"{dq_acc.is_contiguous()}) into {tuple(dq.shape)} strides {dq.stride()}"
        )
    n_tiles = cdiv(seqlen_q, block_m)
    if sems is not None and sems.shape != (key_groups * batch, nheads, n_tiles, 2):
        raise ValueError(
            f"sems must be ({key_groups * batch}, {nheads}, {n_tiles}, 2) int32, one count per item and half; "
            f"got {tuple(sems.shape)}"
        )
    if pdl and (INTERPRET or not dq.is_cuda or compute_capability(dq.device)[0] < 9):
        raise ValueError("pdl=True launches a programmatic dependent launch: a CUDA GPU from sm_90 only")
    n_items = batch * nheads * n_tiles
    all_programs = cdiv(seqlen_k, keys)
    programs = n_items if INTERPRET else min(n_items, PROGRAMS_PER_SM * sm_count(dq.device))
    _launch_tail(
        (max(programs, 1),),
        (),
        (dq_acc, sems if sems is not None else dq_acc, dq, batch, nheads, seqlen_q, n_tiles, n_items,
         cdiv(all_programs, key_groups), all_programs, seqlen_k - seqlen_q, *dq_acc.stride()[:3], *dq.stride()[:3]),
        dict(KEY_GROUPS=key_groups, CAUSAL=causal, KEYS=keys, BLOCK_M=block_m, HEAD_DIM=headdim,
             BLOCK_D=padded_head_dim(headdim), WAIT=sems is not None, PDL=pdl, num_warps=4, launch_pdl=pdl),
    )  # fmt: skip
    return dq
