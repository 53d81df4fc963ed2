"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Each of P ranks holds 1/P of the sequence (layouts in `sharding.py`). K/V shards travel around the
ring; at every step a rank attends its queries to the shard it holds and merges the step's partial
(out, lse) into an fp32 accumulator through the log-sum-exp, casting once at the end. The backward
recomputes every step from the global (out, lse); dq stays home, while an fp32 accumulator of the
other ranks' parts of a rank's dK/dV starts where its K/V arrive first and travels with them, home
after the last rank that needs them (P-1 hops in a dense ring); the rank adds its own part into it
last. On the dense Triton route both updates happen inside the kernels (`local_forward_merge`,
`local_backward_accumulate`): a step's output and gradients never exist as separate tensors. A
backward step runs its dk/dv kernels into the accumulator, sends it on, then runs its dq kernels, so
the transfer (the last hop home included) overlaps the dq work; step 0 runs only the dq kernels of
the rank's own K/V, while the first K/V transfer runs.

Three layers, as in flash-attention: `ring_forward` / `ring_backward` (the schedules, which issue
every collective in a fixed order) -> `RingAttention` (autograd.Function, so autograd never orders a
collective) -> `ring_attention` (public, checks its inputs on every rank before any P2P).
Every transfer of step t+1 is posted (`batch_isend_irecv`) before step t's local attention runs, so
communication overlaps compute; the waits are marked where they block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels._common import check_causal, check_dropout, check_window, resolve_softmax_scale

from .call_check import check_same_call, draw_dropout_seed
from .local_attention import (
    DenseBackwardPrep,
    PositionMask,
    local_backward_accumulate,
    local_forward_merge,
    narrow_rows,
    tensor_cache,
)
from .ring_plan import LocalCall, MaskInfo, RingPlan, ring_plan
from .sharding import check_layout, check_seqlen, segment_runs, segments_positions

# gloo matches on tags; NCCL matches in posting order, the same on both sides here
_TAG_K, _TAG_DKV, _TAG_HOME, _TAG_V = 1, 2, 3, 4

# ring group -> a second group over the same ranks that carries the backward's dK/dV accumulators
_GRAD_GROUPS: dict = {}


def set_gradient_group(group: dist.ProcessGroup, grad_group: dist.ProcessGroup | None) -> None:
    """Send the ring backward's fp32 dK/dV accumulators over `grad_group` instead of `group`.

    One NCCL communicator runs its transfers on one stream in posting order, so the accumulators
    queue behind (and before) the K/V blocks of the same step; a second communicator over the same
    ranks, in the same order, lets the two streams of transfers run side by side. Call it on every
    rank of the ring (make the group with `dist.new_group` or `new_subgroups_by_enumeration`, which
    every rank of the world must enter); `grad_group=None` goes back to one group.
    """
    if grad_group is None:
        _GRAD_GROUPS.pop(group, None)
        return
    ranks, grad_ranks = dist.get_process_group_ranks(group), dist.get_process_group_ranks(grad_group)
    if grad_ranks != ranks:
        raise ValueError(
            f"the gradient group must hold the ring's ranks in the ring's order, {ranks}; got {grad_ranks}"
        )
    _GRAD_GROUPS[group] = grad_group


