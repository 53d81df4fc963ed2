"""One sequence past 2**31 elements: the kernels' WIDE builds (64-bit row and head offsets) take it, at every
entry point, forward and backward.

The usual builds offset rows inside a sequence in 32 bits (an int32 row times its stride), which wraps past
2**31 elements: on an H200 the windowed forward read wrong values at 1.11M tokens x 16 heads of 128
(results/s71/call8/). Here small calls stand for such sequences: views whose rows lie 2**25 elements apart
in one storage that is allocated but never filled (its pages are never touched but for the rows used), so
a few dozen rows span ~2.3e9 elements. Each view starts past 2**31 elements, so a wrapped offset would land
inside the storage and read wrong values rather than fault. Every call is compared with the same call on
contiguous copies (the usual build): bitwise under the interpreter (one tile config); on a GPU within
rounding, as the WIDE build tunes its own tiles (wrong rows are off by ~0.2-0.7, results/s72/call2/).
"""

from __future__ import annotations

import pytest
import torch

import kernels._common as common
from kernels import _flash_dq_hopper as dq_hopper
from kernels import (
    block_sparse_attention,
    flash_attention,
    flash_attention_qkvpacked,
    flash_attention_varlen,
    flash_decode,
)
from kernels._flash_bwd import flash_attn_backward
from kernels._flash_fwd import flash_attn_forward
from kernels.layouts import butterfly_layout, local_layout
from tests.kernels.test_flash_fwd_hopper import needs_hopper

F16 = torch.float16
ROW_STRIDE = 2**25  # elements between rows: row 64 starts at 2**31
ROWS = 72  # rows 64..71 are where 32-bit offsets wrap
BASE = 2**31  # where the views start: a wrapped (negative) offset stays inside the storage


def _wide_views(widths, device, dtype=F16, rows=ROWS):
    """Views (1, rows, heads, d) for each (heads, d) in widths, side by side in each row of one storage
    with rows ROW_STRIDE elements apart, filled with random values (only their own elements are
    written); the storage (~9 GB of fp16 address space) is never touched elsewhere."""
    storage = torch.empty(BASE + rows * ROW_STRIDE, dtype=dtype, device=device)
    views, col = [], 0
    for heads, d in widths:
        view = storage.as_strided((1, rows, heads, d), (0, ROW_STRIDE, d, 1), BASE + col)
        view.normal_()
        views.append(view)
        col += heads * d
    return views


def _copies(*tensors):
    return [t.detach().contiguous().requires_grad_(t.requires_grad) for t in tensors]


def _assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        if a.is_cuda:  # (fp16 gradients summed in other tile orders)
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(a, b)


def test_the_extent_counts_one_sequence_with_its_strides(monkeypatch, device):
    """A sequence's extent runs from its first element to its last, strides included (a packed qkv view
    reaches the limit at a third of the tokens); the batch does not count (its offset is 64-bit)."""
    monkeypatch.setattr(common, "SEQUENCE_EXTENT_LIMIT", 32 * 2 * 16)
    q = torch.empty(4, 32, 2, 16, device=device)
    assert common.sequence_extent(q, 32, 1) == 32 * 2 * 16 and not common.wide_offsets((q,))
    assert common.wide_offsets((torch.empty(1, 33, 2, 16, device=device),))
    qkv = torch.empty(1, 12, 6, 16, device=device)  # row stride 96: 11 x 96 + 5 x 16 + 16 = 1152
    assert common.sequence_extent(qkv[:, :, :2], 12, 1) == 11 * 96 + 16 + 16
    assert common.wide_offsets((None, qkv[:, :, :2]))
    packed = torch.empty(50, 2, 16, device=device)  # varlen: one sequence's rows count, not the pack's
    assert not common.wide_offsets((packed,), 25) and common.wide_offsets((packed,), 40)


def test_these_views_wrap_the_usual_builds_offsets(monkeypatch, device):
    """The check's own check: the usual forward build on these views reads wrong rows (here inside the
    storage), so the equalities below hold only through the WIDE build."""
    import kernels._flash_fwd as fwd

    q, k, v = _wide_views([(1, 16)] * 3, device)
    assert common.sequence_extent(q, ROWS, 1) > 2**31
    monkeypatch.setattr(fwd, "wide_offsets", lambda *args, **kwargs: False)
    wrapped = flash_attention(q, k, v, causal=True)
    want = flash_attention(*_copies(q, k, v), causal=True)
    assert torch.equal(wrapped[:, :64], want[:, :64])
    assert not torch.equal(wrapped[:, 64:], want[:, 64:])


@pytest.mark.parametrize("window, deterministic", [(None, True), ((20, 0), False)])
def test_flash_attention_forward_and_backward(window, deterministic, device):
    """GQA (2 query heads on 1), causal or a window, with dropout; the gradients' reads are wide too
    (deterministic=False: dq added inside the dK/dV kernel)."""
    q, k, v = _wide_views([(2, 16), (1, 16), (1, 16)], device)
    for t in (q, k, v):
        t.requires_grad_()
    copies = _copies(q, k, v)
    outs = []
    for args in ((q, k, v), copies):
        torch.manual_seed(1)
        out = flash_attention(*args, causal=True, window=window, dropout_p=0.1, deterministic=deterministic)
        grads = torch.autograd.grad(out, args, torch.ones_like(out))
        outs.append([out, *grads])
    _assert_same(*outs)


