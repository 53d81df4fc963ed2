"""The Gluon Hopper dq kernel (`kernels._flash_dq_hopper`): which backward calls take it, and (on an
H100/H200) that its dq and delta match the float64 reference on every edge of its schedule.

Its sm_90 builds (and their spill check) are in test_flash_fwd_hopper.py with the forward's, through
`benchmarks/check_hopper_builds.py`, which builds both kernels.
"""

from __future__ import annotations

import pytest
import torch

from kernels import _flash_dq_hopper as dq_hopper
from kernels import flash_attention, flash_attention_qkvpacked
from kernels._common import lse_to_natural
from kernels._flash_fwd import flash_attn_forward
from kernels.reference import attention_qkvpacked_reference, attention_reference
from tests.kernels._flash_utils import assert_close_rule, check_against_reference, randn
from tests.kernels.test_flash_fwd_hopper import EDGES, needs_hopper

BF16, F16 = torch.bfloat16, torch.float16


def _supports_kw(**change):
    kw = dict(win_left=None, win_right=None, key_padding_mask=None, dropout_p=0.0, varlen=False)
    return {**kw, **change}


def test_cpu_tensors_never_take_it():
    q = torch.randn(1, 4096, 2, 128, dtype=BF16)
    assert not dq_hopper.supports(q, q, q, q, q, q, **_supports_kw())


@pytest.mark.parametrize(
    "headdim, seqlen_q, causal, takes",
    [(128, 4096, True, True), (128, 1024, False, True), (128, 1000, True, False), (64, 4096, True, False),
     (64, 16384, False, False), (96, 4096, True, False), (256, 4096, False, False)],
)  # fmt: skip
def test_where_it_is_faster(headdim, seqlen_q, causal, takes):
    assert dq_hopper.faster_here(headdim, seqlen_q, causal) is takes


# ---------------------------------------------------------------------------------------------------
# GPU (sm_90)
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def dq_calls(monkeypatch) -> list:
    """Records each call of the Hopper dq kernel (which still runs)."""
    calls = []
    real = dq_hopper.flash_attn_dq_hopper
    monkeypatch.setattr(dq_hopper, "flash_attn_dq_hopper", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("headdim", sorted(dq_hopper.CONFIGS))
@pytest.mark.parametrize("case", EDGES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_kernel_matches_reference(case, headdim, dtype):
    """dq and delta of the kernel alone, given the forward's out and lse."""
    b, sq, sk, h, hk, causal = case
    torch.manual_seed(sq + sk + headdim)
    q = randn(b, sq, h, headdim, dtype=dtype, device="cuda", requires_grad=False)
    k, v = (randn(b, sk, hk, headdim, dtype=dtype, device="cuda", requires_grad=False) for _ in range(2))
    do = torch.randn_like(q)
    scale = headdim**-0.5
    out, lse2 = flash_attn_forward(
        q, k, v, sm_scale=scale, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
        dropout_p=0.0, seed=0,
    )  # fmt: skip
    dq, delta = torch.full_like(q, float("nan")), torch.full_like(lse2, float("nan"))
    dq_hopper.flash_attn_dq_hopper(q, k, v, do, out, lse2, delta, dq, sm_scale=scale, causal=causal)

    def ref_dq(q, k, v):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        (grad,) = torch.autograd.grad(attention_reference(q, k, v, causal=causal), q, do.to(q.dtype))
        return grad

    assert_close_rule("dq", dq, ref_dq(q.double(), k.double(), v.double()), ref_dq(q, k, v), dtype)
    torch.testing.assert_close(
        delta, (do.float() * out.float()).sum(-1).transpose(1, 2), rtol=1e-4, atol=1e-4
    )
    assert torch.isfinite(lse_to_natural(lse2)).any()  # (the forward ran)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, causal",
    [(1, 4096, 4096, 4, 2, 128, True), (2, 1024, 1024, 4, 4, 128, False), (1, 2048, 1500, 8, 1, 128, True)],
)
def test_gpu_backward_takes_it_and_matches(dq_calls, b, sq, sk, h, hk, d, causal):
    """flash_attention's backward sends these calls' dq to the Hopper kernel (the portable dK/dV kernel
    reads the delta it writes); all three gradients pass the tolerance rule."""
    torch.manual_seed(sq + d)
    q = randn(b, sq, h, d, dtype=BF16, device="cuda")
    k, v = (randn(b, sk, hk, d, dtype=BF16, device="cuda") for _ in range(2))
    check_against_reference(
        lambda q, k, v: _out_and_lse(flash_attention, q, k, v, causal=causal),
        lambda q, k, v: attention_reference(q, k, v, causal=causal, return_lse=True),
        [q, k, v],
        BF16,
    )
    assert dq_calls


def _out_and_lse(fn, *inputs, **kw):
    """(out, lse) with out from a call without lse: a loss that uses lse has its gradient folded into a
    precomputed delta, which the portable dq kernel takes (as the last test checks)."""
    with torch.no_grad():
        _, lse = fn(*(t.detach() for t in inputs), return_lse=True, **kw)
    return fn(*inputs, **kw), lse


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_qkv_takes_it(dq_calls):
    """GPT-2's layout (at head dim 128): dq is stored into a view of the packed gradient."""
    torch.manual_seed(3)
    qkv = randn(1, 4096, 3 * 4, 128, dtype=BF16, device="cuda")
    check_against_reference(
        lambda qkv: _out_and_lse(flash_attention_qkvpacked, qkv, causal=True),
        lambda qkv: attention_qkvpacked_reference(qkv, causal=True, return_lse=True),
        [qkv],
        BF16,
        names=("qkv",),
    )
    assert dq_calls


@pytest.mark.gpu
@needs_hopper
def test_gpu_other_backwards_keep_the_portable_kernel(monkeypatch):
    monkeypatch.setattr(dq_hopper, "flash_attn_dq_hopper", lambda *a, **kw: pytest.fail("took the Hopper dq"))
    q = torch.randn(1, 2048, 2, 128, device="cuda", dtype=BF16, requires_grad=True)
    for kw in (dict(causal=True, window=(256, 0)), dict(causal=True, dropout_p=0.1), dict(return_lse=True)):
        out = flash_attention(q, q, q, **kw)
        if kw.get("return_lse"):  # a loss that uses lse: its gradient is folded into delta beforehand
            out, lse = out
            (out.sum() + lse.sum()).backward()
        else:
            out.sum().backward()
    q32 = torch.randn(1, 2048, 2, 128, device="cuda", requires_grad=True)
    flash_attention(q32, q32, q32).sum().backward()  # fp32
    q64 = torch.randn(1, 4096, 2, 64, device="cuda", dtype=BF16, requires_grad=True)
    flash_attention(q64, q64, q64, causal=True).sum().backward()  # head dim 64
    short = q[:, :1000].detach().requires_grad_()
    flash_attention(short, short, short).sum().backward()  # shorter than measured