@dataclass(frozen=True)
class RingSpec:
    """Everything a ring schedule needs besides the tensors; identical on every rank of the ring.

    seqlen: global sequence length (local shard * size). doc_ids: (seqlen,) document per position.
    block_layout: bool (nheads_global or 1, n_blocks, n_blocks) over global positions.
    head_offset: global index of the first local head (Ulysses shards heads); nheads_total: the
    global head count (with seqlen, it numbers the dropout mask).
    """

    group: dist.ProcessGroup | None
    size: int
    rank: int
    seqlen: int
    layout: str
    causal: bool
    softmax_scale: float
    window: tuple[int | None, int | None] | None = None
    doc_ids: torch.Tensor | None = None
    doc_starts: tuple[int, ...] | None = None
    block_layout: torch.Tensor | None = None
    block_size: int = 1
    head_offset: int = 0
    nheads_total: int = 1
    dropout_p: float = 0.0
    dropout_seed: int = 0
    backend: str = "auto"
    grad_group: dist.ProcessGroup | None = None  # the backward's dK/dV transfers; None: `group`

    @functools.cached_property  # the forward and the backward of a call share one plan
    def plan(self) -> RingPlan:
        block_any = None
        if self.block_layout is not None:
            cache = tensor_cache(self.block_layout)
            if "any" not in cache:  # a host-device sync (tiny), once per layout tensor
                cache["any"] = self.block_layout.any(0).cpu()
            block_any = cache["any"]
        info = MaskInfo(
            causal=self.causal, window=self.window,
            doc_starts=list(self.doc_starts) if self.doc_starts is not None else None,
            block_any=block_any, block_size=self.block_size, fuse=self.dropout_p == 0.0,
        )  # fmt: skip
        return ring_plan(self.seqlen, self.size, self.rank, self.layout, info)

    @property
    def needs_positions(self) -> bool:
        """Whether the local calls need a mask over global positions (documents, blocks, dropout)."""
        return self.doc_ids is not None or self.block_layout is not None or self.dropout_p > 0.0

    def mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q_runs, k_runs) -> PositionMask | None:
        if not self.needs_positions:
            return None
        return PositionMask(
            q_pos, k_pos, doc_ids=self.doc_ids, block_layout=self.block_layout, block_size=self.block_size,
            head_offset=self.head_offset, dropout_p=self.dropout_p, dropout_seed=self.dropout_seed,
            q_runs=q_runs, k_runs=k_runs, doc_starts=self.doc_starts, nheads_total=self.nheads_total,
            seqlen=self.seqlen,
        )  # fmt: skip


def _post(ops: list[tuple], group) -> list:
    """Post (op, tensor, group_peer, tag) P2P ops as one batch; returns the works (do not block)."""
    if not ops:
        return []
    p2p = [dist.P2POp(op, t, dist.get_global_rank(group, peer), group, tag) for op, t, peer, tag in ops]
    return dist.batch_isend_irecv(p2p)


def _kv_ops(kv, peer: int, op) -> list[tuple]:
    """Send or receive one step's K and V: two messages, so our own K and V leave without being
    stacked into one buffer first (a copy of both per call); received ones land in one (2, ...) buffer."""
    return [(op, kv[0], peer, _TAG_K), (op, kv[1], peer, _TAG_V)]


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def _positions(spec: RingSpec, segments, device) -> torch.Tensor | None:
    """Global positions of a shard's rows, or None when the ring has no mask over positions."""
    return segments_positions(segments, device) if spec.needs_positions else None


def _call_kwargs(spec: RingSpec, call: LocalCall, q_pos, k_pos, q_segs, k_segs) -> dict:
    """The local call's options; q_pos/k_pos (global positions of the shards) are None, and not
    needed, when the ring has no mask over positions."""
    mask = None
    if spec.needs_positions:
        mask = spec.mask(
            narrow_rows(q_pos, call.q_rows, 0), narrow_rows(k_pos, call.k_rows, 0),
            segment_runs(q_segs, call.q_rows), segment_runs(k_segs, call.k_rows),
        )  # fmt: skip
    return dict(
        causal=call.causal,
        softmax_scale=spec.softmax_scale,
        window=call.window,
        mask=mask,
        backend=spec.backend,
    )


