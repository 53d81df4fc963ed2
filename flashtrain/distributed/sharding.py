"""Which global sequence positions each sequence-parallel rank holds, and moving tensors between
the full sequence and the local shards.

Two layouts over a ring of P ranks:
- "contiguous": rank r holds positions [r * S/P, (r+1) * S/P).
- "zigzag": the sequence is cut into 2P chunks of S/(2P) and rank r holds chunks r and 2P-1-r,
  concatenated in that order. Under a causal mask every rank then has the same amount of work at
  every ring step (an early chunk with little to attend paired with a late one with much).

With Ulysses inside a ring (the 2-D "hybrid" mode) each ring shard is further cut into U contiguous
pieces, one per Ulysses rank; a Ulysses all-to-all concatenates them back into the ring shard.
Within a rank the local order always increases with global position, which the ring relies on
(causal attention of a rank's shard against itself is then plain local causal attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Segment:
    """A run of `length` consecutive global positions starting at `start`, stored at local rows
    [row, row + length) of a shard."""

    start: int
    length: int
    row: int


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_seqlen(seqlen: int, ring_size: int, layout: str, ulysses_size: int = 1) -> None:
    """One clear error for a sequence the layout cannot cut evenly (identical on every rank)."""
    check_layout(layout)
    chunks = 2 * ring_size if layout == "zigzag" else ring_size
    if seqlen % chunks != 0:
        raise ValueError(
            f"sequence length {seqlen} is not divisible by {chunks} = "
            f"{'2 * ' if layout == 'zigzag' else ''}ring size {ring_size} ({layout} layout): "
            f"pad or crop the sequence to a multiple of {chunks}"
        )
    if (seqlen // ring_size) % ulysses_size != 0:
        raise ValueError(
            f"the ring shard of {seqlen // ring_size} tokens (sequence {seqlen} / ring size {ring_size}) is not "
            f"divisible by the Ulysses degree {ulysses_size}: make the sequence a multiple of "
            f"{ring_size * ulysses_size * (2 if layout == 'zigzag' else 1)}"
        )


def ring_segments(seqlen: int, ring_size: int, ring_rank: int, layout: str) -> list[Segment]:
    """The global runs held by ring rank `ring_rank` (before any Ulysses split)."""
    check_seqlen(seqlen, ring_size, layout)
    if layout == "contiguous":
        n = seqlen // ring_size
        return [Segment(ring_rank * n, n, 0)]
    c = seqlen // (2 * ring_size)
    return [Segment(ring_rank * c, c, 0), Segment((2 * ring_size - 1 - ring_rank) * c, c, c)]


def segment_runs(segments: list[Segment], rows: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """(global start, length) of each run of consecutive positions in local rows [rows) of a shard."""
    runs = []
    for s in segments:
        lo, hi = max(rows[0], s.row), min(rows[1], s.row + s.length)
        if lo < hi:
            runs.append((s.start + lo - s.row, hi - lo))
    return tuple(runs)


def segments_positions(segments: list[Segment], device=None) -> torch.Tensor:
    """Global position of every local row, (sum of lengths,) int64."""
    return torch.cat([torch.arange(s.start, s.start + s.length, device=device) for s in segments])


def shard_positions(
    seqlen: int,
    *,
    layout: str,
    ring_size: int,
    ring_rank: int,
    ulysses_size: int = 1,
    ulysses_rank: int = 0,
    device=None,
) -> torch.Tensor:
    """Global positions (seqlen / (ring_size * ulysses_size),) held by rank (ulysses_rank, ring_rank),
    in local order. The rank's position in the flattened sp group is ring_rank * ulysses_size + ulysses_rank.
    """
    check_seqlen(seqlen, ring_size, layout, ulysses_size)
    ring_pos = segments_positions(ring_segments(seqlen, ring_size, ring_rank, layout), device)
    n = ring_pos.numel() // ulysses_size
    return ring_pos[ulysses_rank * n : (ulysses_rank + 1) * n]


def shard(
    x: torch.Tensor,
    *,
    layout: str,
    ring_size: int,
    ring_rank: int,
    ulysses_size: int = 1,
    ulysses_rank: int = 0,
    dim: int = 1,
) -> torch.Tensor:
    """The local shard of a full-sequence tensor along `dim` (a copy for zigzag, a view otherwise)."""
    pos = shard_positions(
        x.shape[dim],
        layout=layout,
        ring_size=ring_size,
        ring_rank=ring_rank,
        ulysses_size=ulysses_size,
        ulysses_rank=ulysses_rank,
    )
    if layout == "contiguous":
        return x.narrow(dim, int(pos[0]), pos.numel())
    return x.index_select(dim, pos.to(x.device))


def unshard(
    shards: list[torch.Tensor], *, layout: str, ring_size: int, ulysses_size: int = 1, dim: int = 1
) -> torch.Tensor:
    """Inverse of `shard`: shards[sp_rank] with sp_rank = ring_rank * ulysses_size + ulysses_rank."""
    if len(shards) != ring_size * ulysses_size:
        raise ValueError(
            f"expected {ring_size * ulysses_size} shards (ring {ring_size} x Ulysses {ulysses_size}), got {len(shards)}"
        )
    seqlen = sum(s.shape[dim] for s in shards)
    perm = torch.cat(
        [
            shard_positions(
                seqlen, layout=layout, ring_size=ring_size, ring_rank=i // ulysses_size,
                ulysses_size=ulysses_size, ulysses_rank=i % ulysses_size,
            )
            for i in range(len(shards))
        ]
    )  # fmt: skip
    stacked = torch.cat(shards, dim=dim)  # stacked position i holds global position perm[i]
    return stacked.index_select(dim, torch.argsort(perm).to(stacked.device))


def gather_full(
    local: torch.Tensor, group, *, layout: str, ring_size: int, ulysses_size: int = 1, dim: int = 1
) -> torch.Tensor:
    """All-gather the shards of `group` (ordered as the sp group) and unshard them. Blocks: a collective.

    For evaluation and tests; `group` must be the flattened sp group (ring_rank * U + ulysses_rank).
    """
    import torch.distributed as dist

    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return unshard(parts, layout=layout, ring_size=ring_size, ulysses_size=ulysses_size, dim=dim)
