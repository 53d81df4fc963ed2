"""Block layouts for block-sparse attention (`kernels.block_sparse`).

A `BlockLayout` is a bool mask (nheads or 1, n_row_blocks, n_col_blocks) over (block_m x block_n)
tiles of the (seqlen_q, seqlen_k) score matrix, carrying its block sizes. Tile (i, j) kept means
queries [i*block_m, (i+1)*block_m) may attend to keys [j*block_n, (j+1)*block_n); everything else is
masked out. The kernel never reads a dropped tile, so time and HBM traffic scale with the density.

Builders (all return a layout shared by every head, nheads=1, unless said otherwise):
- `butterfly_layout`: the union of the butterfly factor matrices (the FlashAttention paper's pattern),
  optionally with global rows/columns and a local band.
- `local_layout`: a sliding window of blocks around the diagonal.
- `strided_layout`: every `stride`-th block diagonal plus a local band (Sparse Transformer style).
- `random_layout`: independent Bernoulli tiles, one pattern per head.
- `BlockLayout(mask, block_m, block_n)`: any user-given mask.
- `make_layout(kind, ...)`: the same from a config description (the model's `block_sparse` backend).

`BlockLayout.block_lists` compiles a layout, for given sequence lengths and causal flag, into the
compressed lists the kernels walk: per query tile the key tiles to visit and per key tile the query
tiles, each split into *full* tiles (every element kept: no element mask needed) and *partial* ones
(crossing the causal diagonal or the end of a sequence). Tiles that causality empties are dropped.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ._common import check_flag, is_int

__all__ = [
    "BlockLayout",
    "BlockLists",
    "butterfly_layout",
    "local_layout",
    "strided_layout",
    "random_layout",
    "make_layout",
]

# tile kinds in BlockLists.tile_kind
SKIP, PARTIAL, FULL = 0, 1, 2


@dataclass(frozen=True)
class BlockLists:
    """Compressed tile lists for one (layout, seqlen_q, seqlen_k, causal, tile size) combination.

    All int32 and contiguous, on the layout's device; H is the layout's head count (1 = shared).
    tile_kind: (H, R, C) SKIP / PARTIAL / FULL per (tile_m x tile_n) tile, R = cdiv(seqlen_q, tile_m).
    row_{full,part}_idx: (H, R, C) key-tile indices per query tile, ascending, valid up to the count;
    row_{full,part}_cnt: (H, R). col_{full,part}_idx: (H, C, R) query-tile indices per key tile;
    col_{full,part}_cnt: (H, C).
    """

    tile_m: int
    tile_n: int
    tile_kind: torch.Tensor
    row_full_idx: torch.Tensor
    row_full_cnt: torch.Tensor
    row_part_idx: torch.Tensor
    row_part_cnt: torch.Tensor
    col_full_idx: torch.Tensor
    col_full_cnt: torch.Tensor
    col_part_idx: torch.Tensor
    col_part_cnt: torch.Tensor


def _compress(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, R, C) bool -> ascending indices of the kept entries of each row first, and their count."""
    # a stable sort of ~keep moves the kept columns to the front in their original order
    idx = torch.sort((~keep).to(torch.uint8), dim=-1, stable=True).indices
    return idx.to(torch.int32).contiguous(), keep.sum(dim=-1, dtype=torch.int32).contiguous()


