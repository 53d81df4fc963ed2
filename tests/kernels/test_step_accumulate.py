"""The kernels' in-place step updates used by ring attention: the forward merged into a running
(out, lse) through the log-sum-exp (`merge_into`), and the backward added into fp32 gradient buffers
(`grads_into`). Each must equal the unfused computation (plain call, then the torch merge or add) and
attention over all the keys at once.

On CPU through the Triton interpreter with small shapes (fp16/fp32).
"""

from __future__ import annotations

import math

import pytest
import torch

from flashtrain.distributed.local_attention import merge_partial_
from kernels._flash_bwd import flash_attn_backward
from kernels._flash_fwd import flash_attn_forward
from kernels.reference import attention_reference
from tests.kernels._flash_utils import FLOOR

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LN2 = math.log(2.0)
F16, F32 = torch.float16, torch.float32

# (dtype, batch, seqlen_q, keys of the first call, keys of the second, nheads, nheads_kv, headdim, causal second)
CASES = [
    (F32, 1, 33, 17, 40, 2, 2, 16, True),  # the second call's top rows see no key (causal, more queries)
    (F16, 2, 17, 29, 17, 4, 2, 64, False),
    (F32, 1, 64, 64, 64, 2, 1, 40, True),
    (F16, 1, 40, 9, 70, 2, 2, 128, True),
]


def _call_kw(causal: bool, scale: float) -> dict:
    return dict(sm_scale=scale, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
                dropout_p=0.0, seed=0)  # fmt: skip


def _inputs(dtype, b, m, n1, n2, h, hk, d):
    gen = lambda *shape: torch.randn(*shape, dtype=dtype, device=DEVICE)  # noqa: E731
    return gen(b, m, h, d), gen(b, n1, hk, d), gen(b, n1, hk, d), gen(b, n2, hk, d), gen(b, n2, hk, d)


def _joint_mask(m: int, n1: int, n2: int, causal2: bool) -> torch.Tensor:
    """(m, n1 + n2) visibility: the first call's keys all, the second's causal bottom-right aligned."""
    second = torch.ones(m, n2, dtype=torch.bool)
    if causal2:
        second = torch.arange(n2)[None, :] <= torch.arange(m)[:, None] + (n2 - m)
    return torch.cat([torch.ones(m, n1, dtype=torch.bool), second], 1).to(DEVICE)


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{str(c[0])[6:]}-q{c[2]}-k{c[3]}+{c[4]}-d{c[7]}" for c in CASES]
)
def test_merge_into_equals_unfused_merge_and_joint_attention(case):
    dtype, b, m, n1, n2, h, hk, d, causal2 = case
    q, k1, v1, k2, v2 = _inputs(dtype, b, m, n1, n2, h, hk, d)
    scale = d**-0.5
    out1, lse1 = flash_attn_forward(q, k1, v1, **_call_kw(False, scale))
    out2, lse2 = flash_attn_forward(q, k2, v2, **_call_kw(causal2, scale))

    unfused_out, unfused_lse = out1.float().clone(), lse1 * LN2  # clone: .float() of fp32 is out1 itself
    merge_partial_(unfused_out, unfused_lse, out2, lse2 * LN2)
    # a wider accumulator, so the kernel writes through strided row views as the ring's do
    acc_out = torch.zeros(b, m + 5, h, d, dtype=F32, device=DEVICE)
    acc_lse = torch.full((b, h, m + 5), -math.inf, dtype=F32, device=DEVICE)
    out_view, lse_view = acc_out[:, 2 : 2 + m], acc_lse[:, :, 2 : 2 + m]
    out_view.copy_(out1.float())
    lse_view.copy_(lse1 * LN2)
    assert flash_attn_forward(q, k2, v2, merge_into=(out_view, lse_view), **_call_kw(causal2, scale)) is None

    # the fused merge rounds like the unfused one, except that the step's output is never cast to dtype
    tol = 4 * torch.finfo(dtype).eps * max(1.0, unfused_out.abs().max().item())
    torch.testing.assert_close(out_view, unfused_out, atol=tol, rtol=0)
    torch.testing.assert_close(lse_view, unfused_lse, atol=1e-5, rtol=1e-5)
    # rows outside the views are untouched
    assert acc_out[:, :2].eq(0).all() and acc_out[:, 2 + m :].eq(0).all()
    assert acc_lse[:, :, :2].isneginf().all() and acc_lse[:, :, 2 + m :].isneginf().all()

    joint = _joint_mask(m, n1, n2, causal2)
    ref, ref_lse = attention_reference(
        q.double(), torch.cat([k1, k2], 1).double(), torch.cat([v1, v2], 1).double(), attn_mask=joint,
        softmax_scale=scale, return_lse=True,
    )  # fmt: skip
    assert (out_view.double() - ref).abs().max().item() <= 4 * FLOOR[dtype] + 0.01 * (dtype == F16)
    torch.testing.assert_close(lse_view.double(), ref_lse.double(), atol=1e-3, rtol=1e-3)


