"""Host-side schedule of a ring: which local attention calls each (query rank, key rank) pair needs,
and how far each rank's K/V must travel.

Every mask the ring supports is a function of global positions: causal (key <= query), a sliding
window (query - left <= key <= query + right), documents (same document) and a block layout. A rank's
shard is a list of `Segment`s (runs of consecutive positions), so a (query segment, key segment) pair
is one local attention whose causal/window mask is the global one shifted by the segments' offset:
with the kernels' bottom-right alignment (query row i sits at key position p = i + n - m), key j is
visible when p + off - left <= j <= p + off + right, off = q_start - k_start - (n - m). A pair is
skipped when no query of it sees any key; a step is skipped when all its pairs are.

K/V of rank s travel s -> s+1 -> ... only as far as the last rank that needs them (`last_hop[s]`
hops), so e.g. a contiguous causal ring never sends a late rank's K/V to the earlier ranks, and a
block-sparse layout whose far tiles are empty never ships them. Every rank computes the same
schedule from the same arguments, so senders and receivers agree without talking.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from .sharding import Segment, ring_segments


@dataclass(frozen=True)
class LocalCall:
    """One local attention: query rows [q_rows) of the local shard against rows [k_rows) of the key
    shard, with causal/window in the call's own (bottom-right aligned, possibly negative) coordinates."""

    q_rows: tuple[int, int]
    k_rows: tuple[int, int]
    causal: bool
    window: tuple[int | None, int | None] | None


@dataclass(frozen=True)
class MaskInfo:
    """The global mask, host-side. doc_starts: cu_seqlens as a list; block_any: (n_row_blocks,
    n_col_blocks) bool on CPU, True where any head keeps the tile; fuse: merge pairs into fewer calls
    (off for dropout, whose kernel offsets need runs of consecutive positions)."""

    causal: bool
    window: tuple[int | None, int | None] | None
    doc_starts: list[int] | None = None
    block_any: torch.Tensor | None = None
    block_size: int = 1
    fuse: bool = True


def _doc_range(starts: list[int], seg: Segment) -> tuple[int, int]:
    first = bisect.bisect_right(starts, seg.start) - 1
    last = bisect.bisect_right(starts, seg.start + seg.length - 1) - 1
    return first, last


def pair_call(qs: Segment, ks: Segment, info: MaskInfo) -> LocalCall | None:
    """The call for one (query segment, key segment) pair, or None when every query sees no key."""
    m, n = qs.length, ks.length
    off = qs.start - ks.start - (n - m)
    left, right = info.window if info.window is not None else (None, None)
    lo = None if left is None else off - left  # row p sees keys [p + lo, p + hi]; None is unbounded
    hi = None if right is None else off + right
    if info.causal:
        hi = off if hi is None else min(hi, off)
    pmin, pmax = n - m, n - 1
    if lo is not None and hi is not None and lo > hi:
        return None
    # each row's band is non-empty and moves by one per row, so their union is one interval
    if (lo is not None and pmin + lo > n - 1) or (hi is not None and pmax + hi < 0):
        return None
    if info.doc_starts is not None:
        qd, kd = _doc_range(info.doc_starts, qs), _doc_range(info.doc_starts, ks)
        if qd[1] < kd[0] or kd[1] < qd[0]:
            return None
    if info.block_any is not None:
        bs = info.block_size
        tile = info.block_any[
            qs.start // bs : (qs.start + m - 1) // bs + 1, ks.start // bs : (ks.start + n - 1) // bs + 1
        ]
        if not bool(tile.any()):
            return None
    # a bound that no row reaches is dropped, so fully visible pairs become plain dense calls
    lo = None if lo is None or pmax + lo <= 0 else lo
    hi = None if hi is None or pmin + hi >= n - 1 else hi
    rows, cols = (qs.row, qs.row + m), (ks.row, ks.row + n)
    if hi == 0:
        return LocalCall(rows, cols, True, None if lo is None else (-lo, None))
    if lo is None and hi is None:
        return LocalCall(rows, cols, False, None)
    return LocalCall(rows, cols, False, (None if lo is None else -lo, hi))


def step_calls(q_segs: list[Segment], k_segs: list[Segment], info: MaskInfo) -> list[LocalCall]:
    """The calls of one ring step (empty list: skip the step)."""
    pairs = {(i, j): pair_call(qs, ks, info) for i, qs in enumerate(q_segs) for j, ks in enumerate(k_segs)}
    live = {key: call for key, call in pairs.items() if call is not None}
    if not live:
        return []
    if info.fuse:
        nq, nk = sum(s.length for s in q_segs), sum(s.length for s in k_segs)
        # a shard against itself: local order increases with global position, so global causal is
        # local causal on the whole shard (the zigzag diagonal step is one call, not three)
        if q_segs == k_segs and info.causal and info.window is None:
            return [LocalCall((0, nq), (0, nk), True, None)]
        dense = all(not c.causal and c.window is None for c in live.values())
        rows = sorted({i for i, _ in live})
        cols = sorted({j for _, j in live})
        rectangle = len(live) == len(rows) * len(cols)
        consecutive = rows == list(range(rows[0], rows[-1] + 1)) and cols == list(
            range(cols[0], cols[-1] + 1)
        )
        if dense and rectangle and consecutive:
            r0, r1 = q_segs[rows[0]], q_segs[rows[-1]]
            c0, c1 = k_segs[cols[0]], k_segs[cols[-1]]
            return [LocalCall((r0.row, r1.row + r1.length), (c0.row, c1.row + c1.length), False, None)]
    return list(live.values())


@dataclass(frozen=True)
class RingPlan:
    """calls[s]: this rank's calls against rank s's K/V; last_hop[s]: how many hops rank s's K/V
    (and, in the backward, their gradient accumulators) travel before turning home."""

    calls: list[list[LocalCall]]
    last_hop: list[int]
    segments: list[list[Segment]]


def ring_plan(seqlen: int, size: int, rank: int, layout: str, info: MaskInfo) -> RingPlan:
    segments = [ring_segments(seqlen, size, r, layout) for r in range(size)]
    need = [[bool(step_calls(segments[r], segments[s], info)) for s in range(size)] for r in range(size)]
    last_hop = [max((u for u in range(1, size) if need[(s + u) % size][s]), default=0) for s in range(size)]
    calls = [step_calls(segments[rank], segments[s], info) for s in range(size)]
    return RingPlan(calls, last_hop, segments)
