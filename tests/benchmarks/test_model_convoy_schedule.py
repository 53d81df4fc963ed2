"""benchmarks/model_convoy_schedule.py's step-by-step model: its launch orders and its LRU distances."""

from __future__ import annotations

import pytest

from benchmarks import model_convoy_schedule as model


def test_blocks_of_one_launch_a_heads_last_keys_first_and_larger_blocks_heaviest_first_within():
    assert model.launch_order("blocks:1", 2, 3) == [(0, 2), (0, 1), (0, 0), (1, 2), (1, 1), (1, 0)]
    # (5 key tiles in blocks of 2: the partial block 4, then 2-3, then 0-1)
    assert model.launch_order("blocks:2", 1, 5) == [(0, 4), (0, 2), (0, 3), (0, 0), (0, 1)]
    order = model.launch_order("unordered", 4, 2)  # (chunks of 3 heads, tile-major)
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (3, 1)]
    assert model.launch_order("ascending", 2, 2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # (runs of 2 heads, their programs round robin, heaviest first; the third head alone)
    order = model.launch_order("ascending:2", 3, 2)
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    # (5 key tiles in 2 groups, 0-2 then 3-4, each last keys first)
    assert model.launch_order("groups:2", 1, 5) == [(0, 2), (0, 1), (0, 0), (0, 4), (0, 3)]


def test_in_key_groups_a_program_waits_only_on_its_own_group():
    """One slot, one head of 4 tiles in 2 groups, launched 1, 0 (group 0), then 3, 2: program 1 runs
    first and never waits on program 2, of the other group and not yet started (in one group it would
    wait for ever), so the slot runs the programs one after another and reads their tiles in launch order."""
    efficiency, reads = model.simulate_steps(4, 1, 1, 2, 2, "groups:2")
    assert [t for _, _, t in sorted(reads)] == [1, 2, 3, 0, 1, 2, 3, 3, 2, 3]
    assert 0 < efficiency <= 1


def test_lru_distance_counts_the_distinct_tiles_read_in_between():
    reads = [(0, 0, "a"), (1, 0, "b"), (2, 0, "b"), (3, 0, "c"), (4, 0, "a"), (5, 0, "c")]
    assert model.lru_distances(reads) == [0, 2, 1]


@pytest.mark.parametrize(
    "scheme",
    [
        "blocks:1",
        "blocks:4",
        "unordered",
        "ascending",
        "ascending:2",
        "groups:2",
        "groups:3",
        "down:blocks:1",
        "down:blocks:4",
        "down:groups:2",
    ],
)
def test_every_program_reads_its_tiles_once_and_no_schedule_beats_the_slots(scheme):
    tiles, heads = 12, 2
    efficiency, reads = model.simulate_steps(tiles, heads, 4, 2, 2, scheme)
    assert len(reads) == heads * tiles * (tiles + 1) // 2
    assert sorted((h, t) for _, h, t in reads) == sorted((h, t) for h in range(heads) for j in range(tiles)
                                                          for t in range(j, tiles))  # fmt: skip
    assert 0 < efficiency <= 1


def test_walking_down_a_program_reads_its_tiles_from_the_last():
    """One slot, one head of 3 tiles, blocks of 1 walking down: program 2 reads tile 2, then program 1
    tiles 2 and 1, then program 0 tiles 2, 1 and 0, each read a step (2 ticks) after the last."""
    _, reads = model.simulate_steps(3, 1, 1, 2, 0, "down:blocks:1")
    assert [t for _, _, t in sorted(reads)] == [2, 2, 1, 2, 1, 0]
