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

POSITIONS = ("learned", "sincos", "sincos_init")
INIT_STD = 0.02  # of embeddings, positions and linear weights


def sincos_table(length: int, dim: int) -> torch.Tensor:
    """(length, dim) sinusoidal encodings of positions 0..length-1 (sines in the first half of the
    channels, cosines in the second), at dim / 2 wavelengths from 2π to 10000·2π."""
    freqs = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * freqs  # (length, dim / 2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


def sincos_grid(side: int, dim: int) -> torch.Tensor:
    """(side, side, dim) 2-D encodings: the first dim / 2 channels encode the row, the rest the column."""
    table = sincos_table(side, dim // 2)  # (side, dim / 2), for rows and columns alike
    return torch.cat([table[:, None, :].expand(-1, side, -1), table[None, :, :].expand(side, -1, -1)], dim=-1)


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
    # "learned": random start, trained; "sincos": fixed sin-cos table (2-D for images: half the channels
    # encode the row, half the column), as LRA's own transformer baseline used; "sincos_init": that table
    # as the start of a trained one
    positions: str = "learned"

    def __post_init__(self):
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"model.pooling={self.pooling!r}; choose 'mean' or 'cls'")
        if self.positions not in POSITIONS:
            raise ValueError(f"task.positions={self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.positions != "learned" and self.encoder.d_model % 4:
            raise ValueError(
                f"sin-cos positions need model.d_model divisible by 4 (got {self.encoder.d_model})"
            )
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
            self._set_positions("pos_2d", self._initial_positions((cfg.image_size, cfg.image_size)))
        else:
            self._set_positions("pos_1d", self._initial_positions((enc.max_seq_len,)))
        if cfg.pooling == "cls":
            self.cls = nn.Parameter(torch.randn(enc.d_model) * INIT_STD)
        self.drop = nn.Dropout(enc.dropout)
        self.blocks = nn.ModuleList([Block(enc, backend) for _ in range(enc.n_layer)])
        self.ln_f = nn.LayerNorm(enc.d_model)
        self.head = nn.Linear(enc.d_model, cfg.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=INIT_STD)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=INIT_STD)

    def _initial_positions(self, shape: tuple[int, ...]) -> torch.Tensor:
        dim = self.cfg.encoder.d_model
        if self.cfg.positions == "learned":
            return torch.randn(*shape, dim) * INIT_STD
        table = sincos_grid(shape[0], dim) if len(shape) == 2 else sincos_table(shape[0], dim)
        # the learned start's per-channel RMS (a sin-cos channel's is 1/√2): positions and token
        # embeddings start at one scale, as LRA's unit-scale sin-cos and unit-scale embeddings do
        return table * INIT_STD * 2**0.5

    def _set_positions(self, name: str, table: torch.Tensor) -> None:
        if self.cfg.positions == "sincos":  # fixed, but saved: an upsampled table is not recomputable
            self.register_buffer(name, table)
        else:
            setattr(self, name, nn.Parameter(table))

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
        del self.pos_2d  # a parameter or a buffer, replaced by one of the same kind
        self._set_positions("pos_2d", grid.detach().clone())
        self.cfg.image_size *= factor
