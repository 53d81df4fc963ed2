"""AdamW and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup to cfg.lr, cosine decay to cfg.min_lr at decay_steps, constant after."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay_steps = cfg.decay_steps or max_steps
    if step >= decay_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
