"""Parallelism and other model transforms, applied from outside the single-device model.

`parallelize_gpt(model, parallel_dims, cfg)` applies, in this order (torchtitan's order, for the same
reasons):

1. activation checkpointing per block (`apply_ac`), each block's forward compiled inside its checkpoint
   when compile is on (a graph break inside a compiled checkpoint would leave the whole block eager);
2. else `torch.compile` per block (`apply_compile`);
3. data-parallel wrapping, by `parallel.strategy`:
   - `ddp`  (`apply_ddp`): gradients all-reduced in buckets during the backward;
   - `fsdp` (`apply_fsdp`): FSDP2 `fully_shard` on each block, then on the root (ZeRO-3 style:
     parameters, gradients and optimizer state sharded over the data-parallel ranks);
   - `deepspeed`: nothing here. DeepSpeed's engine owns the optimizer too, so it is built by
     `flashtrain.strategy.DeepSpeedStrategy` (`apply_deepspeed`) once the optimizer groups exist.

Gradients average over data and sequence parallelism together (each sp rank holds a part of every
sequence), so the data-parallel wrapping spans the whole world: `dp x sp` ranks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from flashtrain.models.attention import attention_override, current_override

STRATEGIES = ("none", "ddp", "fsdp", "deepspeed")
FSDP_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # reduce_dtype, residual_dtype


@dataclass
class ParallelConfig:
    """How the model is spread over processes."""

    strategy: str = "none"  # data parallelism: "none" (one process), "ddp", "fsdp" (FSDP2) or "deepspeed"
    sp: int = 1  # sequence-parallel degree (ranks sharing one sequence); dp = world size / sp
    sp_mode: str = "ring"  # how sequence shards attend: "ring", "ulysses" (all-to-all) or "hybrid" (both)
    sp_layout: str = "zigzag"  # sequence sharding: "zigzag" (balanced causal work) or "contiguous"
    ulysses: int = 1  # hybrid: all-to-all degree inside sp (the rest of sp is a ring)
    # fsdp only, blocks' gathered weights after their forward: true (None) frees them, false keeps them to
    # the backward, an int N >= 2 keeps them sharded over groups of N ranks (FSDP2's own option; N must
    # divide the number of processes): a cheaper backward all-gather, 1/N of the weights kept per rank
    reshard_after_forward: bool | int | None = None
    # fsdp only: dtype of the gradient reduce-scatter, "float32" (None: the default, as single-device
    # autocast accumulates) or "bfloat16" (half the bytes and the time NCCL holds SMs; rounded sums)
    reduce_dtype: str | None = None
    # fsdp only: consecutive blocks sharded as one unit (None = 1): one all-gather and one reduce-scatter,
    # and one round of FSDP's per-unit host work, per unit; the unit's weights are gathered together
    blocks_per_unit: int | None = None
    # fsdp only, bf16 runs: dtype of what passes between the sharded units (the residual stream, the
    # rotary tables): "float32" (None: the default, as single-device and DDP autocast, with the embeddings
    # and final norm kept in fp32) or "bfloat16" (FSDP2's own cast of each unit's inputs, as torchtitan
    # does: half the bytes between blocks, rounded residual sums)
    residual_dtype: str | None = None
    zero_stage: int | None = None  # deepspeed only: ZeRO stage 1, 2 or 3 (None = 2)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"parallel.strategy={self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.sp < 1:
            raise ValueError(f"parallel.sp={self.sp} must be >= 1")
        if self.sp_mode not in ("ring", "ulysses", "hybrid"):
            raise ValueError(f"parallel.sp_mode={self.sp_mode!r}; choose ring, ulysses or hybrid")
        if self.sp_layout not in ("zigzag", "contiguous"):
            raise ValueError(f"parallel.sp_layout={self.sp_layout!r}; choose zigzag or contiguous")
        if self.ulysses < 1 or self.sp % self.ulysses:
            raise ValueError(f"parallel.ulysses={self.ulysses} must be >= 1 and divide parallel.sp={self.sp}")
        if self.sp_mode == "ring" and self.ulysses != 1:  # a plain ring never builds a Ulysses group
            raise ValueError(
                f"parallel.ulysses={self.ulysses} has no effect with parallel.sp_mode=ring (one ring over all "
                "parallel.sp ranks); the Ulysses degree is used by sp_mode=hybrid (Ulysses inside groups of "
                "`ulysses` ranks, a ring across them: 1 < ulysses < sp); set parallel.sp_mode=hybrid, "
                "sp_mode=ulysses (all-to-all over all sp ranks), or drop parallel.ulysses"
            )
        if (self.sp_mode == "hybrid") != (1 < self.ulysses < self.sp):
            raise ValueError(
                "parallel.sp_mode=hybrid goes with 1 < parallel.ulysses < parallel.sp (e.g. sp=4 ulysses=2), and "
                f"only with it; got sp_mode={self.sp_mode}, ulysses={self.ulysses}, sp={self.sp}"
            )
        if self.reshard_after_forward is not None and self.strategy != "fsdp":
            raise ValueError(
                f"parallel.reshard_after_forward applies to parallel.strategy=fsdp only (strategy is "
                f"{self.strategy}); remove it or use parallel=fsdp"
            )
        # bool is an int in Python: only a true int is a group size (Hydra keeps `2` an int, `true` a bool)
        reshard = self.reshard_after_forward
        if type(reshard) is int and reshard < 2:
            raise ValueError(
                f"parallel.reshard_after_forward={reshard}: as a number it is the group size the blocks' weights "
                "are resharded to after forward, >= 2; write true (reshard over all ranks) or false (keep them "
                "gathered) otherwise"
            )
        if self.reduce_dtype is not None and (
            self.strategy != "fsdp" or self.reduce_dtype not in FSDP_DTYPES
        ):
            raise ValueError(
                f"parallel.reduce_dtype={self.reduce_dtype!r} (strategy {self.strategy}): it applies to "
                f"parallel=fsdp only, as one of {', '.join(FSDP_DTYPES)}"
            )
        if self.residual_dtype is not None and (
            self.strategy != "fsdp" or self.residual_dtype not in FSDP_DTYPES
        ):
            raise ValueError(
                f"parallel.residual_dtype={self.residual_dtype!r} (strategy {self.strategy}): it applies to "
                f"parallel=fsdp only, as one of {', '.join(FSDP_DTYPES)} (other strategies keep the "
                "residual stream in fp32 under autocast)"
            )
        if self.blocks_per_unit is not None and (self.strategy != "fsdp" or self.blocks_per_unit < 1):
            raise ValueError(
                f"parallel.blocks_per_unit={self.blocks_per_unit} (strategy {self.strategy}): it applies to "
                "parallel=fsdp only, as a whole number >= 1"
            )
        if self.zero_stage is not None and self.strategy != "deepspeed":
            raise ValueError(
                f"parallel.zero_stage applies to parallel.strategy=deepspeed only (strategy is {self.strategy}); "
                "remove it or use parallel=deepspeed"
            )
        if self.zero_stage is not None and self.zero_stage not in (1, 2, 3):
            raise ValueError(f"parallel.zero_stage={self.zero_stage}; choose 1, 2 or 3")
        if self.strategy == "deepspeed" and self.sp > 1:
            raise ValueError(
                f"parallel.sp={self.sp} with parallel.strategy=deepspeed: DeepSpeed averages gradients over its "
                "own data-parallel group only, which would miss the sequence-parallel ranks; use ddp or fsdp"
            )


def apply_ac(model: nn.Module, compile_blocks: bool = False) -> None:
    """Recompute each block's activations in the backward instead of storing them.

    The block's forward is wrapped in place rather than the module replaced by a wrapper, so
    parameter names (and therefore checkpoints) are the same with and without it.

    compile_blocks: compile each block's forward inside the checkpoint. Compiling the checkpointed
    block instead makes Dynamo trace the checkpoint as one region, and a graph break anywhere in it
    (the block-sparse attention is `torch.compiler.disable`d, as the dense one was) sends the whole
    block back to eager: Path-X's and Path-256's profiles showed only ATen kernels around the
    attention, 78 ms of a 110 ms step.
    """
    for block in model.blocks:
        forward = torch.compile(block.forward) if compile_blocks else block.forward

        def checkpointed(*args, _forward=forward, **kwargs):
            override = current_override()
            # Dynamo cannot trace a context_fn; the sequence-parallel attention is `torch.compiler.disable`d
            # (distributed/context.py), so compiled blocks call it eagerly anyway
            if override is None or torch.compiler.is_compiling():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            # the recompute runs in the backward, which may come after the override's `with` block
            # has ended: it must attend exactly as this forward did (ring or Ulysses, not local)
            contexts = lambda: (contextlib.nullcontext(), attention_override(override))  # noqa: E731
            return checkpoint(_forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

        block.forward = checkpointed


def apply_compile(model: nn.Module, mode: str | None = None) -> None:
    """Compile each block in place (`Module.compile` keeps parameter names); identical blocks share
    one compiled graph. mode: torch.compile's (None = its default; "reduce-overhead" replays each
    block's kernels from CUDA graphs)."""
    for block in model.blocks:
        block.compile(mode=mode)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP over the default (world) group: gradients average over dp x sp ranks.

    Gradients are views into DDP's all-reduce buckets (no copy into and out of the buckets each
    step), and buffers are not re-broadcast before every forward: the model's only buffers (rotary
    frequencies) are computed identically on every rank.
    """
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    # torch 2.13 renamed the option (and warns on the old name); 2.11, on the GPU machines, has only it
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    no_buffer_sync = {"forward_sync_buffers": False} if renamed else {"broadcast_buffers": False}
    return DistributedDataParallel(
        model, device_ids=device_ids, gradient_as_bucket_view=True, **no_buffer_sync
    )


def apply_fsdp(
    model: nn.Module,
    mesh,
    *,
    reshard_after_forward: bool | int,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None = None,
    blocks_per_unit: int = 1,
    residual_dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """FSDP2: shard the blocks, `blocks_per_unit` consecutive ones as one unit, then the root
    (embeddings, final norm and the tied head).

    One block per unit gathers the least weights at a time; several cut the per-unit work FSDP does on
    the host before and after each unit's forward and backward (about 3.5 ms per block per step for
    GPT-2 medium on an H200 host, which left 2-GPU FSDP2 host-bound: benchmarks/NOTES_parallel.md). The root
    is never resharded after forward: its weights (the tied embedding/head) are needed first in the
    backward anyway.

    With `param_dtype` (bf16 runs, always under autocast) the blocks' weights are gathered and computed
    in that dtype while gradients are reduced in fp32, as single-device bf16 autocast accumulates them,
    unless `reduce_dtype` says otherwise. `residual_dtype` is what passes between units: fp32 (the
    default) keeps the root's weights in fp32, so the embeddings come out in fp32 as on one device, and
    lets each unit take its inputs as they come (the residual stream and the rotary tables stay fp32;
    autocast runs the matmuls in bf16 and the norms in fp32, as on one device); bf16 is FSDP2's own
    mixed precision, as in torchtitan: bf16 root weights and every unit's floating inputs cast to bf16.
    The one difference left with fp32: the blocks' LayerNorm weights are rounded to bf16 when gathered,
    and applied in fp32 (`_LayerNormInFloat32`) as CUDA autocast applies any LayerNorm's.
    `reshard_after_forward` is FSDP2's, for the blocks: a bool, or the size of the rank groups their
    weights stay sharded over between forward and backward (it must divide the mesh's size).
    Sharding is in place: the same module object is returned, its parameters are now DTensors.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if reduce_dtype is None:
        reduce_dtype = torch.float32 if param_dtype else None
    bf16_residual = param_dtype is not None and residual_dtype == param_dtype
    blocks_mp = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=bf16_residual
    )
    root_mp = blocks_mp if bf16_residual else MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    if param_dtype is not None and not bf16_residual:
        for norm in model.blocks.modules():
            if type(norm) is nn.LayerNorm:
                norm.__class__ = _LayerNormInFloat32  # same parameters and state-dict keys
    blocks = list(model.blocks)
    for start in range(0, len(blocks), blocks_per_unit):
        unit = blocks[start : start + blocks_per_unit]
        fully_shard(
            unit if len(unit) > 1 else unit[0],
            mesh=mesh,
            reshard_after_forward=reshard_after_forward,
            mp_policy=blocks_mp,
        )
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=root_mp)
    return model


