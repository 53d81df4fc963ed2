"""Ulysses (all-to-all) sequence parallelism, and the 2-D hybrid of Ulysses inside a ring.

Ulysses (DeepSpeed-Ulysses): an all-to-all turns sequence-sharded Q/K/V (batch, S/U, H, D) into
head-sharded ones (batch, S, H/U, D), each rank attends over the full sequence for its heads, and a
second all-to-all brings the output back. Its communication volume per rank does not grow with U,
but U must divide the number of heads.

Hybrid: ranks form a (ulysses, ring) mesh. The all-to-all runs inside each Ulysses group and turns
its members' pieces into one ring shard with H/U heads; ring attention then runs across the ring
group on those heads. The sequence is laid out over the ring (zigzag or contiguous) and each ring
shard is cut contiguously over the Ulysses ranks (`sharding.shard_positions`).

Both are one autograd.Function each, whose forward and backward issue all-to-all, ring P2Ps and
all-to-all in a fixed order. Q, K and V share one all-to-all (their heads are concatenated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .call_check import check_same_call
from .ring import (
    RingSpec,
    check_options,
    check_qkv,
    make_ring_spec,
    ring_backward,
    ring_forward,
)
from .sharding import check_layout, check_seqlen, shard_positions


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """x (U, ...) with x[j] bound for rank j -> y (U, ...) with y[j] from rank j. Blocks: a collective."""
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x, group=group)
    return y


def _seq_to_heads(tensors: list[torch.Tensor], group, size: int) -> list[torch.Tensor]:
    """[(B, n, h_i, D)] sequence pieces -> [(B, size * n, h_i / size, D)] head groups, one all-to-all."""
    batch, n, _, headdim = tensors[0].shape
    parts = [t.reshape(batch, n, size, t.shape[2] // size, headdim) for t in tensors]  # (B, n, U, h_i/U, D)
    x = (
        torch.cat(parts, dim=3).permute(2, 0, 1, 3, 4).contiguous()
    )  # (U, B, n, hh, D): head group j -> rank j
    y = _all_to_all(x, group)  # (U, B, n, hh, D): y[j] is rank j's piece of the sequence
    y = y.permute(1, 0, 2, 3, 4).reshape(batch, size * n, -1, headdim)  # (B, U*n, hh, D)
    return list(torch.split(y, [p.shape[3] for p in parts], dim=2))


def _heads_to_seq(tensors: list[torch.Tensor], group, size: int) -> list[torch.Tensor]:
    """Inverse of `_seq_to_heads`: [(B, size * n, h_i, D)] -> [(B, n, h_i * size, D)]."""
    batch, total, _, headdim = tensors[0].shape
    n = total // size
    widths = [t.shape[2] for t in tensors]
    x = torch.cat(tensors, dim=2).reshape(batch, size, n, -1, headdim)  # (B, U, n, hh, D)
    x = x.permute(1, 0, 2, 3, 4).contiguous()  # (U, B, n, hh, D): sequence piece j -> rank j
    y = _all_to_all(x, group).permute(1, 2, 0, 3, 4)  # (B, n, U, hh, D): y[:, :, j] is head group j
    return [
        p.reshape(batch, n, size * w, headdim)
        for p, w in zip(torch.split(y, widths, dim=3), widths, strict=True)
    ]


@dataclass(frozen=True)
class UlyssesSpec:
    """group/size: the Ulysses group; perm: global position of each row of the gathered sequence
    when that is not the true order (zigzag over the Ulysses ranks), else None; inner: the attention
    over the gathered sequence (a ring of size 1 for plain Ulysses)."""

    group: dist.ProcessGroup | None
    size: int
    perm: torch.Tensor | None
    inner: RingSpec


def _gather_heads(tensors, spec: UlyssesSpec) -> list[torch.Tensor]:
    out = _seq_to_heads(tensors, spec.group, spec.size) if spec.size > 1 else list(tensors)
    if spec.perm is not None:
        inv = torch.argsort(spec.perm)  # gathered row i holds position perm[i]: put rows in true order
        out = [t.index_select(1, inv) for t in out]
    return out


def _scatter_heads(tensors, spec: UlyssesSpec) -> list[torch.Tensor]:
    if spec.perm is not None:
        tensors = [t.index_select(1, spec.perm) for t in tensors]
    return _heads_to_seq(tensors, spec.group, spec.size) if spec.size > 1 else list(tensors)


class UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: UlyssesSpec):
        qh, kh, vh = _gather_heads([q, k, v], spec)  # (B, S_gathered, H/U, D)
        out, lse = ring_forward(qh, kh, vh, spec.inner)
        out = out.to(q.dtype)  # one cast, after the fp32 merge
        ctx.save_for_backward(qh, kh, vh, out, lse)  # head-sharded: as many elements as the local shards
        ctx.spec = spec
        return _scatter_heads([out], spec)[0]

    @staticmethod
    def backward(ctx, dout):
        qh, kh, vh, out, lse = ctx.saved_tensors
        spec = ctx.spec
        (doh,) = _gather_heads([dout.contiguous()], spec)
        dq, dk, dv = ring_backward(doh, qh, kh, vh, out, lse, spec.inner, grad_dtype=qh.dtype)
        dq, dk, dv = _scatter_heads([dq, dk, dv], spec)
        return dq, dk, dv, None


def replicate_kv_heads(k: torch.Tensor, v: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GQA with nheads_kv not divisible by the Ulysses degree: repeat each K/V head the fewest times f
    so that size divides nheads_kv * f (nheads is a multiple of both, so the groups stay whole).
    Autograd sums the copies' gradients. Costs f x the K/V all-to-all volume."""
    hkv = k.shape[2]
    if hkv % size == 0:
        return k, v
    f = size // math.gcd(hkv, size)
    return k.repeat_interleave(f, dim=2), v.repeat_interleave(f, dim=2)  # (B, n, Hkv * f, D)