class BlockLayout:
    """Bool tile mask (nheads or 1, n_row_blocks, n_col_blocks) with its block sizes.

    block_m / block_n: query / key rows per tile; powers of two >= 16 so the kernels can tile them
    (a layout block larger than the kernel's tile is split into several kernel tiles). The mask is
    copied on construction, so a layout is immutable and its compiled lists can be cached.
    """

    def __init__(self, mask: torch.Tensor, block_m: int, block_n: int | None = None):
        block_n = block_m if block_n is None else block_n
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(
                f"BlockLayout mask must be a torch.bool tensor, got {type(mask).__name__}"
                f"{'' if not isinstance(mask, torch.Tensor) else ' of ' + str(mask.dtype)}"
            )
        if mask.dim() == 2:
            mask = mask[None]
        if mask.dim() != 3:
            raise ValueError(
                f"BlockLayout mask must be (nheads or 1, n_row_blocks, n_col_blocks), got shape {tuple(mask.shape)}"
            )
        for name, b in (("block_m", block_m), ("block_n", block_n)):
            if not isinstance(b, int) or b < 16 or b & (b - 1):
                raise ValueError(
                    f"{name}={b!r}: block sizes must be powers of two >= 16 for the kernel to tile them"
                )
        self.mask = mask.detach().clone().contiguous()
        self.block_m = block_m
        self.block_n = block_n
        self._lists: dict[tuple, BlockLists] = {}
        self._derived: dict[tuple, object] = {}

    @property
    def nheads(self) -> int:
        return self.mask.shape[0]

    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.mask.shape)

    @property
    def density(self) -> float:
        """Fraction of kept tiles, averaged over heads (a host-device sync)."""
        return self.mask.float().mean().item()

    def to(self, device: torch.device | str) -> BlockLayout:
        return BlockLayout(self.mask.to(device), self.block_m, self.block_n)

    def cuda(self) -> BlockLayout:
        return self.to("cuda")

    def expand(self, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
        """Element keep-mask (nheads or 1, seqlen_q, seqlen_k): only for small shapes and tests."""
        m = self.mask.repeat_interleave(self.block_m, dim=-2).repeat_interleave(self.block_n, dim=-1)
        return m[:, :seqlen_q, :seqlen_k]

    def __repr__(self) -> str:
        return f"BlockLayout(shape={self.shape}, block_m={self.block_m}, block_n={self.block_n})"

    def check_covers(self, seqlen_q: int, seqlen_k: int) -> None:
        _, rows, cols = self.mask.shape
        if rows * self.block_m < seqlen_q or cols * self.block_n < seqlen_k:
            raise ValueError(
                f"block layout grid {rows}x{cols} of {self.block_m}x{self.block_n} tiles covers "
                f"{rows * self.block_m}x{cols * self.block_n} but the scores are {seqlen_q}x{seqlen_k}: "
                f"build the layout for at least {math.ceil(seqlen_q / self.block_m)} row and "
                f"{math.ceil(seqlen_k / self.block_n)} column blocks"
            )

    def block_lists(
        self,
        seqlen_q: int,
        seqlen_k: int,
        causal: bool = False,
        tile_m: int | None = None,
        tile_n: int | None = None,
    ) -> BlockLists:
        """Compile the layout into the kernels' tile lists (cached per argument set).

        tile_m / tile_n: the kernel's tile sizes; they must divide block_m / block_n (default: equal).
        Causal is aligned bottom-right like `kernels.reference.attention_mask`.
        """
        tile_m = self.block_m if tile_m is None else tile_m
        tile_n = self.block_n if tile_n is None else tile_n
        if self.block_m % tile_m or self.block_n % tile_n:
            raise ValueError(
                f"kernel tile {tile_m}x{tile_n} does not divide the layout block {self.block_m}x{self.block_n}"
            )
        self.check_covers(seqlen_q, seqlen_k)
        key = lists_key(seqlen_q, seqlen_k, causal, tile_m, tile_n)
        if key not in self._lists:
            self._lists[key] = self._build_lists(seqlen_q, seqlen_k, bool(causal), tile_m, tile_n)
        return self._lists[key]

    def derived(self, key: tuple, build):
        """build(), cached on this layout under key: what a kernel derives from `block_lists` (the Hopper
        kernels' tile lists, `kernels._block_sparse_hopper`) is built once per layout and shape."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def _build_lists(
        self, seqlen_q: int, seqlen_k: int, causal: bool, tile_m: int, tile_n: int
    ) -> BlockLists:
        rows, cols = math.ceil(seqlen_q / tile_m), math.ceil(seqlen_k / tile_n)
        # refine the layout to kernel tiles and crop blocks that lie wholly past the sequence
        keep = self.mask.repeat_interleave(self.block_m // tile_m, dim=1)
        keep = keep.repeat_interleave(self.block_n // tile_n, dim=2)[:, :rows, :cols]  # (H, R, C)

        dev = self.mask.device
        r = torch.arange(rows, device=dev)[:, None]
        c = torch.arange(cols, device=dev)[None, :]
        row_lo, row_hi = r * tile_m, torch.clamp((r + 1) * tile_m, max=seqlen_q) - 1  # first/last query
        col_lo, col_hi = c * tile_n, (c + 1) * tile_n - 1  # first/last key (may pass seqlen_k)
        full = ((r + 1) * tile_m <= seqlen_q) & (col_hi < seqlen_k)  # no sequence tail inside the tile
        if causal:
            shift = seqlen_k - seqlen_q  # query i sits at key position i + shift
            keep = keep & (col_lo <= row_hi + shift)  # some key of the tile is visible to some query
            full = full & (col_hi <= row_lo + shift)  # every key visible to every query
        full = keep & full
        part = keep & ~full
        kind = full.to(torch.int8) * FULL + part.to(torch.int8) * PARTIAL
        row_full_idx, row_full_cnt = _compress(full)
        row_part_idx, row_part_cnt = _compress(part)
        col_full_idx, col_full_cnt = _compress(full.transpose(1, 2))
        col_part_idx, col_part_cnt = _compress(part.transpose(1, 2))
        return BlockLists(
            tile_m, tile_n, kind.contiguous(),
            row_full_idx, row_full_cnt, row_part_idx, row_part_cnt,
            col_full_idx, col_full_cnt, col_part_idx, col_part_cnt,
        )  # fmt: skip


def lists_key(seqlen_q: int, seqlen_k: int, causal: bool, tile_m: int, tile_n: int) -> tuple:
    """What a layout's tile lists for these arguments depend on, as a cache key. Without causality a tile's
    kind depends on the lengths only through the tile counts and whether the last row and column tiles
    are whole, so calls whose lengths differ inside their last tiles share one build (a decode step's one
    query against a cache that grows by a key a step: one build a key tile, not one a step); causal
    lists follow the diagonal's offset, so they take the exact lengths."""
    if causal:
        return (seqlen_q, seqlen_k, True, tile_m, tile_n)
    whole_rows, whole_cols = seqlen_q // tile_m, seqlen_k // tile_n
    rows, cols = math.ceil(seqlen_q / tile_m), math.ceil(seqlen_k / tile_n)
    return (rows, whole_rows, cols, whole_cols, False, tile_m, tile_n)


def _n_blocks(seqlen: int, block_size: int) -> int:
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size!r}: use a power of two >= 16 so the kernel can tile it")
    if not isinstance(seqlen, int) or seqlen < 1:
        raise ValueError(f"seqlen must be a positive int, got {seqlen!r}")
    return math.ceil(seqlen / block_size)


