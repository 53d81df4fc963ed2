"""The trainer-facing side of sequence parallelism: a context set up around the step.

    with sequence_parallel(parallel_dims, mode="ring", layout="zigzag") as sp:
        input_ids, labels, positions = sp.shard_batch(input_ids, labels, positions)
        loss = model(input_ids, labels, positions=positions)   # attention backend: sp.attention_fn
        loss.backward()

The model never sees a process group: its attention backend is `sp.attention_fn` (or the
module-level `sequence_parallel_attention`, which uses the active context), and its position
embeddings take the global `positions` returned by `shard_batch`. Labels must already be aligned
with the inputs (shifted before sharding). Every sp rank holds the same full batch, so sharding is
local (no collective) and every rank sees the same lengths: the attention calls skip the shape
all-gather (validate=False).

Loss and gradients: each rank's loss is the mean over its own tokens; with equal token counts the
mean over sp ranks is the full loss, so gradients are averaged over dp and sp together
(`ParallelDims.grad_group`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from flashtrain.models.block_sparse import refuse_window

from .parallel_dims import ParallelDims
from .ring import ring_attention
from .sharding import check_layout, check_seqlen, gather_full, shard_positions
from .ulysses import hybrid_attention, ulysses_attention

MODES = ("ring", "ulysses", "hybrid")

_ACTIVE: list[SequenceParallel] = []


def _size_rank(group) -> tuple[int, int]:
    return (dist.get_world_size(group), dist.get_rank(group)) if group is not None else (1, 0)


class SequenceParallel:
    """Sharding and attention for one sequence-parallel configuration.

    mode "ring": ring over the sp group; "ulysses": all-to-all over the sp group; "hybrid":
    Ulysses inside `ulysses_group`, ring across `ring_group`. sp_group orders the shards
    (sp rank = ring_rank * ulysses_size + ulysses_rank) for `gather_sequence`.
    block_layout: for a block-sparse model, a function (global seqlen, device) -> (bool tile mask
    (nheads or 1, n_blocks, n_blocks), block size) over the whole sequence; every attention call
    then attends only within it (the ring skips the steps whose tiles are all empty). It is called
    on every attention call, so it should cache what it builds.
    """

    def __init__(
        self, *, mode: str, layout: str, sp_group, ring_group=None, ulysses_group=None, backend="auto",
        block_layout=None,
    ):  # fmt: skip
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode, self.layout, self.backend = mode, check_layout(layout), backend
        self.sp_group = sp_group
        if mode == "ring":
            self.ring_group, self.ulysses_group = sp_group, None
        elif mode == "ulysses":
            self.ring_group, self.ulysses_group = None, sp_group
        else:
            if ring_group is None or ulysses_group is None:
                raise ValueError(
                    "mode='hybrid' needs both a ring and a Ulysses group (ParallelDims with 1 < ulysses < sp)"
                )
            self.ring_group, self.ulysses_group = ring_group, ulysses_group
        self.ring_size, self.ring_rank = _size_rank(self.ring_group)
        self.ulysses_size, self.ulysses_rank = _size_rank(self.ulysses_group)
        self.sp_size = self.ring_size * self.ulysses_size
        self.block_layout = block_layout

    def _layout_sizes(self) -> dict:
        # plain Ulysses lays the sequence out over its own ranks, as a ring of that size would
        if self.mode == "ulysses":
            return dict(ring_size=self.ulysses_size, ring_rank=self.ulysses_rank)
        return dict(
            ring_size=self.ring_size, ring_rank=self.ring_rank,
            ulysses_size=self.ulysses_size, ulysses_rank=self.ulysses_rank,
        )  # fmt: skip

    def check_seqlen(self, seqlen: int) -> None:
        kw = self._layout_sizes()
        check_seqlen(seqlen, kw["ring_size"], self.layout, kw.get("ulysses_size", 1))

    def positions(self, seqlen: int, device=None) -> torch.Tensor:
        """Global positions (seqlen / sp,) of this rank's shard, in local order."""
        return shard_positions(seqlen, layout=self.layout, device=device, **self._layout_sizes())

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        self.check_seqlen(x.shape[dim])
        return x.index_select(dim, self.positions(x.shape[dim], x.device))

    def shard_batch(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, positions=None):
        """(input_ids, labels, positions) of the full batch (batch, seqlen) -> this rank's shards.

        positions None means 0..seqlen-1; the returned positions are then (1, seqlen / sp) global
        position ids, ready for rotary or learned position embeddings.
        """
        seqlen = input_ids.shape[1]
        self.check_seqlen(seqlen)
        pos = self.positions(seqlen, input_ids.device)
        ids = input_ids.index_select(1, pos)
        labels = labels.index_select(1, pos) if labels is not None else None
        positions = pos[None] if positions is None else positions.index_select(1, pos.to(positions.device))
        return ids, labels, positions

    def gather_sequence(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """All-gather the shards of the sp group back into the full sequence. Blocks: a collective."""
        kw = self._layout_sizes()
        return gather_full(
            x, self.sp_group, layout=self.layout, ring_size=kw["ring_size"],
            ulysses_size=kw.get("ulysses_size", 1), dim=dim,
        )  # fmt: skip

    # The ring's schedule is host-side Python (plans, P2P posts, waits): compiled model blocks break
    # around the call instead of Dynamo tracing into it (it would graph-break and recompile inside).
    @torch.compiler.disable
    def attention_fn(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        softmax_scale: float | None = None,
        dropout_p: float = 0.0,
        window: tuple | None = None,
    ) -> torch.Tensor:
        """The model's attention signature on local shards (batch, seqlen_local, nheads, headdim)."""
        kw = dict(
            causal=causal, layout=self.layout, softmax_scale=softmax_scale, window=window,
            dropout_p=dropout_p, backend=self.backend, validate=False,
        )  # fmt: skip
        if self.block_layout is not None:
            refuse_window(window)
            kw["block_layout"], kw["block_size"] = self.block_layout(q.shape[1] * self.sp_size, q.device)
        if self.mode == "ring":
            return ring_attention(q, k, v, self.ring_group, **kw)
        if self.mode == "ulysses":
            return ulysses_attention(q, k, v, self.ulysses_group, **kw)
        return hybrid_attention(q, k, v, self.ulysses_group, self.ring_group, **kw)


def _from(target, mode: str, layout: str, backend: str, block_layout) -> SequenceParallel:
    if isinstance(target, ParallelDims):
        if mode == "hybrid" and not (1 < target.ulysses < target.sp):
            raise ValueError(
                f"mode='hybrid' needs 1 < ulysses < sp, got ulysses={target.ulysses}, sp={target.sp}"
            )
        return SequenceParallel(
            mode=mode, layout=layout, sp_group=target.sp_group, ring_group=target.ring_group,
            ulysses_group=target.ulysses_group, backend=backend, block_layout=block_layout,
        )  # fmt: skip
    if isinstance(target, tuple):  # (ulysses_group, ring_group, sp_group)
        ulysses_group, ring_group, sp_group = target
        return SequenceParallel(
            mode=mode, layout=layout, sp_group=sp_group, ring_group=ring_group, ulysses_group=ulysses_group,
            backend=backend, block_layout=block_layout,
        )  # fmt: skip
    return SequenceParallel(
        mode=mode, layout=layout, sp_group=target, backend=backend, block_layout=block_layout
    )


@contextmanager
def sequence_parallel(
    target, mode: str = "ring", layout: str = "zigzag", backend: str = "auto", block_layout=None
):
    """Activate sequence parallelism for the enclosed step.

    target: a ParallelDims with its mesh built, an sp ProcessGroup (ring or Ulysses over it), or a
    tuple (ulysses_group, ring_group, sp_group) for the hybrid. block_layout: see SequenceParallel.
    Yields the SequenceParallel.
    """
    sp = _from(target, mode, layout, backend, block_layout)
    _ACTIVE.append(sp)
    try:
        yield sp
    finally:
        _ACTIVE.pop()


def current_sequence_parallel() -> SequenceParallel | None:
    return _ACTIVE[-1] if _ACTIVE else None


def sequence_parallel_attention(
    q, k, v, *, causal: bool, softmax_scale=None, dropout_p: float = 0.0, window=None
):
    """Attention backend for the model's registry: the active context's attention_fn."""
    sp = current_sequence_parallel()
    if sp is None:
        raise ValueError(
            "the sequence-parallel attention backend needs an active `with sequence_parallel(...)` block"
        )
    return sp.attention_fn(
        q, k, v, causal=causal, softmax_scale=softmax_scale, dropout_p=dropout_p, window=window
    )
