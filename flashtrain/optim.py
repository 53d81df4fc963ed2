"""AdamW and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.optim.adamw import adamw as functional_adamw


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    lr: float = 6e-4  # peak learning rate, reached after warmup
    min_lr: float = 6e-5  # floor of the cosine decay
    warmup_steps: int = 100  # linear warmup from 0
    decay_steps: int | None = None  # steps until min_lr; None = trainer.max_steps
    weight_decay: float = 0.1  # on matrices and embeddings only (not biases or norms)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    fused: bool | None = None  # fused AdamW kernel; None = when every parameter is on CUDA

    def __post_init__(self):
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(
                f"need 0 <= optim.min_lr <= optim.lr and lr > 0, got lr={self.lr} min_lr={self.min_lr}"
            )
        if self.warmup_steps < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("optim.warmup_steps, optim.grad_clip and optim.weight_decay must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"optim.{name}={getattr(self, name)} must lie in [0, 1)")
        if self.eps < 0:
            raise ValueError(f"optim.eps={self.eps} must be >= 0")
        if self.decay_steps is not None and self.decay_steps < 1:  # 0 would read as unset (max_steps)
            raise ValueError(
                f"optim.decay_steps={self.decay_steps} must be >= 1, or null (trainer.max_steps)"
            )


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    fused = cfg.fused
    if fused is None:
        fused = all(p.is_cuda for p in decay + no_decay)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the tensor itself otherwise); under no_grad, no copy."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def adamw_step_on_shards(optimizer: torch.optim.AdamW) -> bool:
    """One `optimizer.step()` applied to the local shards of (FSDP2's DTensor) parameters, through the
    same functional AdamW, the same state tensors and the same fused or foreach kernel.

    Why: on DTensors each optimizer call dispatches over every parameter, state tensor and gradient
    (sharding propagation for ~1,200 tensors of GPT-2 medium); that host time sits between the step's
    device sync and the next forward, when the GPU has nothing queued. The update itself is elementwise,
    so it is the same on a shard as on the whole tensor.

    Returns False, changing nothing, while some parameter with a gradient has no state yet (its first
    step): then call `optimizer.step()`, which creates the state.
    """
    work = []
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not all(optimizer.state.get(p) for p in params):  # .get: state is a defaultdict
            return False
        if group["differentiable"] or any(p.grad.is_sparse for p in params):
            raise ValueError("adamw_step_on_shards takes dense, non-differentiable AdamW groups")
        work.append((group, params))
    for group, params in work:
        if not params:
            continue
        states = [optimizer.state[p] for p in params]
        beta1, beta2 = group["betas"]
        functional_adamw(
            [local_shard(p) for p in params],
            [local_shard(p.grad) for p in params],
            [local_shard(s["exp_avg"]) for s in states],
            [local_shard(s["exp_avg_sq"]) for s in states],
            [local_shard(s["max_exp_avg_sq"]) for s in states] if group["amsgrad"] else [],
            [s["step"] for s in states],  # plain tensors, counted up inside
            foreach=group["foreach"],
            capturable=group["capturable"],
            fused=group["fused"],
            amsgrad=group["amsgrad"],
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )
    return True


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup to cfg.lr, cosine decay to cfg.min_lr at decay_steps, constant after."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay_steps = cfg.decay_steps or max_steps
    if step >= decay_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