def _finish(keep: torch.Tensor, block_size: int, global_blocks: int, local_blocks: int, causal: bool):
    """Add global rows/columns and the local band to a (H, B, B) keep-mask, apply causality."""
    for name, v in (("global_blocks", global_blocks), ("local_blocks", local_blocks)):
        if not is_int(v) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    check_flag("causal", causal)
    n = keep.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    keep = keep | (i < global_blocks) | (j < global_blocks) | ((i - j).abs() <= local_blocks)
    if causal:
        keep = keep & (j <= i)
    return BlockLayout(keep, block_size)


def butterfly_layout(
    seqlen: int,
    block_size: int,
    n_factors: int | None = None,
    global_blocks: int = 0,
    local_blocks: int = 0,
    causal: bool = False,
) -> BlockLayout:
    """Union of the butterfly factor matrices over B = cdiv(seqlen, block_size) blocks.

    With B padded to P = next power of two, tile (i, j) is kept when i == j or i XOR j == 2^k for
    some k < n_factors (default: all log2(P) factors); then the first `global_blocks` rows and
    columns, and the band |i - j| <= local_blocks, are added. causal=True keeps only j <= i.
    The padded grid is cropped back to B x B. Density is about (1 + n_factors) / B.
    """
    n = _n_blocks(seqlen, block_size)
    levels = max(1, (n - 1).bit_length())  # log2 of the padded size P
    if n_factors is None:
        n_factors = levels
    if not isinstance(n_factors, int) or not 0 <= n_factors <= levels:
        raise ValueError(f"n_factors must be an int in [0, {levels}] for {n} blocks, got {n_factors!r}")
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    x = i ^ j
    power_of_two = (x > 0) & ((x & (x - 1)) == 0)
    keep = (x == 0) | (power_of_two & (x < (1 << n_factors)))
    return _finish(keep[None], block_size, global_blocks, local_blocks, causal)