def test_packed_qkv_and_its_gradient(device):
    (qkv,) = _wide_views([(3, 16)], device)
    qkv.requires_grad_()
    (copy,) = _copies(qkv)
    got, want = (flash_attention_qkvpacked(t, causal=True) for t in (qkv, copy))
    _assert_same([got, *torch.autograd.grad(got, qkv, got)], [want, *torch.autograd.grad(want, copy, want)])


def test_varlen_with_one_long_sequence(device):
    """Two packed sequences of 4 and 68 rows: the long one spans past 2**31 elements. The loss takes lse
    too, so the backward's delta comes from its own kernel."""
    q, k, v = (t[0] for t in _wide_views([(2, 16), (1, 16), (1, 16)], device))
    cu = torch.tensor([0, 4, ROWS], dtype=torch.int32, device=device)
    for t in (q, k, v):
        t.requires_grad_()
    outs = []
    for args in ((q, k, v), _copies(q, k, v)):
        out, lse = flash_attention_varlen(*args, cu, cu, ROWS - 4, ROWS - 4, causal=True, return_lse=True)
        outs.append([out, lse, *torch.autograd.grad((out, lse), args, (out, torch.ones_like(lse)))])
    _assert_same(*outs)


def test_the_launchers_write_wide_outputs(device):
    """What the public calls allocate is contiguous (short); the ring's merge into running fp32
    accumulators and a packed call's gradient views are caller's tensors, written at wide offsets."""
    q, k, v, do, dq, dk, dv = _wide_views(
        [(2, 16), (1, 16), (1, 16), (2, 16), (2, 16), (1, 16), (1, 16)], device
    )
    kw = dict(sm_scale=0.25, win_left=None, win_right=0, key_padding_mask=None, dropout_p=0.0, seed=0)
    out, lse2 = flash_attn_forward(q, k, v, **kw)
    want_out, want_lse2 = flash_attn_forward(*_copies(q, k, v), **kw)
    _assert_same([out, lse2], [want_out, want_lse2])
    flash_attn_backward(do, q, k, v, out, lse2, **kw, grads_out=(dq, dk, dv))
    want = flash_attn_backward(*_copies(do, q, k, v), want_out, want_lse2, **kw)
    _assert_same([dq, dk, dv], want)
    del q, k, v, do, dq, dk, dv
    out_acc, other = _wide_views([(2, 16), (2, 16)], device, dtype=torch.float32)
    q, k, v = (t.to(F16) for t in _copies(other, other[:, :, :1], other[:, :, 1:]))
    lse_acc = torch.randn(1, 2, ROWS, device=device)
    want_acc, want_lse = out_acc.contiguous(), lse_acc.clone()
    flash_attn_forward(q, k, v, **kw, merge_into=(out_acc, lse_acc))
    flash_attn_forward(q, k, v, **kw, merge_into=(want_acc, want_lse))
    _assert_same([out_acc, lse_acc], [want_acc, want_lse])


def test_block_sparse_forward_and_backward(device):
    q, k, v = _wide_views([(2, 16), (1, 16), (1, 16)], device)
    for t in (q, k, v):
        t.requires_grad_()
    for layout in (butterfly_layout(ROWS, 16, causal=True), local_layout(ROWS, 16, local_blocks=1)):
        layout = layout.to(device)
        outs = []
        for args in ((q, k, v), _copies(q, k, v)):
            out = block_sparse_attention(*args, layout, causal=True)
            outs.append([out, *torch.autograd.grad(out, args, out)])
        _assert_same(*outs)


@pytest.mark.gpu
@needs_hopper
def test_gpu_hopper_dq_reads_a_wide_out():
    """Hopper's dq kernel reads `out` by pointer (its other tensors through TMA descriptors): from a view
    whose rows lie past 2**31 elements its dq and delta are bitwise those from a contiguous copy (one
    kernel, one config)."""
    (out,) = _wide_views([(2, 128)], "cuda", dtype=torch.bfloat16)
    q, k, v, do = (torch.randn(1, ROWS, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    kw = dict(sm_scale=128**-0.5, win_left=None, win_right=0, key_padding_mask=None, dropout_p=0.0, seed=0)
    contiguous, lse2 = flash_attn_forward(q, k, v, **kw)
    out.copy_(contiguous)
    assert dq_hopper.reads_out(out) and common.wide_offsets((out,))
    got = []
    for o in (out, contiguous):
        dq, delta = torch.empty_like(q), torch.empty_like(lse2)
        dq_hopper.flash_attn_dq_hopper(q, k, v, do, o, lse2, delta, dq, sm_scale=128**-0.5, causal=True)
        got.append([dq, delta])
    assert all(torch.equal(a, b) for a, b in zip(*got, strict=True))


def test_decode_over_a_wide_cache(device):
    """flash_decode walks such a cache in its WIDE build (64-bit row and head offsets), through a layout too; its
    few new queries are checked: a q spanning past the limit is refused with what to do."""
    k, v = _wide_views([(1, 16), (1, 16)], device)
    q = torch.randn(1, 1, 2, 16, dtype=F16, device=device)
    lens = torch.tensor([ROWS - 3], dtype=torch.int32, device=device)
    layout = butterfly_layout(ROWS, 16).to(device)
    for kw in (dict(causal=True), dict(layout=layout)):
        assert torch.equal(flash_decode(q, k, v, lens, **kw), flash_decode(q, *_copies(k, v), lens, **kw))
    (wide_q,) = _wide_views([(2, 16)], device, rows=66)
    with pytest.raises(ValueError, match="q: 66 new queries of one sequence span .* kernels.flash_attention"):
        flash_decode(wide_q, k, v, lens)