def _check_heads(nheads: int, size: int) -> None:
    if nheads % size != 0:
        raise ValueError(
            f"Ulysses needs nheads ({nheads}) divisible by the Ulysses degree ({size}): choose a degree that "
            f"divides {nheads}, or use the ring (or hybrid with a smaller Ulysses degree)"
        )


def _build(q, k, v, *, ulysses_group, ring_group, layout, causal, softmax_scale, window, dropout_p,
           block_layout, block_size, cu_seqlens, dropout_seed, backend, validate):  # fmt: skip
    usize = dist.get_world_size(ulysses_group) if ulysses_group is not None else 1
    urank = dist.get_rank(ulysses_group) if ulysses_group is not None else 0
    rsize = dist.get_world_size(ring_group) if ring_group is not None else 1
    if validate and usize * rsize > 1:  # first, as in `ring_attention`: over the whole (U, R) mesh
        dropout_seed = check_same_call(
            [q, k, v], [ulysses_group, ring_group], causal=causal, layout=layout, window=window,
            softmax_scale=softmax_scale, dropout_p=dropout_p, dropout_seed=dropout_seed, cu_seqlens=cu_seqlens,
            block_layout=block_layout, block_size=block_size,
        )  # fmt: skip
    check_options(window, dropout_p, causal)
    check_layout(layout)
    check_qkv(q, k, v)
    nheads = q.shape[2]
    _check_heads(nheads, usize)
    seqlen = q.shape[1] * usize * rsize
    perm = None
    if ring_group is None:  # plain Ulysses: the layout is over the Ulysses ranks
        check_seqlen(seqlen, usize, layout)
        if layout == "zigzag" and usize > 1:
            perm = torch.cat(
                [shard_positions(seqlen, layout=layout, ring_size=usize, ring_rank=j) for j in range(usize)]
            ).to(q.device)
    else:
        check_seqlen(seqlen, rsize, layout, usize)
    inner = make_ring_spec(
        q, group=ring_group, seqlen=seqlen, layout=layout if ring_group is not None else "contiguous",
        causal=causal, softmax_scale=softmax_scale, window=window, dropout_p=dropout_p,
        block_layout=block_layout, block_size=block_size, cu_seqlens=cu_seqlens, dropout_seed=dropout_seed,
        backend=backend, head_offset=urank * (nheads // usize),
    )  # fmt: skip
    k, v = replicate_kv_heads(k, v, usize)
    return q, k, v, UlyssesSpec(ulysses_group, usize, perm, inner)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None,
    *,
    causal: bool = False,
    layout: str = "zigzag",
    softmax_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    dropout_p: float = 0.0,
    block_layout: torch.Tensor | None = None,
    block_size: int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dropout_seed: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Ulysses attention; same arguments and shard layout as `ring.ring_attention` over `group`.

    q: (batch, seqlen/U, nheads, headdim) with U dividing nheads (else ValueError); k, v:
    (batch, seqlen/U, nheads_kv, headdim). When U does not divide nheads_kv, K/V heads are
    replicated just enough (`replicate_kv_heads`). With layout="zigzag" the gathered sequence is put
    back in true order before the local attention, so causal and window masks are exact.
    """
    q, k, v, spec = _build(
        q, k, v, ulysses_group=group, ring_group=None, layout=layout, causal=causal,
        softmax_scale=softmax_scale, window=window, dropout_p=dropout_p, block_layout=block_layout,
        block_size=block_size, cu_seqlens=cu_seqlens, dropout_seed=dropout_seed, backend=backend,
        validate=validate,
    )  # fmt: skip
    return UlyssesAttention.apply(q, k, v, spec)


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses_group: dist.ProcessGroup | None,
    ring_group: dist.ProcessGroup | None,
    *,
    causal: bool = False,
    layout: str = "zigzag",
    softmax_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    dropout_p: float = 0.0,
    block_layout: torch.Tensor | None = None,
    block_size: int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dropout_seed: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """2-D sequence parallelism: Ulysses inside each `ulysses_group`, ring attention across `ring_group`.

    q: (batch, seqlen/(U*R), nheads, headdim) holding `shard_positions(seqlen, layout=layout,
    ring_size=R, ring_rank=r, ulysses_size=U, ulysses_rank=u)`; other arguments as `ring_attention`.
    """
    q, k, v, spec = _build(
        q, k, v, ulysses_group=ulysses_group, ring_group=ring_group, layout=layout, causal=causal,
        softmax_scale=softmax_scale, window=window, dropout_p=dropout_p, block_layout=block_layout,
        block_size=block_size, cu_seqlens=cu_seqlens, dropout_seed=dropout_seed, backend=backend,
        validate=validate,
    )  # fmt: skip
    return UlyssesAttention.apply(q, k, v, spec)