def local_layout(seqlen: int, block_size: int, local_blocks: int = 1, causal: bool = False) -> BlockLayout:
    """Sliding window: tile (i, j) kept when |i - j| <= local_blocks (and j <= i when causal)."""
    n = _n_blocks(seqlen, block_size)
    return _finish(torch.zeros(1, n, n, dtype=torch.bool), block_size, 0, local_blocks, causal)


def strided_layout(
    seqlen: int, block_size: int, stride: int, local_blocks: int = 0, causal: bool = False
) -> BlockLayout:
    """Tile (i, j) kept when (i - j) is a multiple of `stride`, or |i - j| <= local_blocks."""
    n = _n_blocks(seqlen, block_size)
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return _finish(((i - j) % stride == 0)[None], block_size, 0, local_blocks, causal)


def random_layout(
    seqlen: int,
    block_size: int,
    density: float,
    nheads: int = 1,
    seed: int = 0,
    keep_diagonal: bool = True,
    causal: bool = False,
) -> BlockLayout:
    """Each tile kept independently with probability `density`, a different pattern per head.

    keep_diagonal=True also keeps every (i, i) tile, so that no query block is left without keys.
    """
    n = _n_blocks(seqlen, block_size)
    if isinstance(density, bool) or not isinstance(density, numbers.Real) or not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density!r}")
    if not is_int(nheads) or nheads < 1:
        raise ValueError(f"nheads must be an int >= 1, got {nheads!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    check_flag("keep_diagonal", keep_diagonal)
    check_flag("causal", causal)
    gen = torch.Generator().manual_seed(int(seed))
    keep = torch.rand(nheads, n, n, generator=gen) < density
    if keep_diagonal:
        keep |= torch.eye(n, dtype=torch.bool)
    if causal:
        keep &= torch.ones(n, n, dtype=torch.bool).tril()
    return BlockLayout(keep, block_size)


_KINDS = {
    "butterfly": butterfly_layout,
    "local": local_layout,
    "strided": strided_layout,
    "random": random_layout,
}


def make_layout(
    kind: str, seqlen: int, block_size: int, nheads: int = 1, causal: bool = False, **params
) -> BlockLayout:
    """Build a layout from a config description, e.g. ``make_layout("butterfly", 65536, 128, n_factors=4)``.

    kind: one of butterfly / local / strided / random; params are that builder's keyword arguments.
    nheads only matters for `random` (one pattern per head); the others share one pattern.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown block layout kind {kind!r}: use one of {sorted(_KINDS)}")
    if kind == "random":
        params["nheads"] = nheads
    try:
        return _KINDS[kind](seqlen, block_size, causal=causal, **params)
    except TypeError as e:  # unknown or missing keyword: say which builder and what it takes
        raise ValueError(f"bad parameters {sorted(params)} for a {kind!r} layout: {e}") from None