def ring_forward(q, k, v, spec: RingSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the local queries against the whole ring, both in max(q.dtype, float32)."""
    plan = spec.plan
    size, rank = spec.size, spec.rank
    nxt_rank, prv_rank = (rank + 1) % size, (rank - 1) % size
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    batch, n, nheads, _ = q.shape
    q_pos = _positions(spec, plan.segments[rank], q.device)
    # only the K/V heads travel: ours as two tensors, later steps' as one received (2, B, n, Hkv, D) buffer
    kv = (k.contiguous(), v.contiguous())
    kv_shape = (2, *k.shape)
    for t in range(size):
        src = (rank - t) % size
        incoming = (rank - 1 - t) % size  # what the previous rank holds now and may forward
        ops, nxt = [], None
        if t < plan.last_hop[src]:
            ops += _kv_ops(kv, nxt_rank, dist.isend)
        if t < plan.last_hop[incoming]:
            nxt = torch.empty(kv_shape, dtype=k.dtype, device=k.device)  # we may hold nothing this step
            ops += _kv_ops(nxt, prv_rank, dist.irecv)
        works = _post(ops, spec.group)  # next step's K/V move while this step computes
        if t == 0:
            # filled after the first post, so on the GPU the transfer is ready while these fills run
            # and takes its SMs before the attention kernel queued behind them takes them all
            out = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
            lse = torch.full((batch, nheads, n), float("-inf"), dtype=acc_dtype, device=q.device)
        k_pos = _positions(spec, plan.segments[src], q.device) if plan.calls[src] else None
        for call in plan.calls[src]:
            local_forward_merge(
                narrow_rows(out, call.q_rows), narrow_rows(lse, call.q_rows, 2),
                narrow_rows(q, call.q_rows), narrow_rows(kv[0], call.k_rows), narrow_rows(kv[1], call.k_rows),
                **_call_kwargs(spec, call, q_pos, k_pos, plan.segments[rank], plan.segments[src]),
            )  # fmt: skip
        _wait(works)  # blocks until the next K/V have arrived (and ours have left)
        kv = nxt
    return out, lse


def ring_backward(
    dout, q, k, v, out, lse, spec: RingSpec, grad_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in grad_dtype, from the global out and lse of the forward (accumulated in fp32 or wider).

    The accumulator of src's dK/dV starts where src's K/V arrive first (step 1) and travels on with
    them; src adds its own part last, into the accumulator come home: P-1 hops in a dense ring, not P,
    and no fp32 sum. Starting it at home would send one more fp32 accumulator per backward, beside a
    dq kernel that it slows. Step 0 runs only the dq kernels of our own K/V, hiding the first transfer.
    """
    plan = spec.plan
    size, rank = spec.size, spec.rank
    nxt_rank, prv_rank = (rank + 1) % size, (rank - 1) % size
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    q_pos = _positions(spec, plan.segments[rank], q.device)
    own_kv = kv = (k.contiguous(), v.contiguous())  # as in the forward
    acc_shape = (2, *k.shape)  # (2, B, n, Hkv, D): dK and dV travel as one message
    prep = DenseBackwardPrep(out, dout, lse)  # one preprocess for every step's dense calls

    def run_calls(src: int, kv, acc, only: str) -> tuple[torch.Tensor | None, list]:
        """src's calls: their dq halves (only="dq"), or their dk/dv halves into acc (only="dkdv"; None:
        into a new one), returned with the dq halves still to run. A new accumulator that one call
        covers is stored into, uninitialised, instead of zero-filled and added to."""
        calls = plan.calls[src]
        store = False
        if acc is None and only == "dkdv":
            store = len(calls) == 1 and calls[0].k_rows == (0, k.shape[1])
            acc = (torch.empty if store else torch.zeros)(acc_shape, dtype=acc_dtype, device=q.device)
        k_pos = _positions(spec, plan.segments[src], q.device) if calls else None
        halves = []
        for call in calls:
            acc_rows = (None, None) if acc is None else tuple(narrow_rows(a, call.k_rows) for a in acc)
            grads = (narrow_rows(dq, call.q_rows), *acc_rows)
            halves.append(local_backward_accumulate(
                grads, narrow_rows(dout, call.q_rows), narrow_rows(q, call.q_rows), narrow_rows(kv[0], call.k_rows),
                narrow_rows(kv[1], call.k_rows), narrow_rows(out, call.q_rows), narrow_rows(lse, call.q_rows, 2),
                **_call_kwargs(spec, call, q_pos, k_pos, plan.segments[rank], plan.segments[src]), only=only,
                prep=functools.partial(prep.rows, call.q_rows), add_dkdv=not store,
            ))  # fmt: skip
        return acc, halves

    acc_in = home = None
    pending: list = []  # last step's dK/dV works, with their tensors kept alive until waited
    for t in range(size):
        src = (rank - t) % size
        incoming = (rank - 1 - t) % size
        ops, nxt = [], None
        if t < plan.last_hop[src]:
            ops += _kv_ops(kv, nxt_rank, dist.isend)
        if t < plan.last_hop[incoming]:
            nxt = torch.empty(acc_shape, dtype=k.dtype, device=k.device)
            ops += _kv_ops(nxt, prv_rank, dist.irecv)
        kv_works = _post(ops, spec.group)

        _wait([w for w, _ in pending])  # the previous step's transfers: src's accumulator has arrived
        pending = []
        ops, dq_halves = [], []
        if t == 0:  # our own K/V: their dq now, their dK/dV last (into what comes home)
            run_calls(src, kv, None, only="dq")
        elif t <= plan.last_hop[src]:  # we hold src's K/V, and its accumulator (new at step 1)
            acc, dq_halves = run_calls(src, kv, acc_in if t > 1 else None, only="dkdv")
            if t < plan.last_hop[src]:
                ops.append((dist.isend, acc, nxt_rank, _TAG_DKV))
            else:
                ops.append((dist.isend, acc, src, _TAG_HOME))  # last user of src's K/V: send home
        acc_in = None
        if 1 <= t < plan.last_hop[incoming]:  # incoming's accumulator started on the previous rank
            acc_in = torch.empty(acc_shape, dtype=acc_dtype, device=q.device)
            ops.append((dist.irecv, acc_in, prv_rank, _TAG_DKV))
        if t > 0 and t == plan.last_hop[rank]:
            home = torch.empty(acc_shape, dtype=acc_dtype, device=q.device)
            ops.append((dist.irecv, home, (rank + t) % size, _TAG_HOME))
        # overlaps this step's dq work and the next step's compute; on its own communicator, beside the
        # K/V transfers too
        pending = [(w, ops) for w in _post(ops, spec.grad_group or spec.group)]
        for dq_half in dq_halves:  # after the dK/dV send: the hop hides behind the dq work
            dq_half()
        _wait(kv_works)  # blocks until the next K/V have arrived
        kv = nxt
    _wait([w for w, _ in pending])  # blocks until the others' part of our dK/dV has come home
    # our own part, added into it (its dq halves ran at step 0; other routes add dq here)
    dkv, _ = run_calls(rank, own_kv, home, only="dkdv")
    dkv = dkv.to(grad_dtype)
    return dq.to(grad_dtype), dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: RingSpec):
        out, lse = ring_forward(q, k, v, spec)
        out = out.to(q.dtype)  # the only cast: partial outputs were merged in fp32
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        return (*ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.spec, grad_dtype=q.dtype), None)


