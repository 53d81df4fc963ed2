"""Distributed test cases, run many to a job: one spawned gloo job per world size (see launcher.py).

Every rank builds the same full-sequence inputs from the case's seed, runs the sequence-parallel
attention on its shard, and compares its output and dq/dk/dv shards with the single-process
`attention_reference` (autograd) on the full tensors. Bad inputs are checked to raise ValueError on
every rank, and the group is used again afterwards to prove nothing was left half-sent. Arguments that
differ across ranks (`mismatch_cases`) run in a job of their own with short limits.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from flashtrain.distributed import (
    ParallelDims,
    dropout_keep_mask,
    hybrid_attention,
    ring_attention,
    sequence_parallel,
    shard_positions,
    ulysses_attention,
)
from kernels.reference import attention_reference

BATCH, HEADDIM = 2, 8


@dataclass(frozen=True)
class Case:
    name: str
    mode: str = "ring"  # ring | ulysses | hybrid (hybrid: 2 x 2 on 4 ranks)
    layout: str = "zigzag"
    causal: bool = False
    nheads: int = 4
    nheads_kv: int = 4
    window: tuple | None = None
    docs: bool = False
    # "random": per-head random tiles of 2 tokens; "random16": of 16 tokens (kernel-sized); "band":
    # chunk-sized band
    block: str | None = None
    dropout_p: float = 0.0
    dtype: torch.dtype = torch.float64
    chunk: int = 4  # tokens per zigzag chunk: seqlen = 2 * sp * chunk
    backend: str = "reference"
    batch: int = BATCH
    extra: dict = field(default_factory=dict)


def ring_cases(world: int) -> list[Case]:
    cases = []
    for layout in ("contiguous", "zigzag"):
        for causal in (False, True):
            cases.append(
                Case(f"ring-{layout}-{'causal' if causal else 'full'}", layout=layout, causal=causal)
            )
        cases += [
            Case(f"ring-{layout}-gqa", layout=layout, causal=True, nheads_kv=2),
            Case(f"ring-{layout}-window", layout=layout, causal=True, window=(5, None)),
            Case(f"ring-{layout}-docs", layout=layout, causal=True, docs=True),
            Case(f"ring-{layout}-block-random", layout=layout, causal=True, block="random"),
            Case(f"ring-{layout}-block-band", layout=layout, causal=False, block="band"),
        ]
    cases += [
        Case("ring-zigzag-mqa", causal=True, nheads_kv=1),
        Case("ring-zigzag-window-2sided", window=(3, 2)),
        Case("ring-zigzag-window-docs-gqa", causal=True, window=(6, None), docs=True, nheads_kv=2),
        Case("ring-zigzag-docs-full", docs=True),
        Case("ring-zigzag-dropout", causal=True, dropout_p=0.3),
        Case(
            "ring-contiguous-dropout-gqa-window",
            layout="contiguous",
            dropout_p=0.2,
            nheads_kv=2,
            window=(4, 3),
        ),
        Case("ring-zigzag-causal-fp32", causal=True, dtype=torch.float32),
    ]
    # the GPU path (Triton launchers with signed per-step windows) through the Triton interpreter: slow
    # on CPU, so one case per job
    if world == 4:
        cases.append(Case("ring-zigzag-triton-window-gqa", causal=True, window=(5, None), nheads_kv=2,
                          dtype=torch.float32, backend="triton"))  # fmt: skip
    else:
        cases.append(Case("ring-contiguous-triton-causal", layout="contiguous", causal=True, dtype=torch.float32,
                          backend="triton"))  # fmt: skip
    if world == 2:
        # documents through the varlen kernels, a block layout through the block-sparse ones
        cases += [
            Case("ring-zigzag-triton-docs-gqa", causal=True, docs=True, nheads_kv=2, dtype=torch.float32,
                 chunk=16, backend="triton"),
            Case("ring-zigzag-triton-block16", causal=True, block="random16", dtype=torch.float32, chunk=16,
                 backend="triton"),
            # dropout in the kernels, numbered by global position: the single-process mask
            Case("ring-zigzag-triton-dropout-gqa", causal=True, dropout_p=0.3, nheads_kv=2, dtype=torch.float32,
                 backend="triton"),
            # with documents (the varlen kernels) at batch 1
            Case("ring-zigzag-triton-docs-dropout", causal=True, docs=True, dropout_p=0.3, dtype=torch.float32,
                 chunk=16, backend="triton", batch=1),
        ]  # fmt: skip
    return cases


def ulysses_cases(world: int) -> list[Case]:
    heads = 6 if world == 3 else 4
    cases = [
        Case("ulysses-zigzag-causal", mode="ulysses", causal=True, nheads=heads, nheads_kv=heads),
        Case("ulysses-contiguous-full", mode="ulysses", layout="contiguous", nheads=heads, nheads_kv=heads),
        # nheads_kv = 2 is not divisible by 3 or 4: K/V heads are replicated
        Case("ulysses-zigzag-gqa-replicated", mode="ulysses", causal=True, nheads=heads * 2, nheads_kv=2),
        Case(
            "ulysses-zigzag-window-docs",
            mode="ulysses",
            causal=True,
            nheads=heads,
            nheads_kv=heads,
            window=(5, None),
            docs=True,
        ),  # fmt: skip
        Case(
            "ulysses-contiguous-block-dropout",
            mode="ulysses",
            layout="contiguous",
            causal=True,
            nheads=heads,
            nheads_kv=heads,
            block="random",
            dropout_p=0.25,
        ),  # fmt: skip
    ]
    if world == 2:
        cases.append(Case("ulysses-zigzag-triton-dropout", mode="ulysses", causal=True, nheads=heads,
                          nheads_kv=heads, dropout_p=0.2, dtype=torch.float32, backend="triton"))  # fmt: skip
    if world == 4:
        cases += [
            Case("hybrid-zigzag-causal", mode="hybrid", causal=True),
            Case(
                "hybrid-contiguous-causal-gqa", mode="hybrid", layout="contiguous", causal=True, nheads_kv=2
            ),
            Case("hybrid-zigzag-window", mode="hybrid", causal=True, window=(5, None)),
            Case("hybrid-zigzag-docs-block", mode="hybrid", causal=True, docs=True, block="random"),
            Case("hybrid-zigzag-dropout", mode="hybrid", dropout_p=0.3, nheads_kv=2),
        ]
    return cases


ERROR_CASES = [
    "zigzag-indivisible",
    "ulysses-heads",
    "unequal-shards",
    "unequal-shards-hybrid",
    "parallel-dims",
    "shard-batch-indivisible",
    "window-negative",
    "causal-not-bool",
    "softmax-scale-zero",
]


@dataclass(frozen=True)
class Mismatch:
    """Arguments that differ on the last rank only: every rank must raise the same ValueError naming
    `option`, from the check before the ring. Without it, these hang in the ring (causal, layout, a
    block_size or window refused on one rank) or mix different masks (the others)."""

    name: str
    option: str  # the argument the error must name
    others: dict  # arguments on every rank but the last, over `_MISMATCH_BASE`
    last: dict  # on the last rank
    mode: str = "ring"  # ring | ulysses | hybrid (4 ranks)


# a non-causal contiguous call with dropout, which the cases change one argument of
_MISMATCH_BASE = dict(layout="contiguous", dropout_p=0.1, dropout_seed=1, backend="reference")
_TRIL = torch.ones(1, 4, 4, dtype=torch.bool).tril()  # 4 blocks of 2 tokens: global seqlen 8
_TRIL_MOVED = _TRIL.clone()
_TRIL_MOVED[0, 3, 0], _TRIL_MOVED[0, 0, 3] = False, True  # as many tiles kept, one elsewhere


def mismatch_cases(world: int) -> list[Mismatch]:
    cases = [
        Mismatch("causal", "causal", dict(causal=False), dict(causal=True)),
        Mismatch("layout", "layout", dict(layout="zigzag"), dict(layout="contiguous")),
        Mismatch("window", "window", dict(window=(2, None)), dict(window=(2, 1))),
        Mismatch("window-refused-on-one-rank", "window", dict(window=(2, None)), dict(window=(-1, None))),
        Mismatch("softmax-scale", "softmax_scale", dict(softmax_scale=None), dict(softmax_scale=0.5)),
        Mismatch("dropout-p", "dropout_p", dict(dropout_p=0.1), dict(dropout_p=0.2)),
        Mismatch("dropout-seed", "dropout_seed", dict(dropout_seed=1), dict(dropout_seed=2)),
        Mismatch("dropout-seed-none", "dropout_seed", dict(dropout_seed=1), dict(dropout_seed=None)),
        # as many documents, the same sum of boundaries: only the position-weighted sum differs
        Mismatch("cu-seqlens", "cu_seqlens", dict(cu_seqlens=torch.tensor([0, 3, 5, 8])),
                 dict(cu_seqlens=torch.tensor([0, 4, 4, 8]))),
        Mismatch("cu-seqlens-none", "cu_seqlens", dict(cu_seqlens=None), dict(cu_seqlens=torch.tensor([0, 4, 8]))),
        Mismatch("block-layout", "block_layout", dict(block_layout=_TRIL), dict(block_layout=_TRIL_MOVED)),
        # 3 does not cover 8 tokens in 4 blocks: refused on the last rank alone
        Mismatch("block-size", "block_size", dict(block_layout=_TRIL, block_size=2),
                 dict(block_layout=_TRIL, block_size=3)),
        Mismatch("ulysses-causal", "causal", dict(causal=True), dict(causal=False), mode="ulysses"),
        Mismatch("ulysses-cu-seqlens", "cu_seqlens", dict(cu_seqlens=torch.tensor([0, 3, 5, 8])),
                 dict(cu_seqlens=torch.tensor([0, 4, 4, 8])), mode="ulysses"),
    ]  # fmt: skip
    if world == 4:
        cases += [
            Mismatch("hybrid-layout", "layout", dict(layout="zigzag"), dict(layout="contiguous"), mode="hybrid"),
            Mismatch("hybrid-dropout-seed", "dropout_seed", {}, dict(dropout_seed=2), mode="hybrid"),
        ]  # fmt: skip
    return cases


# dropout_seed=None with torch seeded differently on every rank: every rank uses the first rank's draw
DRAWN_SEED_CASES = (
    Case("drawn-seed-ring", causal=True, dropout_p=0.3),
    Case("drawn-seed-ulysses", mode="ulysses", layout="contiguous", dropout_p=0.3),
)


def all_cases(world: int) -> list[Case]:
    return ring_cases(world) + ulysses_cases(world)


# ---------------------------------------------------------------------------------------------------
# inputs and the single-process truth
# ---------------------------------------------------------------------------------------------------


def make_inputs(case: Case, world: int) -> dict:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{world}".encode()))
    seqlen = 2 * world * case.chunk

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(case.dtype)

    inputs = dict(
        seqlen=seqlen,
        q=randn(case.batch, seqlen, case.nheads, HEADDIM),
        k=randn(case.batch, seqlen, case.nheads_kv, HEADDIM),
        v=randn(case.batch, seqlen, case.nheads_kv, HEADDIM),
        dout=randn(case.batch, seqlen, case.nheads, HEADDIM),
        cu_seqlens=None,
        block_layout=None,
        block_size=None,
        dropout_seed=int(torch.randint(0, 2**31 - 1, (1,), generator=gen)),
    )
    if case.docs:
        cuts = torch.randperm(seqlen - 1, generator=gen)[:3] + 1
        inputs["cu_seqlens"] = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([seqlen])])
    if case.block in ("random", "random16"):
        inputs["block_size"] = 2 if case.block == "random" else 16
        nb = seqlen // inputs["block_size"]
        inputs["block_layout"] = torch.rand(case.nheads, nb, nb, generator=gen) < 0.5
    elif case.block == "band":
        inputs["block_size"] = case.chunk
        nb = seqlen // case.chunk
        idx = torch.arange(nb)
        inputs["block_layout"] = ((idx[:, None] - idx[None, :]).abs() <= 1)[None]  # (1, nb, nb)
    return inputs


def reference(case: Case, inp: dict) -> dict:
    seqlen = inp["seqlen"]
    q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
    attn_mask = None
    if inp["cu_seqlens"] is not None:
        doc = torch.searchsorted(inp["cu_seqlens"][1:], torch.arange(seqlen), right=True)
        attn_mask = (doc[:, None] == doc[None, :])[None, None]
    if inp["block_layout"] is not None:
        bs = inp["block_size"]
        blocks = inp["block_layout"].repeat_interleave(bs, 1).repeat_interleave(bs, 2)[None]
        attn_mask = blocks if attn_mask is None else attn_mask & blocks
    drop = None
    if case.dropout_p > 0:
        pos = torch.arange(seqlen)
        drop = dropout_keep_mask(
            inp["dropout_seed"], case.batch, torch.arange(case.nheads), pos, pos, case.dropout_p,
            nheads_total=case.nheads, seqlen=seqlen,
        )  # fmt: skip
    out = attention_reference(
        q, k, v, causal=case.causal, window=case.window, attn_mask=attn_mask,
        dropout_p=case.dropout_p, dropout_mask=drop,
    )  # fmt: skip
    out.backward(inp["dout"])
    return dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)


# ---------------------------------------------------------------------------------------------------
# running a case on one rank
# ---------------------------------------------------------------------------------------------------


def _groups(world: int) -> dict:
    """2 x 2 mesh on 4 ranks: sp rank = ring_rank * U + ulysses_rank. new_group is collective: every
    rank creates every group, in the same order."""
    if world != 4:
        return {}
    ulysses = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    ring = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    rank = dist.get_rank()
    return dict(ulysses=ulysses[rank // 2], ring=ring[rank % 2], U=2, R=2)


def _positions(case: Case, seqlen: int, rank: int, world: int, groups: dict) -> torch.Tensor:
    if case.mode == "hybrid":
        u, r = rank % groups["U"], rank // groups["U"]
        return shard_positions(
            seqlen,
            layout=case.layout,
            ring_size=groups["R"],
            ring_rank=r,
            ulysses_size=groups["U"],
            ulysses_rank=u,
        )
    return shard_positions(seqlen, layout=case.layout, ring_size=world, ring_rank=rank)


def _attend(case: Case, q, k, v, inp: dict, groups: dict, **overrides):
    kw = dict(
        causal=case.causal, layout=case.layout, window=case.window, dropout_p=case.dropout_p,
        block_layout=inp["block_layout"], block_size=inp["block_size"], cu_seqlens=inp["cu_seqlens"],
        dropout_seed=inp["dropout_seed"], backend=case.backend,
    )  # fmt: skip
    kw.update(overrides)
    if case.mode == "ring":
        return ring_attention(q, k, v, dist.group.WORLD, **kw)
    if case.mode == "ulysses":
        return ulysses_attention(q, k, v, dist.group.WORLD, **kw)
    return hybrid_attention(q, k, v, groups["ulysses"], groups["ring"], **kw)


def _max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(
        (got.detach().double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)
    )


def run_case(
    case: Case, rank: int, world: int, groups: dict, inp: dict | None = None, **overrides
) -> str | None:
    """None when the shard matches the reference, else a message. inp: the case's inputs (default
    `make_inputs`); overrides: arguments of the attention call that differ from the reference's."""
    inp = inp or make_inputs(case, world)
    ref = reference(case, inp)
    pos = _positions(case, inp["seqlen"], rank, world, groups)
    q, k, v = (inp[n].index_select(1, pos).requires_grad_() for n in ("q", "k", "v"))
    out = _attend(case, q, k, v, inp, groups, **overrides)
    out.backward(inp["dout"].index_select(1, pos))
    tol = 1e-10 if case.dtype == torch.float64 else 2e-5
    errs = {
        name: _max_rel_err(got, ref[name].index_select(1, pos))
        for name, got in (("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))
    }
    bad = {n: e for n, e in errs.items() if not e <= tol}
    return f"max relative errors {bad} exceed {tol}" if bad else None


def run_error_case(name: str, rank: int, world: int, groups: dict) -> str | None:
    """None when a ValueError was raised here (the parent checks that every rank raised)."""
    x = torch.randn(1, 3, 4, 8, dtype=torch.float64)
    try:
        if name == "zigzag-indivisible":
            ring_attention(x, x, x, dist.group.WORLD, causal=True, layout="zigzag")  # 3 * world % (2 * world)
        elif name == "ulysses-heads":
            y = torch.randn(1, 4, world + 1, 8, dtype=torch.float64)  # nheads = world + 1
            ulysses_attention(y, y, y, dist.group.WORLD, layout="contiguous")
        elif name == "unequal-shards":
            y = torch.randn(1, 4 if rank == 0 else 6, 4, 8, dtype=torch.float64)
            ring_attention(y, y, y, dist.group.WORLD, layout="contiguous")
        elif name == "unequal-shards-hybrid":
            if world != 4:
                return None
            y = torch.randn(1, 4 if rank == 3 else 2, 4, 8, dtype=torch.float64)  # only the last rank differs
            hybrid_attention(y, y, y, groups["ulysses"], groups["ring"], layout="contiguous")
        elif name == "window-negative":
            ring_attention(x, x, x, dist.group.WORLD, layout="contiguous", window=(-1, None))
        elif name == "causal-not-bool":  # a string would pass for True
            ring_attention(x, x, x, dist.group.WORLD, layout="contiguous", causal="no")
        elif name == "softmax-scale-zero":
            ring_attention(x, x, x, dist.group.WORLD, layout="contiguous", softmax_scale=0.0)
        elif name == "parallel-dims":
            ParallelDims(dp=2, sp=world, world_size=world)
        elif name == "shard-batch-indivisible":
            dims = ParallelDims(dp=1, sp=world, world_size=world)
            with sequence_parallel(dims, mode="ring", layout="zigzag") as sp:
                sp.shard_batch(torch.zeros(1, 2 * world + 1, dtype=torch.long))
        return "no ValueError raised"
    except ValueError as e:
        return None if str(e) else "ValueError without a message"


def run_mismatch_case(case: Mismatch, rank: int, world: int, groups: dict) -> str | None:
    """None when every rank raised the same ValueError naming the option, else this rank's message."""
    x = torch.randn(1, 8 // world, 4, 8, dtype=torch.float64)  # global seqlen 8
    kw = {**_MISMATCH_BASE, **(case.last if rank == world - 1 else case.others)}
    try:
        no_masks = dict(
            block_layout=None, block_size=None, cu_seqlens=None, dropout_seed=None
        )  # kw's instead
        _attend(Case(case.name, mode=case.mode), x, x, x, no_masks, groups, **kw)
        err = "no ValueError raised"
    except ValueError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - a P2P timed out in the ring: the check missed the mismatch
        err = f"{type(e).__name__}: {e}"
    errs = [None] * world
    dist.all_gather_object(errs, err)  # the test's own collective: every rank sees every rank's error
    if len(set(errs)) > 1:
        return f"the ranks raised different errors: {errs}"
    return (
        None
        if f"{case.option}: " in err and "different arguments" in err
        else f"{err!r} does not name {case.option}"
    )


def run_drawn_seed_case(case: Case, rank: int, world: int, groups: dict) -> str | None:
    """dropout_seed=None, torch seeded differently on every rank: the result of the first rank's draw."""
    from flashtrain.distributed.ring import draw_dropout_seed

    torch.manual_seed(1000)
    inp = make_inputs(case, world)
    inp["dropout_seed"] = draw_dropout_seed(case.dropout_p, None)  # what rank 0 draws in the call
    torch.manual_seed(1000 + rank)
    return run_case(case, rank, world, groups, inp=inp, dropout_seed=None)


def run_case_safely(run, case: Case, rank: int, world: int, groups: dict) -> str | None:
    try:
        return run(case, rank, world, groups)
    except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
        return f"{type(e).__name__}: {e}"


def cross_rank_job(rank: int, world: int) -> dict:
    """The mismatch and drawn-seed cases of one world size: {name: None | message}."""
    groups = _groups(world)
    results = {}
    for case in mismatch_cases(world):
        results[f"mismatch/{case.name}"] = run_mismatch_case(case, rank, world, groups)
    for case in DRAWN_SEED_CASES:
        results[case.name] = run_case_safely(run_drawn_seed_case, case, rank, world, groups)
    return results


def run_context_case(rank: int, world: int, mode: str) -> str | None:
    """shard_batch + attention_fn of the trainer-facing context match the full computation."""
    dims = ParallelDims(dp=1, sp=world, world_size=world, ulysses=2 if mode == "hybrid" else 1)
    dims.build_mesh("cpu")
    gen = torch.Generator().manual_seed(7)
    seqlen = 4 * world
    ids = torch.randint(0, 100, (BATCH, seqlen), generator=gen)
    # 12 heads: divisible by every Ulysses degree tested (2, 3, 4)
    q, k, v, dout = (
        torch.randn(BATCH, seqlen, 12, HEADDIM, generator=gen, dtype=torch.float64) for _ in range(4)
    )
    want = reference(Case("ctx", causal=True, nheads=12), dict(seqlen=seqlen, q=q, k=k, v=v, dout=dout, cu_seqlens=None,
                                                    block_layout=None))["out"]  # fmt: skip
    with sequence_parallel(dims, mode=mode, layout="zigzag") as sp:
        ids_l, labels_l, pos_l = sp.shard_batch(ids, ids + 1, None)
        if not torch.equal(ids_l, ids.gather(1, pos_l.expand(BATCH, -1))) or not torch.equal(
            labels_l, ids_l + 1
        ):
            return "shard_batch does not shard ids/labels at the returned positions"
        ql, kl, vl = (t.index_select(1, pos_l[0]) for t in (q, k, v))
        out = sp.attention_fn(ql, kl, vl, causal=True, softmax_scale=None, dropout_p=0.0, window=None)
        err = _max_rel_err(out, want.index_select(1, pos_l[0]))
        full = sp.gather_sequence(out)
        err_full = _max_rel_err(full, want)
    return None if max(err, err_full) <= 1e-10 else f"context {mode}: relative error {max(err, err_full)}"


def job(rank: int, world: int, names: list[str]) -> dict:
    """Runs every named case on this rank; returns {name: None | message}."""
    groups = _groups(world)
    results = {}
    for case in all_cases(world):
        if case.name in names:
            results[case.name] = run_case_safely(run_case, case, rank, world, groups)
    for name in ERROR_CASES:
        results[f"error/{name}"] = run_error_case(name, rank, world, groups)
        # the group must still work: a clean collective after each error
        t = torch.ones(1)
        dist.all_reduce(t)
        if t.item() != world:
            results[f"error/{name}"] = "group unusable after the error"
    for mode in ("ring", "ulysses") + (("hybrid",) if world == 4 else ()):
        results[f"context/{mode}"] = run_context_case(rank, world, mode)
    # a dense ring case after all the errors: nothing is left half-sent
    results["after-errors"] = run_case(Case("after-errors", causal=True), rank, world, groups)
    results.update(run_gradient_group_cases(rank, world, groups))
    results["accumulator-hops"] = run_accumulator_hops_case(rank, world, groups)
    return results


def run_accumulator_hops_case(rank: int, world: int, groups: dict) -> str | None:
    """A dense zigzag backward sends P-1 fp32 dK/dV accumulators per rank, none at step 0: each rank's
    own part stays home and the others' parts travel from the next rank on (P-1 hops, not P)."""
    from flashtrain.distributed import ring

    sent, post = [], ring._post

    def counting_post(ops, group):
        sent.extend(
            t.dtype for op, t, _, tag in ops if op is dist.isend and tag in (ring._TAG_DKV, ring._TAG_HOME)
        )
        return post(ops, group)

    ring._post = counting_post
    try:
        err = run_case(Case("accumulator-hops", causal=True), rank, world, groups)
    finally:
        ring._post = post
    if err is None and sent != [torch.float64] * (world - 1):
        err = f"sent accumulators {sent}, expected {world - 1} in float64"
    return err


GRADIENT_GROUP_CASES = (
    Case("grad-group-zigzag-gqa", causal=True, nheads_kv=2),
    Case("grad-group-contiguous-block", layout="contiguous", causal=True, block="random"),
)


def run_gradient_group_cases(rank: int, world: int, groups: dict) -> dict:
    """The backward's dK/dV over a second group of the same ranks (set_gradient_group): the same
    results; a group of other ranks is refused on every rank."""
    from flashtrain.distributed.ring import make_ring_spec, set_gradient_group

    results = {}
    grad_group = dist.new_group(list(range(world)))  # every rank enters new_group
    other = dist.new_group([0])
    try:
        set_gradient_group(dist.group.WORLD, other)
        results["grad-group/other-ranks"] = "no ValueError raised"
    except ValueError as e:
        results["grad-group/other-ranks"] = None if "the ring's ranks" in str(e) else str(e)
    set_gradient_group(dist.group.WORLD, grad_group)
    try:
        spec = make_ring_spec(
            torch.zeros(1, 2, 4, 8), group=dist.group.WORLD, seqlen=2 * world, layout="contiguous", causal=False,
            softmax_scale=None, window=None, dropout_p=0.0, block_layout=None, block_size=None, cu_seqlens=None,
            dropout_seed=None, backend="reference",
        )  # fmt: skip
        results["grad-group/in-spec"] = (
            None if spec.grad_group is grad_group else "the spec does not carry it"
        )
        for case in GRADIENT_GROUP_CASES:
            results[case.name] = run_case(case, rank, world, groups)
    finally:
        set_gradient_group(dist.group.WORLD, None)
    return results


_CACHE: dict[tuple, dict | RuntimeError] = {}


def _merged(job_fn, world: int, *args, **limits) -> dict:
    """Merged results of one job (run once per pytest session): {name: None | the ranks' messages}.
    A job that failed as a whole (a rank died, the deadline passed) fails every later case of it at
    once, instead of running (and waiting) again."""
    key = (job_fn.__name__, world)
    if key not in _CACHE:
        from tests.distributed.launcher import run_ranks

        try:
            per_rank = run_ranks(job_fn, world, *args, **limits)
        except RuntimeError as e:
            _CACHE[key] = e
            raise
        merged = {}
        for name in per_rank[0]:
            msgs = [f"rank {r}: {res[name]}" for r, res in enumerate(per_rank) if res[name] is not None]
            merged[name] = "; ".join(msgs) if msgs else None
        _CACHE[key] = merged
    if isinstance(_CACHE[key], RuntimeError):
        raise RuntimeError(f"the {job_fn.__name__} job of {world} ranks failed: {_CACHE[key]}")
    return _CACHE[key]


def job_results(world: int) -> dict:
    """The world-size job of every reference, error, context and gradient-group case."""
    return _merged(job, world, [c.name for c in all_cases(world)], timeout_s=300.0)


def cross_rank_results(world: int) -> dict:
    """A job of its own with short limits: a regression of the check hangs a ring, which then fails
    these cases within a minute instead of holding up the others' job."""
    return _merged(cross_rank_job, world, timeout_s=60.0, op_timeout_s=10.0)
