"""GPT: a pre-LayerNorm decoder-only transformer (GPT-2 / GPT-3 family), single-device.

Parallelism (data, sequence) and activation checkpointing are applied from outside
(`flashtrain.parallelize`); attention goes through a backend chosen by name (`attention.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from flashtrain.models.attention import current_override, get_backend, qkvpacked_backend
from kernels import linear_cross_entropy
from kernels.reference import split_qkv


@dataclass
class GPTConfig:
    """Shape and behaviour of a GPT model."""

    n_layer: int = 12  # number of transformer blocks
    n_head: int = 12  # query heads per block
    n_kv_head: int | None = None  # key/value heads (GQA/MQA); None = n_head
    d_model: int = 768  # residual stream width
    vocab_size: int | None = None  # None = the data's tokenizer vocabulary, padded to a multiple of 64
    max_seq_len: int = 1024  # longest sequence (learned positions are allocated for this many)
    pos_embedding: str = "learned"  # "learned" (GPT-2) or "rotary"
    rope_theta: float = 10000.0  # rotary base
    dropout: float = 0.0  # residual and embedding dropout
    attn_dropout: float = 0.0  # dropout on attention probabilities
    bias: bool = True  # biases in linear layers and LayerNorms (GPT-2 has them)
    causal: bool = True  # causal (decoder) attention; False for encoders such as the LRA classifier
    attention: str = "auto"  # reference | sdpa | triton | triton_nondeterministic | block_sparse | auto (faster of triton/sdpa per call)
    window: int | None = None  # sliding-window size (keys within `window` positions back); None = full causal
    block_sparse_kind: str = (
        "butterfly"  # layout for attention=block_sparse: butterfly | local | strided | random
    )
    block_sparse_block: int = 128  # tile size of the block-sparse layout
    block_sparse_factors: int | None = None  # butterfly: factors used (None = all log2 of the block count)
    block_sparse_global: int = 0  # butterfly: global blocks (first rows and columns kept)
    block_sparse_local: int = 1  # butterfly/local/strided: band of blocks kept on each side of the diagonal
    block_sparse_stride: int = 8  # strided: every stride-th block diagonal is kept
    block_sparse_density: float = 0.1  # random: fraction of tiles kept
    # tokens per chunk of the cross-entropy: one chunk's bf16 logits exist at a time (16384 x GPT-2's
    # vocabulary: 1.6 GB); fewer chunks are faster (GPT-2 medium's loss on an H100, fwd+bwd of 16k
    # tokens: 9.0 ms at 4096, 8.8 at 16384)
    loss_chunk: int = 16384
    init_std: float = 0.02  # GPT-2 initialisation

    def __post_init__(self):
        for name in ("n_layer", "n_head", "d_model", "max_seq_len", "loss_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be >= 1")
        # None means "unset" for these; 0 would read as unset too (`n_kv_head or n_head`), so say so
        for name in ("n_kv_head", "vocab_size", "window"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be >= 1, or null (unset)")
        for name in ("init_std", "rope_theta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be > 0")
        if self.d_model % self.n_head:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(
                f"model.n_head={self.n_head} must be divisible by model.n_kv_head={self.n_kv_head}"
            )
        if self.pos_embedding not in ("learned", "rotary"):
            raise ValueError(f"model.pos_embedding={self.pos_embedding!r}; choose 'learned' or 'rotary'")
        if self.pos_embedding == "rotary" and (self.d_model // self.n_head) % 2:
            raise ValueError("rotary embeddings need an even head dim; change model.d_model or model.n_head")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must lie in [0, 1)")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when it is unset (plain multi-head attention)."""
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def rotary_frequencies(pairs: int, theta: float, dtype=torch.float32) -> torch.Tensor:
    """(pairs,) angular frequencies of rotated channel pairs: 1 down to theta^(-(pairs-1)/pairs)."""
    return 1.0 / theta ** (torch.arange(pairs, dtype=dtype) / pairs)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, theta: float):
        super().__init__()
        self.register_buffer("inv_freq", rotary_frequencies(head_dim // 2, theta), persistent=False)
        self.max_seq_len = max_seq_len

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[..., None] * self.inv_freq  # (B, T, D/2)
        return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]  # (B, T, 1, D/2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)  # rotate-half convention (GPT-NeoX / Llama)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, backend):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.c_attn = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.attn_dropout = cfg.attn_dropout
        self.causal = cfg.causal
        # a causal window of w keys ends at the query; a non-causal one is centred on it
        if not cfg.window:
            self.window = None
        else:
            self.window = (cfg.window - 1, 0) if cfg.causal else (cfg.window // 2, cfg.window // 2)
        self.backend = backend
        self.backend_qkvpacked = qkvpacked_backend(backend)

    def forward(self, x, rotary=None, cache=None, key_padding_mask=None):
        batch, seqlen, _ = x.shape
        qkv = self.c_attn(x).view(batch, seqlen, self.n_head + 2 * self.n_kv_head, self.head_dim)
        dropout_p = self.attn_dropout if self.training else 0.0
        options = dict(causal=self.causal, softmax_scale=None, dropout_p=dropout_p, window=self.window)
        if key_padding_mask is not None:
            options["key_padding_mask"] = key_padding_mask
        override = current_override()
        if self.backend_qkvpacked is not None and override is None and rotary is None and cache is None:
            # one gradient buffer for the projection: no concatenation of dq, dk, dv in the backward
            y = self.backend_qkvpacked(qkv, nheads_kv=self.n_kv_head, **options)
        else:
            q, k, v = split_qkv(qkv, self.n_kv_head)  # (B, T, H, D), (B, T, Hkv, D) x 2
            if rotary is not None:
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            if cache is not None:
                y = cache.attend(q, k, v, window=self.window)
            else:
                y = (override or self.backend)(q, k, v, **options)
        y = y.reshape(batch, seqlen, self.n_head * self.head_dim)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))  # GPT-2's "gelu_new"


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, backend):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, backend)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, rotary=None, cache=None, key_padding_mask=None):
        x = x + self.attn(self.ln_1(x), rotary, cache, key_padding_mask)
        return x + self.mlp(self.ln_2(x))


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies and the number of counted tokens (targets == -100 are ignored).

    The vocabulary projection and the loss are one fused op (`kernels.linear_cross_entropy`): `chunk`
    tokens at a time, each chunk's gradients made in the forward, so at most one chunk of logits
    exists and nothing is recomputed in the backward.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, C)
    targets = targets.reshape(-1)  # (N,)
    return linear_cross_entropy(hidden, weight, targets, chunk=chunk), (targets != -100).sum()


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError(
                "model.vocab_size is unset; set it, or build the model through the trainer (data decides)"
            )
        self.cfg = cfg
        backend = self._make_backend(cfg)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.d_model),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg, backend) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.d_model, bias=cfg.bias),
            )
        )
        if cfg.pos_embedding == "learned":
            self.transformer["wpe"] = nn.Embedding(cfg.max_seq_len, cfg.d_model)
            self.rotary = None
        else:
            self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied embeddings
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
                nn.init.normal_(p, mean=0.0, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _make_backend(cfg: GPTConfig):
        if cfg.attention != "block_sparse":
            return get_backend(cfg.attention)
        from flashtrain.models.block_sparse import make_block_sparse_backend

        return make_block_sparse_backend(cfg)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks (what activation checkpointing, compile and FSDP wrap one by one)."""
        return self.transformer.h

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default (they do no matmul work)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6·params for the matmuls, plus 6·L·d·T for causal attention
        (12·L·d·T for full attention, halved because the causal kernels skip the upper triangle)."""
        return 6 * self.num_params() + 6 * self.cfg.n_layer * self.cfg.d_model * seq_len

    def forward(self, idx, targets=None, *, positions=None, caches=None, reduction="mean"):
        """idx: (B, T) token ids. positions: (B, T) or (T,) global positions (default 0..T-1; sequence
        parallelism passes each shard's own). With targets: the loss ("mean" over counted tokens, or
        "sum" returning (sum, count) for callers that normalise across shards); otherwise logits of
        the last position only (generation)."""
        batch, seqlen = idx.shape
        if positions is None:
            start = caches[0].seqlen if caches is not None else 0
            positions = torch.arange(start, start + seqlen, device=idx.device)
        positions = positions.expand(batch, -1) if positions.dim() == 1 else positions  # (B, T)
        if seqlen > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {seqlen} tokens is longer than the model's max_seq_len={self.cfg.max_seq_len}; "
                "raise model.max_seq_len or lower trainer.seq_len"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        rotary = None
        if self.rotary is None:
            x = x + self.transformer.wpe(positions)
        else:
            rotary = self.rotary(positions)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rotary, None if caches is None else caches[i])
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :])  # (B, 1, V)
        loss_sum, count = chunked_cross_entropy(x, self.lm_head.weight, targets, self.cfg.loss_chunk)
        if reduction == "sum":
            return loss_sum, count
        return loss_sum / count.clamp(min=1)
