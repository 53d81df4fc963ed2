"""The ring's per-step adapter: the dropout-aware reference backward, the dropout mask at global
coordinates, and the Triton routes (dense with signed windows and dropout, varlen, block-sparse)."""

import functools

import pytest
import torch

from flashtrain.distributed.local_attention import (
    DenseBackwardPrep,
    PositionMask,
    _route,
    dropout_keep_mask,
    local_backward,
    local_backward_accumulate,
    local_forward,
    local_forward_merge,
    merge_partial_,
)
from kernels.reference import attention_reference, dropout_mask


def _qkv(seqlen_q, seqlen_k, nheads, nheads_kv, dtype=torch.float64, headdim=16, seed=0, batch=2):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, headdim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64).to(dtype)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, dout


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, (-2, 6))])
@pytest.mark.parametrize("nheads_kv", [4, 2])
def test_dropout_backward_matches_autograd(causal, window, nheads_kv):
    q, k, v, dout = _qkv(9, 12, 4, nheads_kv)
    mask = PositionMask(torch.arange(30, 39), torch.arange(5, 17), dropout_p=0.3, dropout_seed=1234,
                        nheads_total=4, seqlen=40)  # fmt: skip
    out, lse = local_forward(q, k, v, causal=causal, softmax_scale=0.3, window=window, mask=mask)
    grads = local_backward(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=0.3, window=window, mask=mask
    )
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    drop = dropout_keep_mask(1234, 2, torch.arange(4), mask.q_pos, mask.k_pos, 0.3, nheads_total=4, seqlen=40)
    ref = attention_reference(qr, kr, vr, causal=causal, softmax_scale=0.3, window=window, dropout_p=0.3,
                              dropout_mask=drop)  # fmt: skip
    ref.backward(dout)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_dropout_mask_is_global_and_unbiased():
    pos = torch.arange(64)
    kw = dict(nheads_total=3, seqlen=64)
    full = dropout_keep_mask(7, 2, torch.arange(3), pos, pos, 0.25, **kw)
    # the mask flash_attention draws on the whole sequence with the same seed
    assert torch.equal(full, dropout_mask(7, 2, 3, 64, 64, 0.25))
    # any sub-block drawn with its global coordinates is the same block of the full mask
    part = dropout_keep_mask(7, 2, torch.arange(1, 3), pos[10:20], pos[40:64], 0.25, **kw)
    assert torch.equal(part, full[:, 1:3, 10:20, 40:64])
    assert abs(full.float().mean().item() - 0.75) < 0.02  # 24576 draws: 5 sigma is about 0.014
    assert not torch.equal(full, dropout_keep_mask(8, 2, torch.arange(3), pos, pos, 0.25, **kw))
    with pytest.raises(ValueError, match="nheads_total and seqlen"):
        PositionMask(pos, pos, dropout_p=0.1)


# windows as the ring produces them for one shard against another: shifted and signed
_WINDOWS = [
    (False, None),
    (True, None),
    (True, (3, None)),
    (False, (-3, 9)),
    (False, (6, -2)),
    (False, (None, 2)),
]


def _positions(runs) -> torch.Tensor:
    return torch.cat([torch.arange(s, s + n) for s, n in runs])


_DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CUDA path itself where there is a GPU


def _masked_call(q_runs, k_runs, *, docs=None, layout=None, block_size=1, head_offset=0, dropout_p=0.0):
    """A PositionMask as the ring builds it for one call (positions, host-side runs, document starts)."""
    doc_ids = None
    if docs is not None:
        doc_ids = torch.repeat_interleave(torch.arange(len(docs) - 1), torch.tensor(docs).diff()).to(_DEV)
    if layout is not None:
        layout = layout.to(_DEV)
    return PositionMask(
        _positions(q_runs).to(_DEV), _positions(k_runs).to(_DEV), doc_ids=doc_ids, block_layout=layout,
        block_size=block_size,
        head_offset=head_offset, dropout_p=dropout_p, dropout_seed=5, q_runs=tuple(q_runs),
        k_runs=tuple(k_runs), doc_starts=None if docs is None else tuple(docs), nheads_total=8, seqlen=128,
    )  # fmt: skip