class _LayerNormInFloat32(nn.LayerNorm):
    """A LayerNorm that applies its weights in fp32 whatever their dtype, as CUDA autocast runs every
    LayerNorm. For FSDP2's bf16 weights beside an fp32 residual stream: CPU autocast leaves the op to
    a kernel that rejects fp32 inputs with bf16 weights (torch 2.13)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = (None if p is None else p.float() for p in (self.weight, self.bias))
        return nn.functional.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


def clear_function_caches(package: str) -> None:
    """Empty every functools cache defined in `package` (module functions, methods, static methods:
    found through the collector, as they are not all module globals). Used at teardown: their keys and
    values keep models, meshes and process groups alive."""
    import functools
    import gc

    for obj in gc.get_objects():
        # type() rather than isinstance: isinstance warns on torch's deprecated aliases
        if type(obj) is functools._lru_cache_wrapper and str(getattr(obj, "__module__", "")).startswith(
            package
        ):
            obj.cache_clear()


def clear_dtensor_caches() -> None:
    """Empty torch.distributed's memo caches (DTensor's sharding propagation in Python and C++,
    redistribute plans). Their entries keep FSDP2's device meshes, and through them the process
    groups, alive after the model is gone, so `destroy_process_group` could not join the groups' threads."""
    from torch.distributed.tensor import _redistribute

    clear_function_caches("torch.distributed")  # the sharding propagator's own caches are functools ones
    # caches of their own: the C++ dispatch fast path's, and the redistribute planners per mesh
    for clear in (
        getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None),
        getattr(_redistribute, "clear_redistribute_planner_cache", None),
    ):
        if clear is not None:
            clear()


