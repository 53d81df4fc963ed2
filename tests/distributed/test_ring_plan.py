"""The ring's host-side schedule, checked against brute-force masks over global positions."""

import itertools

import pytest
import torch

from flashtrain.distributed.ring_plan import MaskInfo, pair_call, ring_plan, step_calls
from flashtrain.distributed.sharding import Segment, ring_segments, segments_positions
from kernels.reference import attention_mask, position_mask


def _global_mask(q_pos, k_pos, causal, window, doc_ids=None):
    """Keep-mask of the global attention restricted to the given positions."""
    keep = position_mask(q_pos, k_pos, causal=causal, window=window)
    if doc_ids is not None:
        keep &= doc_ids[q_pos][:, None] == doc_ids[k_pos][None, :]
    return keep


def _calls_mask(calls, nq, nk):
    """The union of what the local calls compute, in local (row, col) coordinates."""
    keep = torch.zeros(nq, nk, dtype=torch.bool)
    for c in calls:
        (r0, r1), (c0, c1) = c.q_rows, c.k_rows
        sub = attention_mask(r1 - r0, c1 - c0, causal=c.causal, window=c.window)
        assert not (keep[r0:r1, c0:c1] & sub).any(), "two calls cover the same entry"
        keep[r0:r1, c0:c1] |= sub
    return keep


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, (0, None), (3, None), (5, 2), (None, 4), (2, 0), (17, 3)])
def test_pair_call_matches_global_mask(causal, window):
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        m, n = (int(x) for x in torch.randint(1, 9, (2,), generator=gen))
        qa, kb = (int(x) for x in torch.randint(0, 24, (2,), generator=gen))
        qs, ks = Segment(qa, m, 0), Segment(kb, n, 0)
        info = MaskInfo(causal=causal, window=window)
        want = _global_mask(torch.arange(qa, qa + m), torch.arange(kb, kb + n), causal, window)
        call = pair_call(qs, ks, info)
        got = _calls_mask([call] if call is not None else [], m, n)
        assert torch.equal(got, want), (qs, ks, call)
        assert (call is None) == (not want.any())  # skipped exactly when nothing is visible


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (5, None)), (False, (3, 2))])
def test_step_calls_cover_the_global_mask(layout, size, causal, window):
    seqlen = 8 * size
    doc_ids = torch.searchsorted(torch.tensor([5, 11, seqlen]), torch.arange(seqlen), right=True)
    for docs in (None, [0, 5, 11, seqlen]):
        for fuse in (True, False):
            info = MaskInfo(causal=causal, window=window, doc_starts=docs, fuse=fuse)
            for r, s in itertools.product(range(size), repeat=2):
                q_segs, k_segs = (
                    ring_segments(seqlen, size, r, layout),
                    ring_segments(seqlen, size, s, layout),
                )
                q_pos, k_pos = segments_positions(q_segs), segments_positions(k_segs)
                want = _global_mask(q_pos, k_pos, causal, window, doc_ids if docs else None)
                calls = step_calls(q_segs, k_segs, info)
                got = _calls_mask(calls, len(q_pos), len(k_pos))
                if docs:  # documents are applied by the element mask; the calls only need to cover them
                    assert not (want & ~got).any()
                else:
                    assert torch.equal(got, want), (r, s, calls)


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_zigzag_causal_is_balanced(size):
    """Every rank computes the same number of visible scores at every step (the point of zigzag)."""
    seqlen, chunk = 2 * size * 4, 4
    info = MaskInfo(causal=True, window=None)
    for t in range(size):
        work = set()
        for r in range(size):
            s = (r - t) % size
            calls = step_calls(
                ring_segments(seqlen, size, r, "zigzag"), ring_segments(seqlen, size, s, "zigzag"), info
            )
            work.add(int(_calls_mask(calls, 2 * chunk, 2 * chunk).sum()))
            assert len(calls) == 1  # each step is a single kernel call
        assert len(work) == 1, (t, work)


@pytest.mark.parametrize("size", [2, 4])
def test_contiguous_causal_skips_steps_and_transfers(size):
    seqlen = 4 * size
    for r in range(size):
        plan = ring_plan(seqlen, size, r, "contiguous", MaskInfo(causal=True, window=None))
        assert [bool(c) for c in plan.calls] == [s <= r for s in range(size)]
        # rank s's K/V go only as far as the last rank (size - 1): no wrap-around to earlier ranks
        assert plan.last_hop == [size - 1 - s for s in range(size)]


def test_block_band_skips_far_tiles():
    size, chunk = 4, 4
    seqlen = size * chunk
    idx = torch.arange(size)
    band = (idx[:, None] - idx[None, :]).abs() <= 1  # one block per contiguous shard
    info = MaskInfo(causal=False, window=None, block_any=band, block_size=chunk)
    plan = ring_plan(seqlen, size, 0, "contiguous", info)
    assert [bool(c) for c in plan.calls] == [True, True, False, False]
    # rank 0's K/V stop at rank 1; rank 1's are needed by rank 0, three hops round the ring
    assert plan.last_hop == [1, 3, 3, 3]
    causal = MaskInfo(causal=True, window=None, block_any=band, block_size=chunk)
    assert ring_plan(seqlen, size, 0, "contiguous", causal).last_hop == [1, 1, 1, 0]


@pytest.mark.parametrize("size", [2, 4])
def test_documents_and_windows_skip_steps_and_transfers(size):
    """Packed documents and sliding windows skip every step whose shard no query can see, and K/V
    travel only as far as the last rank that needs them."""
    chunk = 4
    seqlen = size * chunk
    # one document per contiguous shard: each rank needs only its own K/V, nothing travels
    docs = MaskInfo(causal=False, window=None, doc_starts=list(range(0, seqlen + 1, chunk)))
    # a window of 2 keys back: each rank needs its own shard and the end of the previous one
    window = MaskInfo(causal=False, window=(2, 0))
    for r in range(size):
        plan = ring_plan(seqlen, size, r, "contiguous", docs)
        assert [bool(c) for c in plan.calls] == [s == r for s in range(size)]
        assert plan.last_hop == [0] * size
        plan = ring_plan(seqlen, size, r, "contiguous", window)
        assert [bool(c) for c in plan.calls] == [s in (r, r - 1) for s in range(size)]
        assert plan.last_hop == [1] * (size - 1) + [0]
