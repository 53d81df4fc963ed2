"""The `block_sparse` attention backend: `kernels.block_sparse_attention` with a layout from config.

A model has one layout (`ModelLayout`), built over `max_seq_len`; a sequence of any length takes its
leading blocks. So a query sees the same keys whatever the length of the sequence it sits in: a prefix's
forward gives the first rows of the whole sequence's (what lets generation attend through a KV cache,
`flashtrain.generate`), a random layout is one pattern rather than one per length, and a butterfly's
`block_sparse_factors` is checked against the model's block count, not a short sequence's. Each crop
compiles the per-tile lists the kernel walks, so crops are kept (per shape and device), built once.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict

import torch

# Crops kept per model: training asks for one or two sequence lengths; a decode step's crop (one row
# block against the keys so far) serves the row block's tokens and is then left behind, along with the
# tile lists each of its key counts compiled.
KEPT_CROPS = 16

_PARAMS = {  # which GPTConfig fields each layout kind takes, and under which builder argument name
    "butterfly": {
        "n_factors": "block_sparse_factors",
        "global_blocks": "block_sparse_global",
        "local_blocks": "block_sparse_local",
    },
    "local": {"local_blocks": "block_sparse_local"},
    "strided": {"stride": "block_sparse_stride", "local_blocks": "block_sparse_local"},
    "random": {"density": "block_sparse_density"},
}


def unused_layout_settings(cfg) -> list[str]:
    """The model.block_sparse_* settings set away from their defaults that this model does not read:
    every one unless model.attention=block_sparse, else those its layout kind takes no argument from."""
    read = set()
    if cfg.attention == "block_sparse":
        read = {"block_sparse_kind", "block_sparse_block", *_PARAMS.get(cfg.block_sparse_kind, {}).values()}
    default = type(cfg)()
    return [
        f"model.{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if f.name.startswith("block_sparse_")
        and f.name not in read
        and getattr(cfg, f.name) != getattr(default, f.name)
    ]


def build_layout(cfg, seqlen: int, nheads: int, causal: bool):
    """The block layout a GPTConfig describes over exactly `seqlen` tokens (on the CPU)."""
    from kernels.layouts import make_layout

    if cfg.block_sparse_kind not in _PARAMS:
        raise ValueError(
            f"model.block_sparse_kind={cfg.block_sparse_kind!r}; choose one of {', '.join(sorted(_PARAMS))}"
        )
    params = {arg: getattr(cfg, field) for arg, field in _PARAMS[cfg.block_sparse_kind].items()}
    try:
        return make_layout(
            cfg.block_sparse_kind, seqlen, cfg.block_sparse_block, nheads=nheads, causal=causal, **params
        )
    except ValueError as e:  # name the config keys, not the builder's arguments
        message = str(e)
        names = {**_PARAMS[cfg.block_sparse_kind], "block_size": "block_sparse_block"}
        for arg, field in names.items():
            message = re.sub(rf"\b{arg}\b", f"model.{field}", message)
        raise ValueError(f"the block-sparse layout over {seqlen} tokens: {message}") from None


class ModelLayout:
    """The layout of a GPTConfig over `max_seq_len` tokens, cropped to what each call needs.

    A sequence longer than `max_seq_len` (a classifier's images set their own length) gets a layout
    built over its own length, as the layout of that length."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.whole = build_layout(cfg, cfg.max_seq_len, cfg.n_head, cfg.causal)  # fails at model build
        self._longer: dict[int, object] = {}
        self._crops: OrderedDict[tuple, object] = OrderedDict()

    @property
    def block_size(self) -> int:
        return self.whole.block_m

    def rows(self, row_start: int, row_stop: int, seqlen_k: int, device):
        """A BlockLayout on `device` for the queries of row blocks [row_start, row_stop) against the
        first seqlen_k keys (the sequence's so far)."""
        whole = self.whole
        if seqlen_k > self.cfg.max_seq_len:
            if seqlen_k not in self._longer:
                self._longer[seqlen_k] = build_layout(self.cfg, seqlen_k, self.cfg.n_head, self.cfg.causal)
            whole = self._longer[seqlen_k]
        cols = -(-seqlen_k // whole.block_n)
        key = (row_start, row_stop, cols, whole.mask.shape[-1], str(device))
        if key in self._crops:
            self._crops.move_to_end(key)
        else:
            from kernels.layouts import BlockLayout

            mask = whole.mask[:, row_start:row_stop, :cols]
            self._crops[key] = BlockLayout(mask, whole.block_m, whole.block_n).to(device)
            if len(self._crops) > KEPT_CROPS:
                self._crops.popitem(last=False)
        return self._crops[key]

    def for_sequence(self, seqlen: int, device):
        """The layout of a whole sequence of seqlen tokens (queries and keys alike)."""
        return self.rows(0, -(-seqlen // self.block_size), seqlen, device)


def global_block_mask(cfg, seqlen: int, device) -> tuple[torch.Tensor, int]:
    """(bool tile mask (nheads or 1, n_blocks, n_blocks), block size) of the model's layout over a
    whole sequence, for sequence parallelism: the ring and Ulysses take the mask of the blocks the
    sequence covers."""
    layout = ModelLayout(cfg).for_sequence(seqlen, device)
    return layout.mask, layout.block_m


def model_layout(model) -> ModelLayout:
    """The `ModelLayout` a block-sparse GPT's attention goes through (its blocks share one backend)."""
    return model.blocks[0].attn.backend.layout


def refuse_window(window, key_padding_mask=None) -> None:
    """A block-sparse model's attention (its backend, its KV caches, its sequence-parallel calls) takes its
    sparsity from the layout alone: a ValueError for a window or a key-padding mask, saying what instead."""
    if window is not None:
        raise ValueError(
            "a block-sparse model takes its sparsity from the layout: express a window as "
            "model.block_sparse_kind=local"
        )
    if key_padding_mask is not None:
        raise ValueError(
            "a block-sparse model takes its sparsity from the layout: pad inputs to whole blocks instead of "
            "a key-padding mask"
        )


def make_block_sparse_backend(cfg):
    """An attention function with the backend signature for a GPTConfig backbone; its `layout`
    attribute is the model's `ModelLayout` (which generation's KV caches attend through)."""
    layout = ModelLayout(cfg)

    @torch.compiler.disable  # eager launcher: the block-sparse kernels are an autograd.Function, not torch operators
    def block_sparse(
        q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None
    ):
        from kernels.block_sparse import block_sparse_attention

        refuse_window(window, key_padding_mask)
        return block_sparse_attention(
            q, k, v, layout.for_sequence(q.shape[1], q.device), causal=causal,
            softmax_scale=softmax_scale, dropout_p=dropout_p,
        )  # fmt: skip

    block_sparse.layout = layout
    return block_sparse
