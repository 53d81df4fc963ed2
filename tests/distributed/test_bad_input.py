"""Bad inputs raise one clear ValueError on every rank, before any P2P, and leave the group usable."""

import pytest

from tests.distributed.cases import ERROR_CASES, job_results


@pytest.mark.parametrize("world", (2, 3, 4))
@pytest.mark.parametrize("name", ERROR_CASES)
def test_raises_on_every_rank(world, name):
    err = job_results(world)[f"error/{name}"]
    assert err is None, err
