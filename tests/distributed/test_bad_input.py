"""Bad inputs raise one clear ValueError on every rank, before any P2P, and leave the group usable."""

import pytest

from tests.distributed.cases import ERROR_CASES, cross_rank_results, job_results, mismatch_cases


@pytest.mark.parametrize("world", (2, 3, 4))
@pytest.mark.parametrize("name", ERROR_CASES)
def test_raises_on_every_rank(world, name):
    err = job_results(world)[f"error/{name}"]
    assert err is None, err


@pytest.mark.parametrize("world,name", [(w, c.name) for w in (2, 4) for c in mismatch_cases(w)])
def test_arguments_differing_across_ranks_raise_on_every_rank(world, name):
    """Checked before the ring: without the check these hang, or mix different masks silently."""
    err = cross_rank_results(world)[f"mismatch/{name}"]
    assert err is None, err