def _check_against_reference(
    mask, causal, window, seqlen_q, seqlen_k, nheads=4, nheads_kv=2, seed=0, batch=2
):
    q, k, v, dout = _qkv(seqlen_q, seqlen_k, nheads, nheads_kv, dtype=torch.float32, seed=seed, batch=batch)
    q, k, v, dout = (t.to(_DEV) for t in (q, k, v, dout))
    kw = dict(causal=causal, softmax_scale=0.25, window=window, mask=mask)
    out, lse = local_forward(q, k, v, backend="triton", **kw)
    ref_out, ref_lse = local_forward(q.double(), k.double(), v.double(), backend="reference", **kw)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-4)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)  # rows that see no key: lse = -inf on both
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)
    grads = local_backward(dout, q, k, v, out, lse, backend="triton", **kw)
    ref_grads = local_backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse,
                               backend="reference", **kw)  # fmt: skip
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("causal,window", _WINDOWS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(16, 16), (16, 32)])
def test_triton_backend_matches_reference(causal, window, seqlen_q, seqlen_k):
    _check_against_reference(None, causal, window, seqlen_q, seqlen_k)


# (q runs, k runs, causal, window): a shard against itself (one run; the zigzag pair of runs, whose
# documents span the gap), a window on the diagonal, and fully visible calls against another shard
_DOC_CALLS = [
    (((40, 24),), ((40, 24),), True, None),
    (((16, 16), (80, 16)), ((16, 16), (80, 16)), True, None),
    (((40, 24),), ((40, 24),), True, (5, None)),
    (((40, 24),), ((40, 24),), False, None),
    (((64, 24),), ((16, 32),), False, None),
    (((80, 16),), ((0, 16), (96, 16)), False, None),
]
_DOCS = [0, 3, 30, 45, 47, 70, 90, 112]  # crossing runs, a one-token document, one wider than a run


@pytest.mark.parametrize("q_runs,k_runs,causal,window", _DOC_CALLS)
def test_triton_documents_run_through_varlen(q_runs, k_runs, causal, window):
    mask = _masked_call(q_runs, k_runs, docs=_DOCS)
    q = torch.empty(1, sum(n for _, n in q_runs), 4, 16)
    assert _route("triton", q, mask, causal, window) == "varlen"
    _check_against_reference(mask, causal, window, len(mask.q_pos), len(mask.k_pos))


_BLOCK_CALLS = [
    (((32, 32),), ((32, 32),), True),
    (((16, 16), (80, 16)), ((16, 16), (80, 16)), True),
    (((64, 32),), ((0, 32),), False),
    (((96, 20),), ((16, 32), (80, 16)), False),  # a tail block that ends inside the layout block
]


@pytest.mark.parametrize("q_runs,k_runs,causal", _BLOCK_CALLS)
@pytest.mark.parametrize("per_head", [False, True])
def test_triton_block_layout_runs_through_block_sparse(q_runs, k_runs, causal, per_head):
    gen = torch.Generator().manual_seed(3)
    layout = torch.rand(8 if per_head else 1, 8, 8, generator=gen) < 0.5  # 116 tokens in 16-token blocks
    layout[:, 5, :] = False  # a query block that sees nothing: out 0, lse -inf
    mask = _masked_call(q_runs, k_runs, layout=layout, block_size=16, head_offset=4 if per_head else 0)
    q = torch.empty(1, sum(n for _, n in q_runs), 4, 16)
    assert _route("triton", q, mask, causal, None) == "block_sparse"
    _check_against_reference(mask, causal, None, len(mask.q_pos), len(mask.k_pos), seed=1)


def test_masks_the_kernels_cannot_express_go_to_the_reference():
    q = torch.empty(2, 16, 4, 16)  # batch 2: dropout with documents goes to the reference
    diag = ((16, 16),)
    lay = torch.ones(1, 8, 8, dtype=torch.bool)
    cases = [
        (_masked_call(diag, diag, docs=_DOCS, dropout_p=0.1), True, None),
        (_masked_call(((16, 16), (96, 16)), ((16, 16), (96, 16)), dropout_p=0.1), True, None),  # two runs
        (_masked_call(diag, diag, docs=[0, 20, 128], layout=lay, block_size=16), True, None),
        # causal against a shifted shard: per document the diagonal would move
        (_masked_call(((48, 16),), ((40, 16),), docs=_DOCS), True, None),
        # positions out of order (a caller other than the ring or Ulysses)
        (_masked_call(((96, 16), (16, 16)), ((96, 16), (16, 16)), docs=[0, 50, 128]), False, None),
        (_masked_call(((16, 16),), ((0, 16),), layout=lay, block_size=16), False, (4, 4)),
        (_masked_call(((8, 16),), ((8, 16),), layout=lay, block_size=16), True, None),  # cuts blocks
        (_masked_call(((8, 8),), ((8, 8),), layout=lay, block_size=8), True, None),  # 8 < 16
        (
            PositionMask(torch.arange(16), torch.arange(16), doc_ids=torch.zeros(128, dtype=torch.long)),
            False,
            None,
        ),
    ]
    for mask, causal, window in cases:
        assert _route("triton", q, mask, causal, window) == "reference"
    # ... and the reference gives them exactly
    mask = _masked_call(((48, 16),), ((40, 16),), docs=_DOCS)
    _check_against_reference(mask, True, None, 16, 16)


