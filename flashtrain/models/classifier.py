"""Sequence classifier for Long Range Arena: the GPT blocks without the causal mask, then pooling.

Inputs are token ids (ListOps: 15 symbols + padding) or image pixels fed one per position
(Pathfinder / Path-X / Path-256: intensities 0-255 as tokens, row-major). Images get 2-D positions
(learned, fixed sin-cos, or axial rotary: a grid either way), which `upsample_positions` stretches by
nearest-neighbour duplication to a larger grid: a Path-64 model becomes a Path-X (128²) or Path-256
model. Duplicating every pixel of an image into a k×k block and duplicating the position grid the same
way leaves a mean-pooled, dense-attention model's output unchanged (tested), which is why the transfer
starts from a sensible function rather than from noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from flashtrain.models.gpt import GPT, Block, GPTConfig, rotary_frequencies

POSITIONS = ("learned", "sincos", "sincos_init", "rotary")


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


def rotary_angles(shape: tuple[int, ...], head_dim: int, theta: float) -> torch.Tensor:
    """Rotary angles (*shape, head_dim / 2) of every position of a sequence (shape (N,)) or an image
    (shape (H, W)). An image's are axial: the first half of the pairs turn with the row, the second
    half with the column, so a query-key score depends on the 2-D offset between two pixels, and a
    pixel's neighbours are one step away whatever the row length (row-major, they are 1 and W away)."""
    freqs = rotary_frequencies(head_dim // 2 // len(shape), theta, torch.float64)  # pairs per axis
    axes = torch.meshgrid(*[torch.arange(n, dtype=torch.float64) for n in shape], indexing="ij")
    return torch.cat([axis[..., None] * freqs for axis in axes], dim=-1).float()


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
    # as the start of a trained one; "rotary": no added positions, queries and keys rotated by their
    # position (axial 2-D for images) at the encoder's rope_theta, so attention sees relative offsets
    positions: str = "learned"

    def __post_init__(self):
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"model.pooling={self.pooling!r}; choose 'mean' or 'cls'")
        if self.positions not in POSITIONS:
            raise ValueError(f"task.positions={self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.positions in ("sincos", "sincos_init") and self.encoder.d_model % 4:
            raise ValueError(
                f"sin-cos positions need model.d_model divisible by 4 (got {self.encoder.d_model})"
            )
        if self.positions == "rotary" and self.encoder.head_dim % (4 if self.image_size else 2):
            raise ValueError(
                f"rotary positions need a head dim divisible by {4 if self.image_size else 2} (2-D rotation "
                f"pairs per axis); got {self.encoder.head_dim}: change model.d_model or model.n_head"
            )
        if self.encoder.pos_embedding != "learned":
            raise ValueError(
                "the classifier's positions are chosen by task.positions (e.g. task.positions=rotary), "
                f"not model.pos_embedding={self.encoder.pos_embedding!r}: leave model.pos_embedding=learned"
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
        shape = (cfg.image_size, cfg.image_size) if cfg.image_size else (enc.max_seq_len,)
        self._set_positions(self._initial_positions(shape))
        if cfg.pooling == "cls":
            self.cls = nn.Parameter(torch.randn(enc.d_model) * enc.init_std)
        self.drop = nn.Dropout(enc.dropout)
        self.blocks = nn.ModuleList([Block(enc, backend) for _ in range(enc.n_layer)])
        self.ln_f = nn.LayerNorm(enc.d_model, bias=enc.bias)
        self.head = nn.Linear(enc.d_model, cfg.num_classes, bias=enc.bias)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=enc.init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=enc.init_std)

    @property
    def _positions_name(self) -> str:
        """The attribute holding the positions: pos_* (added to the embeddings) or rot_* (rotary angles)."""
        kind = "rot" if self.cfg.positions == "rotary" else "pos"
        return f"{kind}_2d" if self.cfg.image_size else f"{kind}_1d"

    def _initial_positions(self, shape: tuple[int, ...]) -> torch.Tensor:
        enc = self.cfg.encoder
        if self.cfg.positions == "rotary":
            return rotary_angles(shape, enc.head_dim, enc.rope_theta)
        if self.cfg.positions == "learned":
            return torch.randn(*shape, enc.d_model) * enc.init_std
        table = sincos_grid(shape[0], enc.d_model) if len(shape) == 2 else sincos_table(shape[0], enc.d_model)
        # the learned start's per-channel RMS (a sin-cos channel's is 1/√2): positions and token
        # embeddings start at one scale, as LRA's unit-scale sin-cos and unit-scale embeddings do
        return table * enc.init_std * 2**0.5

    def _set_positions(self, table: torch.Tensor) -> None:
        # fixed tables (sin-cos, rotary angles) are buffers, but saved: an upsampled grid is not recomputable
        if self.cfg.positions in ("sincos", "rotary"):
            self.register_buffer(self._positions_name, table)
        else:
            setattr(self, self._positions_name, nn.Parameter(table))

    def positions(self) -> torch.Tensor:
        """(N, C) added positions, or (N, head_dim / 2) rotary angles; row-major for images."""
        table = getattr(self, self._positions_name)
        return table.flatten(0, 1) if self.cfg.image_size else table

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, N) integer ids (images flattened row-major; the trainer sends pixels as uint8, an
        eighth of int64's bytes to copy to the device). Returns logits (B, num_classes)."""
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be integer ids, got {tokens.dtype}")
        tokens = tokens.long()  # the embedding takes int64 (or int32) ids; a no-op for int64
        batch, n = tokens.shape
        pos = self.positions()
        if n > pos.shape[0]:
            raise ValueError(
                f"input of {n} positions, the model has {pos.shape[0]}; upsample_positions or crop"
            )
        x = self.embed(tokens)  # (B, N, C)
        angles = None  # rotary angles (N, head_dim / 2), if the positions are rotary
        if self.cfg.positions == "rotary":
            angles = pos[:n]
        else:
            x = x + pos[:n]
        keep = None if self.cfg.pad_id is None else tokens != self.cfg.pad_id  # (B, N)
        if self.cfg.pooling == "cls":
            x = torch.cat([self.cls.expand(batch, 1, -1), x], dim=1)  # (B, 1 + N, C)
            if keep is not None:
                keep = torch.cat([keep.new_ones(batch, 1), keep], dim=1)
            if angles is not None:  # the CLS token has no position: angle 0, no rotation
                angles = torch.cat([angles.new_zeros(1, angles.shape[1]), angles])
        rotary = None if angles is None else (angles.cos()[None, :, None], angles.sin()[None, :, None])
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rotary, key_padding_mask=keep)
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
        # rotary angles are duplicated too: the k×k copies of a pixel share its position, so a
        # duplicated image's attention weights are the small image's, spread over k² equal keys
        grid = getattr(self, self._positions_name)
        grid = grid.repeat_interleave(factor, 0).repeat_interleave(factor, 1)  # (kH, kW, C)
        delattr(self, self._positions_name)  # a parameter or a buffer, replaced by one of the same kind
        self._set_positions(grid.detach().clone())
        self.cfg.image_size *= factor
