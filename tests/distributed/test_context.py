"""The trainer-facing context: ParallelDims mesh, shard_batch and attention_fn on gloo ranks."""

import pytest

from flashtrain.distributed import ParallelDims
from tests.distributed.cases import job_results


@pytest.mark.parametrize("world,mode", [(2, "ring"), (2, "ulysses"), (3, "ring"), (3, "ulysses"), (4, "ring"),
                                        (4, "ulysses"), (4, "hybrid")])  # fmt: skip
def test_context_matches_reference(world, mode):
    err = job_results(world)[f"context/{mode}"]
    assert err is None, err


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(dp=2, sp=2, world_size=8), "does not match the world size"),
        (dict(dp=1, sp=4, world_size=4, ulysses=3), "must divide sp"),
        (dict(dp=0, sp=4, world_size=4), "positive int"),
    ],
)
def test_parallel_dims_rejects_bad_degrees(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ParallelDims(**kw)


def test_parallel_dims_needs_a_mesh():
    dims = ParallelDims(dp=2, sp=4, world_size=8, ulysses=2)
    assert dims.ring == 2 and dims.sp_enabled and dims.dp_enabled
    with pytest.raises(ValueError, match="build_mesh"):
        dims.sp_group  # noqa: B018