# ---------------------------------------------------------------------------------------------------
# input checks: every one raises on every rank before the first P2P
# ---------------------------------------------------------------------------------------------------


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be (batch, seqlen_local, nheads, headdim), got shape {tuple(t.shape)}"
            )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, local seqlen and headdim (self-attention)"
        )
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"nheads ({q.shape[2]}) must be a multiple of nheads_kv ({k.shape[2]}) for GQA")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_options(window, dropout_p: float, causal: bool) -> None:
    """The kernels' own checks (the local attention takes these options as they are)."""
    check_window(window)
    check_dropout(dropout_p)
    check_causal(causal)


def mask_tensors(
    seqlen: int, nheads: int, device, cu_seqlens, block_layout, block_size
) -> tuple[torch.Tensor | None, tuple | None, torch.Tensor | None, int]:
    """Check the global masks and turn them into (doc_ids, doc_starts, block_layout, block_size)."""
    doc_ids = doc_starts = None
    if cu_seqlens is not None:
        starts = [int(x) for x in cu_seqlens.tolist()]  # host-device sync, once per call
        if (
            len(starts) < 2
            or starts[0] != 0
            or starts[-1] != seqlen
            or any(a > b for a, b in zip(starts, starts[1:], strict=False))
        ):
            raise ValueError(
                f"cu_seqlens must start at 0, be non-decreasing and end at the global sequence length {seqlen}, "
                f"got {starts}"
            )
        doc_starts = tuple(starts)
        pos = torch.arange(seqlen, device=device)
        doc_ids = torch.searchsorted(cu_seqlens.to(device=device, dtype=torch.int64)[1:], pos, right=True)
    if block_layout is not None:
        if (
            block_layout.dtype != torch.bool
            or block_layout.dim() != 3
            or block_layout.shape[0] not in (1, nheads)
        ):
            raise ValueError(
                f"block_layout must be bool (nheads={nheads} or 1, n_row_blocks, n_col_blocks), got "
                f"{block_layout.dtype} {tuple(block_layout.shape)}"
            )
        nblocks = block_layout.shape[1]
        if block_size is None:
            if seqlen % nblocks != 0:
                raise ValueError(
                    f"cannot infer block_size: sequence {seqlen} is not a multiple of {nblocks} row blocks; pass block_size"
                )
            block_size = seqlen // nblocks
        if block_layout.shape[1] != block_layout.shape[2] or -(-seqlen // block_size) != nblocks:
            raise ValueError(
                f"block_layout {tuple(block_layout.shape)} with block_size {block_size} must be square and cover the "
                f"global sequence of {seqlen} tokens in ceil({seqlen}/{block_size}) blocks"
            )
        block_layout = block_layout.to(device)
    return doc_ids, doc_starts, block_layout, block_size or 1


def make_ring_spec(
    q: torch.Tensor, *, group, seqlen: int, layout: str, causal: bool, softmax_scale, window, dropout_p: float,
    block_layout, block_size, cu_seqlens, dropout_seed, backend: str, head_offset: int = 0,
) -> RingSpec:  # fmt: skip
    """The RingSpec of one call over `group` (None: one rank), its masks built over the global `seqlen`
    tokens; q is the caller's local input with every head (so q.shape[2] heads are the global count)."""
    size = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    doc_ids, doc_starts, block_layout, block_size = mask_tensors(
        seqlen, q.shape[2], q.device, cu_seqlens, block_layout, block_size
    )
    return RingSpec(
        group=group, size=size, rank=rank, seqlen=seqlen, layout=layout, causal=causal,
        softmax_scale=resolve_softmax_scale(softmax_scale, q.shape[-1]),
        window=tuple(window) if window is not None else None, doc_ids=doc_ids, doc_starts=doc_starts,
        block_layout=block_layout, block_size=block_size, head_offset=head_offset, nheads_total=q.shape[2],
        dropout_p=float(dropout_p), dropout_seed=draw_dropout_seed(dropout_p, dropout_seed), backend=backend,
        grad_group=_GRAD_GROUPS.get(group),
    )  # fmt: skip


def ring_attention(
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
    """Exact attention over a sequence sharded across `group`; returns this rank's output shard.

    q: (batch, seqlen/P, nheads, headdim); k, v: (batch, seqlen/P, nheads_kv, headdim), GQA when
    nheads_kv divides nheads. The shard holds the global positions of `sharding.shard_positions`
    for `layout` ("zigzag": chunks r and 2P-1-r of 2P; "contiguous": chunk r of P).
    causal / window=(left, right) / softmax_scale: as `kernels.flash_attention`, over global positions.
    cu_seqlens: (ndocs + 1,) int, packed documents over the GLOBAL sequence (the same for every batch
        row); attention stays inside each document.
    block_layout: bool (nheads or 1, nblocks, nblocks) over the global sequence, block_size tokens a
        block (default seqlen / nblocks); steps whose tile is empty are skipped, transfers too.
    dropout_p, dropout_seed: dropout keyed by global coordinates, so results do not depend on P.
    backend: local attention, "auto" (Triton on CUDA, reference on CPU), "reference" or "triton".
    validate: gather every rank's shapes and options first (one small blocking all-gather), so unequal
        shards or options raise on every rank, and dropout_seed=None gives every rank the first rank's
        draw; trainers that shard with `shard_batch` and pass the same options everywhere can pass False.
    """
    size = dist.get_world_size(group) if group is not None else 1
    if validate and size > 1:  # first, so that even a rank with a bad option reaches the all-gather
        dropout_seed = check_same_call(
            [q, k, v], [group], causal=causal, layout=layout, window=window, softmax_scale=softmax_scale,
            dropout_p=dropout_p, dropout_seed=dropout_seed, cu_seqlens=cu_seqlens, block_layout=block_layout,
            block_size=block_size,
        )  # fmt: skip
    check_options(window, dropout_p, causal)
    check_layout(layout)
    check_qkv(q, k, v)
    seqlen = q.shape[1] * size
    check_seqlen(seqlen, size, layout)
    spec = make_ring_spec(
        q, group=group, seqlen=seqlen, layout=layout, causal=causal, softmax_scale=softmax_scale,
        window=window, dropout_p=dropout_p, block_layout=block_layout, block_size=block_size,
        cu_seqlens=cu_seqlens, dropout_seed=dropout_seed, backend=backend,
    )  # fmt: skip
    return RingAttention.apply(q, k, v, spec)
