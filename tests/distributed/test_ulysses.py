"""Ulysses (2, 3, 4 ranks) and the 2 x 2 hybrid against the single-process reference (see cases.py)."""

import pytest

from tests.distributed.cases import cross_rank_results, job_results, ulysses_cases

WORLDS = (2, 3, 4)


@pytest.mark.parametrize("world,name", [(w, c.name) for w in WORLDS for c in ulysses_cases(w)])
def test_ulysses_and_hybrid_match_reference(world, name):
    err = job_results(world)[name]
    assert err is None, err


def test_ulysses_ranks_share_the_first_ranks_dropout_draw():
    """dropout_seed=None with torch seeded differently on each rank: one mask, from rank 0's draw."""
    err = cross_rank_results(2)["drawn-seed-ulysses"]
    assert err is None, err
