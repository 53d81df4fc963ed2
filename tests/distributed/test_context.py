"""The trainer-facing context: ParallelDims mesh, shard_batch and attention_fn on gloo ranks."""

import pytest
import torch

from flashtrain.distributed import ParallelDims
from tests.distributed.cases import job_results
from tests.distributed.launcher import run_ranks


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


def _stream_priorities(rank, world, dp, sp):
    dims = ParallelDims(dp=dp, sp=sp, world_size=world)
    dims.build_mesh("cuda")
    cuda = torch.device("cuda")
    return [g._get_backend(cuda).options.is_high_priority_stream for g in (dims.sp_group, dims.dp_group)]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (nvidia-h200-x2 through `device`)")
def test_sequence_parallel_groups_use_high_priority_nccl_streams():
    """The ring's transfers must get SMs ahead of queued compute (ParallelDims._high_priority_streams);
    data parallelism keeps NCCL's default streams."""
    assert run_ranks(_stream_priorities, 2, 1, 2, backend="nccl") == [[True, False]] * 2
    assert run_ranks(_stream_priorities, 2, 2, 1, backend="nccl") == [[False, False]] * 2
