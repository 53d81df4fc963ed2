"""Ring attention on 2, 3 and 4 gloo ranks against the single-process reference (see cases.py).

All cases of a world size run in one spawned job (process start dominates on CPU); each case is
reported as its own test.
"""

import pytest

from tests.distributed.cases import GRADIENT_GROUP_CASES, cross_rank_results, job_results, ring_cases

WORLDS = (2, 3, 4)


@pytest.mark.parametrize("world,name", [(w, c.name) for w in WORLDS for c in ring_cases(w)])
def test_ring_matches_reference(world, name):
    err = job_results(world)[name]
    assert err is None, err


@pytest.mark.parametrize("world", WORLDS)
def test_ring_usable_after_bad_inputs(world):
    err = job_results(world)["after-errors"]
    assert err is None, err


@pytest.mark.parametrize(
    "world,name",
    [
        (w, n)
        for w in WORLDS
        for n in ["grad-group/other-ranks", "grad-group/in-spec", *(c.name for c in GRADIENT_GROUP_CASES)]
    ],
)
def test_ring_gradients_over_a_second_group(world, name):
    err = job_results(world)[name]
    assert err is None, err


@pytest.mark.parametrize("world", WORLDS)
def test_ring_backward_keeps_each_ranks_own_dkdv_part_home(world):
    err = job_results(world)["accumulator-hops"]
    assert err is None, err


def test_ring_ranks_share_the_first_ranks_dropout_draw():
    """dropout_seed=None with torch seeded differently on each rank: one mask, from rank 0's draw."""
    err = cross_rank_results(2)["drawn-seed-ring"]
    assert err is None, err