def data_parallel_mesh(parallel_dims):
    """The 1-D mesh gradients are averaged over: all dp x sp ranks (see the module docstring)."""
    mesh = parallel_dims.mesh
    if parallel_dims.sp == 1:
        return mesh["dp"]
    # private but stable since torch 2.4 (torchtitan flattens its dp_shard_cp the same way)
    return mesh[tuple(n for n in mesh.mesh_dim_names if n in ("dp", "sp"))]._flatten("dp_sp")


def parallelize_gpt(
    model: nn.Module,
    parallel_dims,
    cfg: ParallelConfig,
    *,
    device: torch.device,
    activation_checkpointing: bool,
    compile: bool,
    compile_mode: str | None = None,
    param_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Apply the transforms the config asks for; returns the module to train (maybe a wrapper).

    parallel_dims: a `flashtrain.distributed.ParallelDims` whose mesh is built (None for one process).
    param_dtype: FSDP's compute dtype for weights (bf16 runs); ignored by the other strategies.
    compile_mode: torch.compile's mode for the blocks (None = its default; "reduce-overhead": CUDA graphs).
    """
    if activation_checkpointing:
        apply_ac(model, compile_blocks=compile)
    elif compile:
        apply_compile(model, mode=compile_mode)
    if cfg.strategy == "ddp":
        return apply_ddp(model, device)
    if cfg.strategy == "fsdp":
        reshard = True if cfg.reshard_after_forward is None else cfg.reshard_after_forward
        return apply_fsdp(
            model,
            data_parallel_mesh(parallel_dims),
            reshard_after_forward=reshard,
            param_dtype=param_dtype,
            reduce_dtype=FSDP_DTYPES.get(cfg.reduce_dtype),
            blocks_per_unit=cfg.blocks_per_unit or 1,
            residual_dtype=FSDP_DTYPES[cfg.residual_dtype or "float32"],
        )
    return model
