"""Block-sparse attention on Hopper (sm_90): the dense path's Gluon kernels walking tile lists.

The forward (`_flash_fwd_hopper`), dq (`_flash_dq_hopper`) and dK/dV (`_flash_dkdv_hopper`) kernels take
a SPARSE flag: their producer warp then TMA-loads the tiles a list names instead of a contiguous range,
and their consumers apply the element mask (causal diagonal, sequence tail) to the list's partial
tiles only. The lists are compiled here from `BlockLayout.block_lists` once per layout and shape:

- `row_lists` (forward and dq): per 128-row query tile (the two consumer warpgroups' 64 rows each), the
  key tiles it sees, partial ones first. A tile that sees no key gets one tile past the sequence: TMA
  reads zeros there and the mask drops every key, so its rows get out = 0 and lse = -inf as the
  portable kernel gives them, without a branch in the kernel.
- `col_lists` (dK/dV): per 128-key tile of a key head, the (query head of the GQA group, 64-row query
  tile) pairs that see it, partial ones first, packed as head << 16 | tile; summed in registers, as the
  dense kernel sums a group's heads (no atomics).

At d128, where a dq program's list holds 30 tiles or more on average, the backward is one kernel instead
(`ONE_KERNEL_BACKWARD`: `_flash_bwd_fused_hopper` walking the dK/dV kernel's lists, each from its last item
down, dQ added per step in key-tile order: `col_ranks`).

Where the lists are short, each of the three passes runs its persistent variant instead (one program per
SM walking many lists, the next list's loads under this one's work): `PERSISTENT_FORWARD`,
`PERSISTENT_DQ` and `PERSISTENT_DKDV` say up to which mean list length.

Scope: bf16/fp16 on sm_90, head dims 64 and 128 (`CONFIGS`), no dropout, layouts whose blocks the
128-row programs can tile (block_m and block_n multiples of 128); the backward also needs no gradient on
lse. Other calls take the portable block-sparse kernels (`kernels.block_sparse`), which give the same
results (tests/kernels/test_block_sparse_hopper.py).

Measured on one H200 (bf16, butterfly on 128-blocks, 16 heads, batch 1; results/block_sparse_hopper_h200/,
benchmarks/NOTES_attention.md "Block-sparse through the Gluon kernels"): fwd+bwd against the portable
kernels 1.21-1.32x at d128 (n16k at densities 4.7-45%, n64k at 1-44%), 1.03-1.07x at d64 n16k (10-45%).
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from . import _flash_bwd_fused_hopper as fused_bwd
from . import _flash_dkdv_hopper as dkdv_hopper
from . import _flash_dq_hopper as dq_hopper
from . import _flash_fwd_hopper as fwd_hopper
from . import _hopper_pipeline as pipeline
from ._common import INTERPRET, cdiv, compute_capability
from ._flash_bwd import backward_delta
from .layouts import FULL, PARTIAL, SKIP, BlockLayout, BlockLists, lists_key

# FLASHTRAIN_HOPPER_BLOCK_SPARSE=0 sends every block-sparse call to the portable kernels, =fwd only the
# backward (A/B measurements, a safety valve)
_SETTING = os.environ.get("FLASHTRAIN_HOPPER_BLOCK_SPARSE", "1")
ENABLED = _SETTING != "0"
BACKWARD_ENABLED = _SETTING != "fwd"

# Per head dim, the (forward, dq, dK/dV) kernel configs; a 128-row program (two consumer warpgroups of
# 64) walks each list. d128's are the dense path's (the row-tile forward's 128-key tiles in K and V rings
# of their own; its persistent variant's 64-key tiles are `PERSISTENT_FORWARD`'s). At d64 the dq and dK/dV ones were the best of session
# 25's dense trials (there the dense d64 backward kept the portable kernels: 0.94-1.00x); walking lists,
# fwd+bwd measured 1.03-1.07x the portable kernels at n16k for densities 10-45%
# (results/block_sparse_hopper_h200/block_sparse_d64_n16k.*). The forward's are the row-tile kernel's;
# `PERSISTENT_FORWARD` says where its persistent variant runs instead.
CONFIGS = {
    64: (
        fwd_hopper.CONFIGS[64],
        dq_hopper.HopperDqConfig(block_m=64, block_n=128, consumers=2, stages=3, consumer_regs=240),
        # (the dense path's d64 config before its 128-query steps; on those the grid kernel measured 0.997x
        # and 1.021x at n16k 25% and its causal build spills at two stages; the persistent variant takes
        # them, `PERSISTENT_DKDV`)
        dkdv_hopper.HopperDkdvConfig(block_m=64, block_n=64, consumers=2, stages=4, consumer_regs=240),
    ),
    128: (fwd_hopper.CONFIGS[128], dq_hopper.CONFIGS[128], dkdv_hopper.CONFIGS[128]),
}
# The forward's persistent variant (one program per SM walking its share of the row tiles' lists, the next
# tile's loads under this one's work) where a program walks at most this many of its key tiles on
# average. On one H200, replayed from CUDA graphs (butterfly on 128-blocks, 16 heads, batch 1), persistent against
# row-tile:
#   d128: the forward alone at n16k 0.080 against 0.099 ms at 0.8% density and 0.124 against 0.150 at
#         2.3%, within +-5% from 4.7% to 45% (results/s29/call6/persistent_bs_d128_n16k.json);
#   d64: fwd+bwd 1.02-1.13x at n4k and n16k up to 10% (at most ~13 tiles; results/s36/call3/ab_d64.md),
#        0.94-1.02x on longer lists (n16k 25% and 45%, n64k 2-44%; results/s36/call4/ab_d64_forward.md).
#   d128 (since session 38 the row-tile kernel takes 128-key tiles, the persistent one 64-key): fwd+bwd
#        row-tile / persistent from graphs at n16k 0.93 / 0.94 / 0.97 / 0.99 at 0.8 / 2.3 / 4.7 / 6.25%
#        density (up to 8 of the 128-key tiles a program), 1.01 / 1.02 / 1.04 at 10 / 25 / 45% (12.8 tiles
#        and more; results/s38/call6/ab_d128_forward.md), so the row-tile kernel past 10 of its 128-key
#        tiles a program: 20 of the persistent variant's 64-key ones, which this table counts (the GPU
#        tests passed on it, results/s39/call1; fwd+bwd ÷ Flex at n16k 45% 1.22 -> 1.29, n64k 44% 1.23 -> 1.33).
# Outputs bitwise equal either way where both walk the same tiles (tests/kernels/test_block_sparse_hopper.py).
# d128's persistent config is the dense path's of before session 76, on 64-key tiles: the dense path's now
# runs 128-key tiles, which on lists (up to 10 of them a program) measured 0.97-0.98x at n4k 3-9% density,
# 0.97-1.02x at n16k (fwd+bwd from graphs, results/s76/call5).
PERSISTENT_FORWARD = {
    64: (fwd_hopper.PERSISTENT_CONFIGS[64], 16),
    128: (fwd_hopper.PERSISTENT_64KEY, 20),
}
# The dq kernel's persistent variant (one program per SM walking the row tiles' lists, the next tile's Q,
# dO and K/V loads under this one's work) where a program's list is short enough to pay: at most this
# many key tiles on average. The dq kernel alone, replayed from CUDA graphs on one H200 (butterfly on
# 128-blocks, 16 heads, batch 1; results/s35/call7/persistent_dq.json), row-tile / persistent time:
#   d64 (three stages both): n4k 1.26x / 1.21x / 1.14x with 0 / 2 / all factors, n16k 1.34x / 1.23x / 1.09x;
#   d128 (two stages against four: double Q and dO buffers leave room for two): 1.24x at one block per
#        row (2 tiles) at n4k and n16k, 1.02x and 0.96x at three (6 tiles), 0.89x and 0.80x with all
#        factors; dense d128 calls 0.62-0.93x, so they keep the row-tile kernel.
# Both give bitwise-equal dq and delta (24 dense and block-sparse checks in bf16 and fp16). Block-sparse
# fwd+bwd with it off / on, alternating in one process (ab_block_sparse.py, results/s36/call1/), from
# graphs: d128 1.09x at n4k 3% and n16k 0.8% (the only points it takes there), d64 1.00-1.08x at
# 3-10%; the block-sparse GPU tests passed with it (178). FLASHTRAIN_PERSISTENT_DQ=0 turns it off.
# d128 everywhere against nowhere (session 58, results/s58/call3/ and call4/): 1.08x at 2 tiles (n4k 3%,
# n16k 0.8%), 1.04x at 4 (n4k 6.25%: 1.25 -> 1.30x Flex), 1.00x and 0.97x at 6 (n4k 9.4%, n16k 2.3%),
# 0.88-0.96x from 12; so up to 4.
PERSISTENT_DQ_ENABLED = os.environ.get("FLASHTRAIN_PERSISTENT_DQ", "1") != "0"
PERSISTENT_DQ = {
    64: (dataclasses.replace(CONFIGS[64][1], persistent=True), math.inf),
    128: (dq_hopper.PERSISTENT_CONFIGS[128], 4),
}
# The dK/dV kernel's persistent variant (one program per SM walking its share of the key tiles' lists,
# the next tile's K and V loads under this one's steps, each list in one loop: see NOTES_attention.md,
# "Short block-sparse lists", for the two-loop version ptxas miscompiled) where the dq kernel's programs
# walk at most this many of its key tiles on average (d64's tiles hold 128 keys, d128's 64). Bitwise
# equal to the grid kernel in 54 checks (results/s37/call1/). Block-sparse fwd+bwd off / on, alternating
# in one process (ab_block_sparse.py, results/s37/call2/ and call3/), from graphs: d128 1.06-1.10x at
# 2-6 tiles, 0.99-1.04x from 12 on; d64 1.06-1.16x at 1-6, 1.01-1.06x at 8-16, 0.95-0.97x at 32-58.
# d64's walks the dense path's 128-query steps on two stages, not the grid kernel's 64-query steps on four
# (half the steps a list, each twice as long): fwd+bwd from graphs, three alternating runs at n4k
# (results/s61/call4-6/), 64- / 128-query steps: 1.017-1.027x at 9-49% density, 1.003-1.009x at 6.25%,
# 0.985-0.994x at 3%; n16k 6-10% 1.003-1.021x (two runs). (The grid kernel on them at n16k 25%: 0.997x
# and 1.021x, and its causal build spills at two stages: it keeps 64.)
PERSISTENT_DKDV = {
    64: (dataclasses.replace(dkdv_hopper.CONFIGS[64], persistent=True), 16),
    128: (dataclasses.replace(CONFIGS[128][2], persistent=True), 6),
}
# The one-kernel backward (`_flash_bwd_fused_hopper` walking the dK/dV kernel's lists: 5 products of each
# tile instead of the two kernels' 7, dQ added per step in fp32) per head dim: (ordered, from this mean
# number of the dq kernel's key tiles a program) where it runs, ordered meaning each dq tile's adds in
# key-tile order (bitwise repeatable, as the two kernels are; `col_ranks`). None: the two kernels.
# Its fixed cost is bytes (delta's preprocess, the fp32 dq buffer converted; until session 63 also
# zeroed) against 2 of 7 products saved per tile, so it pays on long lists. d128 ordered, fwd+bwd from
# graphs, two kernels ÷ it, one H200, alternating (ab_block_sparse.py, results/s62/call5-6), by mean tiles
# a dq program:
#   n4k 2 / 4 / 6 / 12 / 15.6 / 31.5 tiles (3-49%): 0.78 / 0.86 / 0.86 / 0.92 / 0.97 / 1.02;
#   n16k 12 / 16 / 25.7 / 63.8 / 115 (4.7-45%): 0.91 / 0.93 / 0.94 / 1.02 / 1.07;
#   n64k 43.7 / 126 / 246 / 451 (4.3-44%): 1.05 / 1.12 / 1.09 / 1.07.
# So from 30 tiles. (Unordered, as the adds land: n16k 0.94-0.95 at 4.7-6.25%, 1.02-1.11 at 10-45%, n4k
# 0.79-0.99, results/s62/call3-4; the block-sparse op has no nondeterministic switch, so it is not taken.)
# Since session 63 each item's first adder stores instead of adding (`_flash_bwd_fused_hopper.FIRST_STORES`),
# and the buffer's zero fill is gone: the ordered kernel 1.03-1.13x faster at n4k, 1.00-1.06x at n16k
# (results/s63/call2). Two kernels ÷ it then (results/s63/call3, call5): n4k 2 / 4 / 6 / 12 / 15.6 / 31.5
# tiles 0.89 / 0.96 / 0.93 / 0.95 and 0.95 / 1.02 and 1.01 / 1.03; n16k 12 / 16 / 25.7 / 63.8 / 115 tiles
# 0.95 / 0.97 / 1.01 and 0.96 / 1.09 / 1.06. Between 16 and 26 tiles the two runs disagree within their
# spread, so the rule stays at 30.
# d64: no one-kernel config (`_flash_bwd_fused_hopper.CONFIGS`). Memory: the fp32 dq buffer, twice dq's
# bytes, lives through the backward (512 MiB at 64k tokens, 16 heads of 128).
ONE_KERNEL_BACKWARD: dict[int, tuple[bool, float] | None] = {64: None, 128: (True, 30.0)}
PROGRAM_ROWS = 128  # query rows of a forward/dq program and keys of a dK/dV program (2 warpgroups x 64)
MAX_LIST_TILE = 0xFFFF  # col_lists packs a query tile into 16 bits


def row_lists(lists: BlockLists) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query tile, its key tiles, partial first: tiles (H, R, C) int32 and counts (H, R, 2) int32
    (tiles listed, how many of them come first and are masked). A query tile with no key tile lists
    tile C (past the sequence) once; the first step is always masked, so that count is at least 1."""
    kind = lists.tile_kind.long()
    n_cols = kind.shape[2]
    tiles = _partial_first(kind).to(torch.int32)
    n_partial = (kind == PARTIAL).sum(-1)
    count = n_partial + (kind == FULL).sum(-1)
    tiles[..., 0] = torch.where(count == 0, n_cols, tiles[..., 0])
    counts = torch.stack([count.clamp(min=1), n_partial.clamp(min=1)], dim=-1)
    return tiles.contiguous(), counts.to(torch.int32).contiguous()


