"""The `block_sparse` attention backend: `kernels.block_sparse_attention` with a layout from config.

The layout is built on first use for each (sequence length, device) and kept: building it compiles
the per-tile lists the kernel walks, which should happen once, not every step.
"""

from __future__ import annotations

import torch

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


def build_layout(cfg, seqlen: int, nheads: int, causal: bool):
    """The block layout a GPTConfig describes for one sequence length (on the CPU)."""
    from kernels.layouts import make_layout

    if cfg.block_sparse_kind not in _PARAMS:
        raise ValueError(
            f"model.block_sparse_kind={cfg.block_sparse_kind!r}; choose one of {', '.join(sorted(_PARAMS))}"
        )
    params = {arg: getattr(cfg, field) for arg, field in _PARAMS[cfg.block_sparse_kind].items()}
    return make_layout(
        cfg.block_sparse_kind, seqlen, cfg.block_sparse_block, nheads=nheads, causal=causal, **params
    )


def global_block_mask(cfg, seqlen: int, device) -> tuple[torch.Tensor, int]:
    """(bool tile mask (nheads or 1, n_blocks, n_blocks), block size) of the layout over a whole
    sequence, for sequence parallelism: the ring and Ulysses take the mask, cropped to the blocks the
    sequence covers (a butterfly's block count is padded to a power of two)."""
    layout = build_layout(cfg, seqlen, cfg.n_head, cfg.causal)
    n_blocks = -(-seqlen // layout.block_m)
    return layout.mask[:, :n_blocks, :n_blocks].to(device), layout.block_m


def make_block_sparse_backend(cfg):
    """An attention function with the backend signature for a GPTConfig backbone."""
    build_layout(cfg, cfg.block_sparse_block, cfg.n_head, cfg.causal)  # fail at build time on a bad kind
    layouts: dict[tuple[int, str], object] = {}

    @torch.compiler.disable  # eager launcher: the block-sparse kernels are an autograd.Function, not torch operators
    def block_sparse(
        q, k, v, *, causal, softmax_scale=None, dropout_p=0.0, window=None, key_padding_mask=None
    ):
        from kernels.block_sparse import block_sparse_attention

        if window is not None or key_padding_mask is not None:
            raise ValueError(
                "the block_sparse backend takes its sparsity from the layout: express a window as "
                "block_sparse_kind=local, and pad inputs to whole blocks instead of a key-padding mask"
            )
        key = (q.shape[1], str(q.device))
        if key not in layouts:
            layouts[key] = build_layout(cfg, q.shape[1], q.shape[2], causal).to(q.device)
        return block_sparse_attention(
            q, k, v, layouts[key], causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p
        )

    return block_sparse
