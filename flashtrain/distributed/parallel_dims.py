"""Parallel degrees and the device mesh that owns their process groups (torchtitan style)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist


@dataclass
class ParallelDims:
    """Degrees of data and sequence parallelism.

    dp: data-parallel degree (replicas that see different batches).
    sp: sequence-parallel degree (ranks that share one sequence); sp = ring * ulysses.
    world_size: number of processes; must equal dp * sp.
    ulysses: all-to-all (Ulysses) degree inside sp; the rest of sp is a ring.

    Mesh dims: ("dp", "sp") and, when both ulysses and ring exceed 1, ("dp", "sp_ring", "sp_ulysses")
    plus "sp" flattened from the last two. Ulysses is the innermost (consecutive ranks, usually one
    node): its all-to-all is bandwidth-bound and exposed, while ring P2P overlaps compute. A rank's
    sp rank is ring_rank * ulysses + ulysses_rank, which is what `sharding.shard_positions` assumes.
    """

    dp: int
    sp: int
    world_size: int
    ulysses: int = 1
    _mesh: object = field(default=None, init=False, repr=False)
    _sp_mesh: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for name in ("dp", "sp", "world_size", "ulysses"):
            val = getattr(self, name)
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"ParallelDims.{name} must be a positive int, got {val!r}")
        if self.dp * self.sp != self.world_size:
            raise ValueError(
                f"dp ({self.dp}) * sp ({self.sp}) = {self.dp * self.sp} does not match the world size "
                f"{self.world_size}: choose degrees whose product is the number of processes"
            )
        if self.sp % self.ulysses != 0:
            raise ValueError(
                f"the Ulysses degree ({self.ulysses}) must divide sp ({self.sp}); the ring degree is sp / ulysses"
            )

    @property
    def ring(self) -> int:
        return self.sp // self.ulysses

    @property
    def sp_enabled(self) -> bool:
        return self.sp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    def build_mesh(self, device_type: str = "cuda"):
        """Create (collectively: every rank must call it) and keep the DeviceMesh."""
        from torch.distributed.device_mesh import init_device_mesh

        if dist.get_world_size() != self.world_size:
            raise ValueError(
                f"ParallelDims.world_size = {self.world_size} but the process group has {dist.get_world_size()} ranks"
            )
        if self.ulysses > 1 and self.ring > 1:
            mesh = init_device_mesh(
                device_type,
                (self.dp, self.ring, self.ulysses),
                mesh_dim_names=("dp", "sp_ring", "sp_ulysses"),
                **_high_priority_streams(device_type, "sp_ring", self.ring),
            )
            # private but stable since torch 2.4 (torchtitan uses it); keep the flattened mesh itself,
            # slicing it back out of the root mesh is deprecated
            self._sp_mesh = mesh["sp_ring", "sp_ulysses"]._flatten("sp")
        else:
            mesh = init_device_mesh(
                device_type,
                (self.dp, self.sp),
                mesh_dim_names=("dp", "sp"),
                **_high_priority_streams(device_type, "sp", self.sp),
            )
            self._sp_mesh = mesh["sp"]
        self._mesh = mesh
        return mesh

    @property
    def mesh(self):
        if self._mesh is None:
            raise ValueError(
                "call ParallelDims.build_mesh(device_type) on every rank before using its groups"
            )
        return self._mesh

    def _group(self, name: str):
        return self.mesh[name].get_group()

    @property
    def dp_group(self):
        return self._group("dp")

    @property
    def sp_group(self):
        self.mesh  # noqa: B018 - raises the clear error when the mesh is not built
        return self._sp_mesh.get_group()

    @property
    def ring_group(self):
        """The ring's group: sp itself without Ulysses, None with Ulysses only."""
        if self.ulysses == 1:
            return self.sp_group
        return self._group("sp_ring") if self.ring > 1 else None

    @property
    def ulysses_group(self):
        if self.ulysses == 1:
            return None
        return self._group("sp_ulysses") if self.ring > 1 else self.sp_group

    @property
    def grad_group(self):
        """Gradients average over dp and sp together; with no other parallelism that is the world."""
        return dist.group.WORLD

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def sp_rank(self) -> int:
        return dist.get_rank(self.sp_group)

    @property
    def ring_rank(self) -> int:
        return self.sp_rank // self.ulysses

    @property
    def ulysses_rank(self) -> int:
        return self.sp_rank % self.ulysses


def _high_priority_streams(device_type: str, dim: str, size: int) -> dict:
    """init_device_mesh's option giving mesh dimension `dim` (of `size` ranks) NCCL communicators on
    high-priority streams.

    Why: a ring step's dK/dV transfer becomes ready as its dk/dv kernel ends, the moment the dq kernel
    queued behind it starts; on a normal-priority stream the transfer's kernel got SMs only when dq had
    drained, so the next step waited for the whole transfer (0.5 ms twice per fwd+bwd at 8k tokens per
    GPU on 2 H200). On a high-priority stream it starts beside dq: 75% -> 83% of ideal
    (benchmarks/NOTES_parallel.md). Nothing on CPU (gloo has no streams), nor for a dimension of one rank."""
    if device_type != "cuda" or size == 1:
        return {}
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    return {"backend_override": {dim: ("nccl", options)}}