def test_merge_into_an_empty_accumulator_is_the_plain_call():
    """lse = -inf rows (nothing merged yet) take the call's output exactly; rows the call does not
    reach either (causal, more queries than keys) stay out = 0, lse = -inf."""
    q, _, _, k, v = _inputs(F32, 1, 24, 1, 10, 2, 2, 16)
    kw = _call_kw(True, 0.25)
    out, lse2 = flash_attn_forward(q, k, v, **kw)
    acc_out = torch.zeros(q.shape, dtype=F32, device=DEVICE)
    acc_lse = torch.full((1, 2, 24), -math.inf, dtype=F32, device=DEVICE)
    flash_attn_forward(q, k, v, merge_into=(acc_out, acc_lse), **kw)
    torch.testing.assert_close(acc_out, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(acc_lse, lse2 * LN2, atol=1e-6, rtol=1e-6)
    assert acc_lse[:, :, :14].isneginf().all() and acc_out[:, :14].eq(0).all()
    assert not acc_out.isnan().any()


def _grads_ids(cases) -> list[str]:
    return [f"{str(c[0])[6:]}-q{c[2]}-k{c[4]}-d{c[7]}" for c in cases]


def _plain_backward(case):
    """(q, k, v, call options, out, base-2 lse, dout, plain (dq, dk, dv)) of one call against the case's
    second key set."""
    dtype, b, m, _, n, h, hk, d, causal = case
    q, _, _, k, v = _inputs(dtype, b, m, 1, n, h, hk, d)
    kw = _call_kw(causal, d**-0.5)
    out, lse2 = flash_attn_forward(q, k, v, **kw)
    dout = torch.randn_like(out)
    return q, k, v, kw, out, lse2, dout, flash_attn_backward(dout, q, k, v, out, lse2, **kw)


def _assert_is_plain(got: torch.Tensor, plain: torch.Tensor, name: str) -> None:
    """The plain gradient was rounded to its dtype; the fused one was accumulated in fp32."""
    tol = 2 * torch.finfo(plain.dtype).eps * max(1.0, plain.float().abs().max().item()) + 1e-6
    torch.testing.assert_close(got, plain.float(), atol=tol, rtol=0, msg=name)


@pytest.mark.parametrize("split", [False, True], ids=["one-call", "dkdv-then-dq"])
@pytest.mark.parametrize("case", CASES, ids=_grads_ids(CASES))
def test_grads_into_adds_the_plain_gradients(case, split):
    """Also split in two calls (`only`), as the ring runs it: each half adds only its own gradients."""
    q, k, v, kw, out, lse2, dout, plain = _plain_backward(case)

    start = [torch.randn(t.shape, dtype=F32, device=DEVICE) for t in (q, k, v)]
    # wider buffers, written through row views as the ring's accumulators are
    wide = [
        torch.zeros(t.shape[0], t.shape[1] + 3, *t.shape[2:], dtype=F32, device=DEVICE) for t in (q, k, v)
    ]
    views = [w[:, 1 : 1 + t.shape[1]] for w, t in zip(wide, (q, k, v), strict=True)]
    for view, s in zip(views, start, strict=True):
        view.copy_(s)
    if split:
        flash_attn_backward(dout, q, k, v, out, lse2, grads_into=tuple(views), only="dkdv", **kw)
        assert torch.equal(views[0], start[0]), "the dk/dv half touched dq"
        before = [view.clone() for view in views[1:]]
        flash_attn_backward(dout, q, k, v, out, lse2, grads_into=tuple(views), only="dq", **kw)
        for view, b in zip(views[1:], before, strict=True):
            assert torch.equal(view, b), "the dq half touched dk or dv"
    else:
        flash_attn_backward(dout, q, k, v, out, lse2, grads_into=tuple(views), **kw)
    for name, view, s, g in zip("qkv", views, start, plain, strict=True):
        _assert_is_plain(view - s, g, f"d{name}")
    for w, t in zip(wide, (q, k, v), strict=True):
        assert w[:, 0].eq(0).all() and w[:, 1 + t.shape[1] :].eq(0).all()


@pytest.mark.parametrize("case", CASES[:2], ids=_grads_ids(CASES[:2]))
def test_grads_into_stores_dkdv_into_a_fresh_buffer(case):
    """add_dkdv=False overwrites every dK/dV row (a NaN-filled buffer needs no zero fill first) while dq
    still adds; the dq half takes None for dk and dv (the ring runs its own K/V's dq first)."""
    q, k, v, kw, out, lse2, dout, plain = _plain_backward(case)

    dq_start = torch.randn(q.shape, dtype=F32, device=DEVICE)
    dq = dq_start.clone()
    flash_attn_backward(dout, q, k, v, out, lse2, grads_into=(dq, None, None), only="dq", **kw)
    dk, dv = (torch.full(t.shape, math.nan, dtype=F32, device=DEVICE) for t in (k, v))
    flash_attn_backward(dout, q, k, v, out, lse2, grads_into=(dq, dk, dv), only="dkdv", add_dkdv=False, **kw)
    for name, got, g in (("dq", dq - dq_start, plain[0]), ("dk", dk, plain[1]), ("dv", dv, plain[2])):
        _assert_is_plain(got, g, name)


def test_fused_updates_refuse_what_they_cannot_do():
    q, k, v, _, _ = _inputs(F16, 1, 8, 8, 1, 2, 2, 16)
    kw = _call_kw(False, 0.25)
    with pytest.raises(ValueError, match="fp32"):
        flash_attn_forward(q, k, v, merge_into=(torch.zeros(q.shape, dtype=F16), torch.zeros(1, 2, 8)), **kw)
    out, lse2 = flash_attn_forward(q, k, v, **kw)
    bad = (torch.zeros(q.shape), torch.zeros(k.shape, dtype=F16), torch.zeros(v.shape))
    with pytest.raises(ValueError, match="grads_into dk"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, grads_into=bad, **kw)
    with pytest.raises(ValueError, match="grads_into dk must be fp32 .* got None"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, grads_into=(bad[0], None, None), **kw)
    with pytest.raises(ValueError, match="needs grads_into"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, only="dq", **kw)
    good = tuple(torch.zeros(t.shape) for t in (q, k, v))
    with pytest.raises(ValueError, match="only must be"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, grads_into=good, only="dk", **kw)
    # grads_out (the packed-QKV path's store targets): the inputs' dtype and shape, and not with grads_into
    with pytest.raises(ValueError, match="grads_out dq must be torch.float16"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, grads_out=good, **kw)
    with pytest.raises(ValueError, match="not both"):
        flash_attn_backward(torch.randn_like(out), q, k, v, out, lse2, grads_into=good, grads_out=good, **kw)