@pytest.mark.parametrize("causal,window", _WINDOWS + [(True, (4, -2))])
@pytest.mark.parametrize("masked", [False, True])
def test_reference_in_row_chunks_is_exact(monkeypatch, causal, window, masked):
    """A long call that no kernel serves runs in row chunks with shifted windows: same result."""
    import flashtrain.distributed.local_attention as la

    q, k, v, dout = _qkv(21, 30, 4, 2)
    mask = None
    if masked:
        layout = torch.rand(4, 8, 8, generator=torch.Generator().manual_seed(2)) < 0.7
        mask = PositionMask(torch.arange(40, 61), torch.arange(31, 61), doc_ids=torch.arange(64) // 9,
                            block_layout=layout, block_size=8, dropout_p=0.2, dropout_seed=3, nheads_total=4,
                            seqlen=64)  # fmt: skip
    kw = dict(causal=causal, softmax_scale=0.3, window=window, mask=mask, backend="reference")
    whole = local_forward(q, k, v, **kw)
    whole_grads = local_backward(dout, q, k, v, *whole, **kw)
    monkeypatch.setattr(la, "REFERENCE_CHUNK_ELEMENTS", 2 * 4 * 30 * 4)  # 4 rows per chunk, 6 chunks
    chunked = local_forward(q, k, v, **kw)
    chunked_grads = local_backward(dout, q, k, v, *whole, **kw)
    for got, want in zip((*chunked, *chunked_grads), (*whole, *whole_grads), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# (q run, k run, causal, window, head offset): a diagonal call, past shards (causal shifts, a window),
# a fully visible one, and a Ulysses head shard
_DROPOUT_CALLS = [
    ((40, 24), (40, 24), True, None, 0),
    ((64, 16), (16, 32), True, None, 0),
    ((64, 16), (40, 32), False, (20, -8), 0),
    ((0, 16), (96, 32), False, None, 0),
    ((40, 24), (40, 24), True, None, 4),
]


@pytest.mark.parametrize("q_run,k_run,causal,window,head_offset", _DROPOUT_CALLS)
def test_triton_dropout_runs_in_the_kernels_with_the_global_mask(q_run, k_run, causal, window, head_offset):
    mask = _masked_call((q_run,), (k_run,), dropout_p=0.25, head_offset=head_offset)
    q = torch.empty(1, q_run[1], 4, 16)
    assert _route("triton", q, mask, causal, window) == "dense"
    _check_against_reference(mask, causal, window, q_run[1], k_run[1], seed=2)


@pytest.mark.parametrize("q_runs,k_runs,causal,window", _DOC_CALLS[:1] + _DOC_CALLS[2:3] + _DOC_CALLS[4:5])
def test_triton_dropout_with_documents_runs_through_varlen_at_batch_1(q_runs, k_runs, causal, window):
    mask = _masked_call(q_runs, k_runs, docs=_DOCS, dropout_p=0.25, head_offset=4)
    m = sum(n for _, n in q_runs)
    assert _route("triton", torch.empty(1, m, 4, 16), mask, causal, window) == "varlen"
    assert _route("triton", torch.empty(2, m, 4, 16), mask, causal, window) == "reference"
    _check_against_reference(mask, causal, window, m, sum(n for _, n in k_runs), seed=3, batch=1)


def _route_cases():
    """(name, mask, causal, window, q_runs, k_runs, batch, backend): one call per route of the ring."""
    gen = torch.Generator().manual_seed(3)
    layout = torch.rand(1, 8, 8, generator=gen) < 0.5
    dense_runs = (((40, 24),), ((16, 32),))
    return [
        ("dense", None, False, (6, -2), *dense_runs, 2, "triton"),
        ("dense-dropout", _masked_call(*dense_runs, dropout_p=0.25), True, None, *dense_runs, 2, "triton"),
        ("varlen", _masked_call(*_DOC_CALLS[4][:2], docs=_DOCS), False, None, *_DOC_CALLS[4][:2], 2, "triton"),
        ("block_sparse", _masked_call(*_BLOCK_CALLS[2][:2], layout=layout, block_size=16), False, None,
         *_BLOCK_CALLS[2][:2], 2, "triton"),
        ("reference", None, True, (3, None), *dense_runs, 2, "reference"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", _route_cases(), ids=lambda c: c[0])
def test_in_place_step_updates_equal_the_call_then_merge_or_add(case):
    """local_forward_merge / local_backward_accumulate (the ring's per-step updates, fused into the
    kernels on the dense route) equal local_forward + merge_partial_ / local_backward + add on every
    route, starting from accumulators that already hold other keys."""
    name, mask, causal, window, q_runs, k_runs, batch, backend = case
    m, n = sum(r[1] for r in q_runs), sum(r[1] for r in k_runs)
    q, k, v, dout = (t.to(_DEV) for t in _qkv(m, n, 4, 2, dtype=torch.float32, seed=4, batch=batch))
    kw = dict(causal=causal, softmax_scale=0.25, window=window, mask=mask, backend=backend)
    assert _route(backend, q, mask, causal, window) == name.split("-")[0]
    gen = torch.Generator().manual_seed(5)
    out0 = torch.randn(q.shape, generator=gen).to(_DEV)
    lse0 = torch.randn(batch, 4, m, generator=gen).to(_DEV)
    lse0[:, :, :3] = float("-inf")  # rows nothing has reached yet

    want_out, want_lse = out0.clone(), lse0.clone()
    merge_partial_(want_out, want_lse, *local_forward(q, k, v, **kw))
    got_out, got_lse = out0.clone(), lse0.clone()
    local_forward_merge(got_out, got_lse, q, k, v, **kw)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)

    out, lse = local_forward(q, k, v, **kw)  # the backward's global (out, lse): this call alone here
    start = [torch.randn(t.shape, generator=gen).to(_DEV) for t in (q, k, v)]
    grads = local_backward(dout, q, k, v, out, lse, **kw)
    got = [s.clone() for s in start]
    local_backward_accumulate(tuple(got), dout, q, k, v, out, lse, **kw)
    for g, s, want in zip(got, start, grads, strict=True):
        torch.testing.assert_close(g, s + want, rtol=1e-5, atol=1e-5)
    split = [s.clone() for s in start]  # as the ring runs it: dK/dV first, dq after the send
    local_backward_accumulate(tuple(split), dout, q, k, v, out, lse, **kw, only="dkdv")
    local_backward_accumulate(tuple(split), dout, q, k, v, out, lse, **kw, only="dq")
    for g, s, want in zip(split, start, grads, strict=True):
        torch.testing.assert_close(g, s + want, rtol=1e-5, atol=1e-5)
    # and with the preprocess of a whole shard (this call's rows after 5 others), sliced to the call
    pad = torch.randn(batch, 5, *q.shape[2:], generator=gen).to(_DEV)
    shard = [torch.cat([pad, t], 1) for t in (out, dout)]
    prep = DenseBackwardPrep(*shard, torch.cat([torch.randn(batch, 4, 5, generator=gen).to(_DEV), lse], 2))
    split = [s.clone() for s in start]
    local_backward_accumulate(
        tuple(split),
        dout,
        q,
        k,
        v,
        out,
        lse,
        **kw,
        only="dkdv",
        prep=functools.partial(prep.rows, (5, 5 + m)),
    )
    local_backward_accumulate(tuple(split), dout, q, k, v, out, lse, **kw, only="dq")
    for g, s, want in zip(split, start, grads, strict=True):
        torch.testing.assert_close(g, s + want, rtol=1e-5, atol=1e-5)
    # as the ring runs its own K/V: dq first (no dK/dV buffers yet), then dK/dV stored into new buffers
    dq = start[0].clone()
    local_backward_accumulate((dq, None, None), dout, q, k, v, out, lse, **kw, only="dq")
    fresh = [torch.full_like(t, float("nan")) for t in start[1:]]
    local_backward_accumulate((dq, *fresh), dout, q, k, v, out, lse, **kw, only="dkdv", add_dkdv=False)
    for g, want in zip((dq - start[0], *fresh), grads, strict=True):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
