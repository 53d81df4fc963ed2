"""Sequence parallelism: ring attention (zigzag / contiguous), Ulysses, their 2-D hybrid, and the
trainer-facing context that shards a batch and swaps in the distributed attention."""

# Imported with this package, so before any process group exists: torch.distributed.nn binds the default
# group as a default argument (`group=group.WORLD`) when first imported (torch._dynamo imports it later
# otherwise), which would keep that group, and its threads, alive past destroy_process_group.
import torch.distributed.nn  # noqa: F401

from .context import (
    SequenceParallel,
    current_sequence_parallel,
    sequence_parallel,
    sequence_parallel_attention,
)
from .local_attention import PositionMask, dropout_keep_mask, local_backward, local_forward
from .parallel_dims import ParallelDims
from .ring import RingAttention, ring_attention, set_gradient_group
from .sharding import gather_full, shard, shard_positions, unshard
from .ulysses import UlyssesAttention, hybrid_attention, ulysses_attention

__all__ = [
    "ParallelDims",
    "PositionMask",
    "RingAttention",
    "SequenceParallel",
    "UlyssesAttention",
    "current_sequence_parallel",
    "dropout_keep_mask",
    "gather_full",
    "hybrid_attention",
    "local_backward",
    "local_forward",
    "ring_attention",
    "sequence_parallel",
    "sequence_parallel_attention",
    "set_gradient_group",
    "shard",
    "shard_positions",
    "ulysses_attention",
    "unshard",
]