def _col_kind(lists: BlockLists, group: int) -> torch.Tensor:
    """lists' tile kinds per key tile of a key head: (Hk, C, group * R), item g * R + r the query tile
    r of the group's head g (Hk as `col_lists` says)."""
    kind = lists.tile_kind.long()  # (H, R, C)
    heads, n_rows, n_cols = kind.shape
    if heads == 1:
        kind = kind.expand(group, n_rows, n_cols)  # every head of the group sees the same tiles
    return kind.reshape(-1, group, n_rows, n_cols).permute(0, 3, 1, 2).reshape(-1, n_cols, group * n_rows)


def col_lists(lists: BlockLists, group: int, down: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per key tile of a key head, the (query head in its GQA group, query tile) pairs that see it,
    partial first, packed head << 16 | tile: tiles (Hk, C, group * R) int32 and counts (Hk, C, 2)
    int32 (pairs listed, partial ones among them). Hk is 1 for a layout shared by every head, else the
    number of key heads (the layout's heads // group).
    down: the pairs from the last item (g * R + r) down, partial or not, and every one counted as
    possibly partial (the ordered one-kernel backward's walk, `col_ranks`)."""
    n_rows = lists.tile_kind.shape[1]
    kind = _col_kind(lists, group)
    order = _walk_order(kind, down)  # indices g * R + r
    tiles = (order // n_rows) << 16 | (order % n_rows)
    n_partial = (kind == PARTIAL).sum(-1)
    listed = n_partial + (kind == FULL).sum(-1)
    counts = torch.stack([listed, listed if down else n_partial], dim=-1)
    return tiles.to(torch.int32).contiguous(), counts.to(torch.int32).contiguous()


def col_ranks(lists: BlockLists, group: int) -> torch.Tensor:
    """Per entry of `col_lists(lists, group, down=True)`, how many lower key tiles of its key head list
    the entry's item: the ordered one-kernel backward adds each item's dQ in key-tile order, the grid's
    (`_flash_bwd_fused_hopper._sparse_releases`), so a program waits only on programs started before it.
    Walking down, the lower key tiles that list an item reach it earlier in their walks, as in the dense
    convoy: a butterfly key tile c's items c ^ 2^k above c come first in its walk and those below last.
    (Walking up, each program's first steps waited on the last steps of lower ones, in chains: one H200,
    fwd+bwd 0.29-0.87x the two kernels at d128 n16k, results/s62/call4.) int32, shaped as the lists'
    tiles (entries past a list's count: any value)."""
    kind = _col_kind(lists, group)
    listed = (kind != SKIP).int()
    before = torch.cumsum(listed, dim=1) - listed  # (Hk, C, items): listing key tiles below each one
    return torch.gather(before, -1, _walk_order(kind, down=True)).to(torch.int32).contiguous()


def _walk_order(kind: torch.Tensor, down: bool) -> torch.Tensor:
    """Indices along the last dim of kind's listed entries, first: `_partial_first`'s, or with down
    from the last listed index down."""
    if not down:
        return _partial_first(kind)
    index = torch.arange(kind.shape[-1], device=kind.device)
    return torch.sort(
        torch.where(kind == SKIP, kind.shape[-1] + index, kind.shape[-1] - 1 - index), dim=-1
    ).indices


def _partial_first(kind: torch.Tensor) -> torch.Tensor:
    """Indices along the last dim: the PARTIAL entries, then the FULL ones, then the skipped (each in
    ascending order)."""
    rank = torch.where(kind == PARTIAL, 0, torch.where(kind == FULL, 1, 2))
    return torch.sort(rank, dim=-1, stable=True).indices


def _usable(layout: BlockLayout, dropout_p: float, *tensors: torch.Tensor) -> bool:
    q = tensors[0]
    if not ENABLED or INTERPRET or q.device.type != "cuda" or compute_capability(q.device) != (9, 0):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] not in CONFIGS or dropout_p != 0.0:
        return False
    if layout.block_m % PROGRAM_ROWS or layout.block_n % PROGRAM_ROWS:
        return False
    if cdiv(q.shape[1], CONFIGS[q.shape[-1]][2].block_m) > MAX_LIST_TILE:
        return False
    return pipeline.all_tma_ready(tensors)


def usable_forward(q, k, v, layout: BlockLayout, dropout_p: float) -> bool:
    """Whether a block-sparse forward takes the Hopper kernel (else the portable one)."""
    return _usable(layout, dropout_p, q, k, v)


# The backward takes the Hopper kernels at every list length. The per-head-dim floor it had (a dq program
# walking at least 2 of d64's 128-key tiles; results/s31/, s33/call1/: the row-tile Gluon backward alone
# 0.059 against the portable 0.057 ms at one tile, n4k) went with the persistent dq kernel: d64 fwd+bwd
# from CUDA graphs on one H200 at one tile a program, portable backward against Gluon, 0.241 / 0.212 ms
# at n16k 0.8% and 0.071 / 0.065 at n4k 3%, level from 2.3% (results/s36/call3/ab_d64.md).
def usable_backward(
    q, k, v, do, out, layout: BlockLayout, dropout_p: float, lse_grad: bool, forward_hopper: bool | None = None,
) -> bool:  # fmt: skip
    """Whether a block-sparse backward takes the Hopper dq and dK/dV kernels: as the forward, and no
    gradient on lse (the dq kernel computes delta = rowsum(dO * O) without it). forward_hopper: whether
    this call's forward took the Hopper kernel (`usable_forward` of the same q, k, v, layout and
    dropout_p), which settles everything but do, out and lse_grad; None checks everything."""
    if not BACKWARD_ENABLED or lse_grad or not dq_hopper.reads_out(out):
        return False
    if forward_hopper is None:
        return _usable(layout, dropout_p, q, k, v, do)
    # (ENABLED again: it may have been switched off since the forward; tests and benchmarks do)
    return forward_hopper and ENABLED and pipeline.tma_ready(do)


def _row_lists(layout, seqlen_q, seqlen_k, causal, tile_n):
    """`row_lists` for 128-row query tiles and tile_n-key tiles, and the mean number of tiles listed,
    cached on the layout (the mean syncs with the GPU once, when the lists are built)."""

    def build():
        tiles, counts = row_lists(layout.block_lists(seqlen_q, seqlen_k, causal, PROGRAM_ROWS, tile_n))
        return tiles, counts, counts[..., 0].float().mean().item()

    return layout.derived(("hopper_rows", lists_key(seqlen_q, seqlen_k, causal, PROGRAM_ROWS, tile_n)), build)


def _col_lists(layout, seqlen_q, seqlen_k, causal, tile_m, group, ordered=False):
    """`col_lists` for tile_m-row query tiles and 128-key tiles, cached on the layout: (tiles, counts), or
    with ordered the ordered one-kernel backward's ((tiles, counts, ranks), walked down (`col_ranks`), and
    whether every query tile is listed: then each has a first adder, which stores, and its dq buffer needs
    no zeros; the check syncs with the GPU once, when the lists are built)."""

    def build():
        lists = layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, PROGRAM_ROWS)
        if ordered:
            every_item_listed = bool((lists.tile_kind != SKIP).any(-1).all().item())
            return (*col_lists(lists, group, down=True), col_ranks(lists, group)), every_item_listed
        return col_lists(lists, group)

    key = lists_key(seqlen_q, seqlen_k, causal, tile_m, PROGRAM_ROWS)
    return layout.derived(("hopper_cols", key, group, ordered), build)


def _persistent_where_short(cfg, persistent_rule: tuple, mean_tiles: float):
    """cfg, or the persistent config of (`PERSISTENT_FORWARD`, `PERSISTENT_DQ` or `PERSISTENT_DKDV`)'s
    (config, up_to) where a program walks at most up_to key tiles on average."""
    persistent_cfg, up_to = persistent_rule
    return persistent_cfg if mean_tiles <= up_to else cfg


def block_sparse_forward_hopper(q, k, v, layout: BlockLayout, causal: bool, sm_scale: float):
    """(out, natural-log lse (B, H, Sq)) as `kernels.block_sparse._block_sparse_forward` returns them;
    the caller checked `usable_forward`."""
    row_tile_cfg = CONFIGS[q.shape[-1]][0]
    assert row_tile_cfg.block_m * row_tile_cfg.consumers == PROGRAM_ROWS
    # (the persistent variant's lists decide: the default route, which they serve, builds no others)
    persistent_tile_n = PERSISTENT_FORWARD[q.shape[-1]][0].block_n
    tiles, counts, mean_tiles = _row_lists(layout, q.shape[1], k.shape[1], causal, persistent_tile_n)
    cfg = _persistent_where_short(row_tile_cfg, PERSISTENT_FORWARD[q.shape[-1]], mean_tiles)
    if cfg.block_n != persistent_tile_n:  # (d128: the row-tile kernel's key tiles are wider)
        tiles, counts, _ = _row_lists(layout, q.shape[1], k.shape[1], causal, cfg.block_n)
    return fwd_hopper.flash_attn_forward_hopper(
        q, k, v, sm_scale=sm_scale, causal=causal, config=cfg, lists=(tiles, counts)
    )


def block_sparse_backward_hopper(do, q, k, v, out, lse, layout: BlockLayout, causal: bool, sm_scale: float):
    """dq, dk, dv (shaped like q, k, v; dk and dv summed over each key head's group) of a block-sparse
    call; the caller checked `usable_backward`."""
    seqlen_q, seqlen_k, headdim = q.shape[1], k.shape[1], q.shape[-1]
    # (empty_like: a third of torch.empty's host time given dtype and device; contiguous whatever t's strides)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dq_cfg, dkdv_cfg = CONFIGS[headdim][1:]
    assert dq_cfg.block_m * dq_cfg.consumers == PROGRAM_ROWS == dkdv_cfg.block_n * dkdv_cfg.consumers
    tiles, counts, mean_tiles = _row_lists(layout, seqlen_q, seqlen_k, causal, dq_cfg.block_n)
    one_kernel = ONE_KERNEL_BACKWARD.get(headdim)
    if one_kernel is not None and mean_tiles >= one_kernel[1]:
        return _one_kernel_backward(
            do, q, k, v, out, lse, layout, causal, sm_scale, dq, dk, dv, one_kernel[0]
        )
    delta = torch.empty_like(lse)
    if PERSISTENT_DQ_ENABLED:
        dq_cfg = _persistent_where_short(dq_cfg, PERSISTENT_DQ[headdim], mean_tiles)
    # (the dq kernel's tiles per program measure the list lengths of both)
    dkdv_cfg = _persistent_where_short(dkdv_cfg, PERSISTENT_DKDV[headdim], mean_tiles)
    # (the dq kernel writes delta for the dK/dV kernel, which may start under its end: `dependent_after_dq`)
    lists = _col_lists(layout, seqlen_q, seqlen_k, causal, dkdv_cfg.block_m, q.shape[2] // k.shape[2])
    dependent = dkdv_hopper.dependent_after_dq(q)
    dq_hopper.flash_attn_dq_hopper(
        q, k, v, do, out, lse, delta, dq, sm_scale=sm_scale, causal=causal, config=dq_cfg, lists=(tiles, counts),
        dependent_dkdv=dependent,
    )  # fmt: skip
    dkdv_hopper.flash_attn_dkdv_hopper(
        q, k, v, do, dk, dv, lse, delta, sm_scale=sm_scale, causal=causal, config=dkdv_cfg, lists=lists,
        dependent=dependent,
    )  # fmt: skip
    return dq, dk, dv


def _one_kernel_backward(do, q, k, v, out, lse, layout, causal, sm_scale, dq, dk, dv, ordered: bool):
    """`block_sparse_backward_hopper` through the one-kernel backward (`_flash_bwd_fused_hopper` over the
    dK/dV kernel's lists): delta from the portable preprocess, dQ added per step into an fp32 buffer,
    with ordered in key-tile order (bitwise repeatable; each item's first add a store where every item is
    listed, so the buffer is not zero-filled), else as the adds land."""
    cfg = fused_bwd.CONFIGS[q.shape[-1]]
    group = q.shape[2] // k.shape[2]
    lists = _col_lists(layout, q.shape[1], k.shape[1], causal, cfg.block_m, group, ordered)
    if ordered:  # (each item's first adder stores where every item has one)
        lists, every_item_listed = lists
        first_stores = every_item_listed and fused_bwd.FIRST_STORES
    else:  # (ranks unread: the tiles stand in)
        lists, first_stores = (*lists, lists[0]), False
    dq_acc = fused_bwd.dq_buffer(q, k.shape[1], causal, first_stores=first_stores)
    delta = backward_delta(out, do, lse)
    fused_bwd.flash_attn_bwd_fused_hopper(
        q, k, v, do, lse, delta, dq_acc, dk, dv, sm_scale=sm_scale, causal=causal, config=cfg, ordered=ordered,
        lists=lists, first_stores=first_stores,
    )  # fmt: skip
    fused_bwd.sum_dq_buffers(dq_acc, dq, k.shape[1], causal)  # (the kernel added dQ times the softmax scale)
    return dq, dk, dv
