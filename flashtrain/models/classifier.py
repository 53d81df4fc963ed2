"""Sequence classifier for Long Range Arena: the GPT blocks without the causal mask, then pooling.

Inputs are token ids (ListOps: 15 symbols + padding) or image pixels fed one per position
(Pathfinder / Path-X / Path-256: intensities 0-255 as tokens, row-major). Images get learned 2-D
positional embeddings, which `upsample_positions` stretches by nearest-neighbour duplication to a
larger grid: a Path-64 model becomes a Path-X (128²) or Path-256 model. Duplicating every pixel of
an image into a k×k block and duplicating the embedding grid the same way leaves a mean-pooled,
dense-attention model's output unchanged (tested), which is why the transfer starts from a sensible
function rather than from noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from flashtrain.models.gpt import GPT, Block, GPTConfig


@dataclass
class ClassifierConfig:
    """An encoder classifier for LRA tasks: a non-causal GPT backbone, positions, pooling, a head."""

    encoder: GPTConfig = field(
        default_factory=lambda: GPTConfig(causal=False, n_layer=4, n_head=4, d_model=128)
    )
    num_classes: int = 2  # output classes
    image_size: int | None = None  # side of square image inputs (learned 2-D positions); None = 1-D inputs
    pooling: str = "mean"  # "mean" over non-padding positions, or "cls" (a learned first token)
    pad_id: int | None = None  # token id of padding (excluded from attention and pooling); None = no padding

    def __post_init__(self):
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"model.pooling={self.pooling!r}; choose 'mean' or 'cls'")
        if self.num_classes < 2:
            raise ValueError(f"model.num_classes={self.num_classes} must be >= 2")
        if self.encoder.causal:
            raise ValueError("model.encoder.causal must be false: the classifier reads the whole sequence")
        if self.encoder.vocab_size is None:
            raise ValueError(
                "model.encoder.vocab_size must be set (256 for pixels, the token count for ListOps)"
            )


class SequenceClassifier(nn.Module):
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.cfg = cfg
        enc = cfg.encoder
        backend = GPT._make_backend(enc)
        self.embed = nn.Embedding(enc.vocab_size, enc.d_model)
        if cfg.image_size:
            self.pos_2d = nn.Parameter(torch.randn(cfg.image_size, cfg.image_size, enc.d_model) * 0.02)
        else:
            self.pos_1d = nn.Parameter(torch.randn(enc.max_seq_len, enc.d_model) * 0.02)
        if cfg.pooling == "cls":
            self.cls = nn.Parameter(torch.randn(enc.d_model) * 0.02)
        self.drop = nn.Dropout(enc.dropout)
        self.blocks = nn.ModuleList([Block(enc, backend) for _ in range(enc.n_layer)])
        self.ln_f = nn.LayerNorm(enc.d_model)
        self.head = nn.Linear(enc.d_model, cfg.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def positions(self) -> torch.Tensor:
        return self.pos_2d.flatten(0, 1) if self.cfg.image_size else self.pos_1d  # (N, C), row-major

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, N) ids (images flattened row-major). Returns logits (B, num_classes)."""
        batch, n = tokens.shape
        pos = self.positions()
        if n > pos.shape[0]:
            raise ValueError(
                f"input of {n} positions, the model has {pos.shape[0]}; upsample_positions or crop"
            )
        x = self.embed(tokens) + pos[:n]  # (B, N, C)
        keep = None if self.cfg.pad_id is None else tokens != self.cfg.pad_id  # (B, N)
        if self.cfg.pooling == "cls":
            x = torch.cat([self.cls.expand(batch, 1, -1), x], dim=1)  # (B, 1 + N, C)
            if keep is not None:
                keep = torch.cat([keep.new_ones(batch, 1), keep], dim=1)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, key_padding_mask=keep)
        x = self.ln_f(x)
        if self.cfg.pooling == "cls":
            pooled = x[:, 0]
        elif keep is None:
            pooled = x.mean(dim=1)
        else:
            weights = keep.to(x.dtype)[..., None]  # (B, N, 1)
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(pooled)

    @torch.no_grad()
    def upsample_positions(self, factor: int) -> None:
        """Stretch the 2-D positional grid by `factor` (nearest neighbour: each embedding becomes a
        factor×factor block), for transfer to images `factor` times larger per side."""
        if not self.cfg.image_size:
            raise ValueError("upsample_positions needs an image model (image_size set)")
        grid = self.pos_2d.repeat_interleave(factor, 0).repeat_interleave(factor, 1)  # (kH, kW, C)
        self.pos_2d = nn.Parameter(grid)
        self.cfg.image_size *= factor
