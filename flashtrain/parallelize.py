"""Parallelism and other model transforms, applied from outside the single-device model.

`parallelize_gpt` applies, in this order (torchtitan's order, for the same reasons):
1. activation checkpointing per block (`apply_ac`): wraps blocks before compile sees them;
2. `torch.compile` per block (`apply_compile`): compiles the checkpointed blocks;
3. data-parallel wrapping (`apply_ddp`): DDP hooks its gradient all-reduce around the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

STRATEGIES = ("none", "ddp")


@dataclass
class ParallelConfig:
    """How the model is spread over processes."""

    strategy: str = "none"  # data parallelism: "none" (one process) or "ddp"
    sp: int = 1  # sequence-parallel degree (ranks sharing one sequence)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"parallel.strategy={self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.sp < 1:
            raise ValueError(f"parallel.sp={self.sp} must be >= 1")


def apply_ac(model: nn.Module) -> None:
    """Recompute each block's activations in the backward instead of storing them.

    The block's forward is wrapped in place rather than the module replaced by a wrapper, so
    parameter names (and therefore checkpoints) are the same with and without it.
    """
    for block in model.transformer.h:

        def checkpointed(*args, _forward=block.forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed


def apply_compile(model: nn.Module) -> None:
    """Compile each block in place (`Module.compile` keeps parameter names); identical blocks share
    one compiled graph."""
    for block in model.transformer.h:
        block.compile()


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def parallelize_gpt(
    model: nn.Module, cfg: ParallelConfig, *, device: torch.device, activation_checkpointing: bool, compile: bool
) -> nn.Module:
    """Apply the transforms the config asks for; returns the module to train (maybe a wrapper)."""
    if activation_checkpointing:
        apply_ac(model)
    if compile:
        apply_compile(model)
    if cfg.strategy == "ddp":
        return apply_ddp(model, device)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The single-device model inside whatever wrapper parallelize_gpt put around it."""
    return getattr(model, "module", model)
