"""Ulysses (2, 3, 4 ranks) and the 2 x 2 hybrid against the single-process reference (see cases.py)."""

import pytest

from tests.distributed.cases import job_results, ulysses_cases

WORLDS = (2, 3, 4)


@pytest.mark.parametrize("world,name", [(w, c.name) for w in WORLDS for c in ulysses_cases(w)])
def test_ulysses_and_hybrid_match_reference(world, name):
    err = job_results(world)[name]
    assert err is None, err
