"""kernels.flash_attention_qkvpacked: flash_attention on a fused projection's output, whose backward
stores dq, dk, dv into one gradient shaped like qkv.

Checked against the float64 reference (the tolerance rule), and against flash_attention on the three
views of the same qkv, which runs the same kernels: outputs, lse and gradients must be bitwise equal.
"""

from __future__ import annotations

import pytest
import torch

from kernels import flash_attention, flash_attention_qkvpacked
from kernels.reference import attention_qkvpacked_reference, split_qkv
from tests.kernels._flash_utils import (
    assert_bad_input_raises,
    bad_input_names,
    check_against_reference,
    randn,
)

F16, F32 = torch.float16, torch.float32


# (dtype, batch, seqlen, nheads, nheads_kv, headdim, causal, window)
CASES = [
    (F16, 2, 33, 2, 2, 64, True, None),
    (F32, 1, 17, 4, 1, 40, False, None),  # MQA
    (F16, 1, 129, 4, 2, 16, True, (16, None)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_matches_reference(case, device):
    dtype, b, n, h, hk, d, causal, window = case
    torch.manual_seed(n + d)
    qkv = randn(b, n, h + 2 * hk, d, dtype=dtype, device=device)
    kw = dict(causal=causal, window=window, return_lse=True)
    check_against_reference(
        lambda qkv: flash_attention_qkvpacked(qkv, nheads_kv=hk, **kw),
        lambda qkv: attention_qkvpacked_reference(qkv, nheads_kv=hk, **kw),
        [qkv],
        dtype,
        names=("qkv",),
        lse_grad=True,
    )


@pytest.mark.parametrize(
    "nheads_kv,causal,padded,dropout_p,deterministic",
    [(None, True, False, 0.0, True), (1, False, True, 0.25, True), (2, True, False, 0.0, False)],
)
def test_bitwise_equal_to_flash_attention_on_views(
    nheads_kv, causal, padded, dropout_p, deterministic, device
):
    """Same kernels, same inputs: the packed call only changes where the gradients are stored. With
    dropout both calls draw their seed from the same torch seed."""
    torch.manual_seed(11)
    hk = 2 if nheads_kv is None else nheads_kv
    qkv = randn(2, 37, 2 + 2 * hk if nheads_kv is not None else 6, 32, dtype=F32, device=device)
    mask = None
    if padded:
        mask = torch.ones(2, 37, dtype=torch.bool, device=device)
        mask[1, -9:] = False
    kw = dict(
        causal=causal,
        dropout_p=dropout_p,
        key_padding_mask=mask,
        return_lse=True,
        deterministic=deterministic,
    )
    dout = torch.randn(2, 37, qkv.shape[2] - 2 * hk, 32, device=device)
    torch.manual_seed(5)
    out_p, lse_p = flash_attention_qkvpacked(qkv, nheads_kv=nheads_kv, **kw)
    (grad_p,) = torch.autograd.grad(out_p, qkv, dout)
    torch.manual_seed(5)
    out_v, lse_v = flash_attention(*split_qkv(qkv, hk), **kw)
    (grad_v,) = torch.autograd.grad(out_v, qkv, dout)  # autograd concatenates the three view gradients
    assert grad_p.shape == qkv.shape
    assert torch.equal(lse_p, lse_v)
    if deterministic:
        assert torch.equal(out_p, out_v) and torch.equal(grad_p, grad_v)
    else:  # the atomic dq sums in a run-dependent order
        assert torch.equal(out_p, out_v)
        torch.testing.assert_close(grad_p, grad_v)


def test_strided_qkv_view(device):
    """qkv sliced out of a wider tensor (heads not adjacent in memory): the gradient comes back in
    qkv's shape and matches the views' gradient."""
    torch.manual_seed(2)
    wide = randn(1, 20, 8, 16, dtype=F32, device=device)
    qkv = wide[:, :, 1:7]
    out = flash_attention_qkvpacked(qkv, causal=True)
    (grad,) = torch.autograd.grad(out.sum(), wide)
    out_v = flash_attention(*split_qkv(qkv, 2), causal=True)
    (grad_v,) = torch.autograd.grad(out_v.sum(), wide)
    assert torch.equal(out, out_v) and torch.equal(grad, grad_v)
    assert (grad[:, :, 0] == 0).all() and (grad[:, :, 7] == 0).all()


def _bad(device):
    qkv = torch.randn(1, 8, 6, 16, device=device, dtype=F16)
    return [
        ("rank", lambda: flash_attention_qkvpacked(qkv[0]), "nheads \\+ 2 \\* nheads_kv"),
        ("not 3 x heads", lambda: flash_attention_qkvpacked(qkv[:, :, :5]), "pass nheads_kv"),
        ("too many kv heads", lambda: flash_attention_qkvpacked(qkv, nheads_kv=3), "at least one query head"),
        ("kv heads type", lambda: flash_attention_qkvpacked(qkv, nheads_kv=True), "positive int"),
        ("kv heads zero", lambda: flash_attention_qkvpacked(qkv, nheads_kv=0), "positive int"),
        ("group", lambda: flash_attention_qkvpacked(qkv[:, :, :5], nheads_kv=2), "multiple of nheads_kv"),
        ("kpm shape", lambda: flash_attention_qkvpacked(qkv, key_padding_mask=torch.ones(1, 7, dtype=torch.bool, device=device)), "shape"),
        ("dropout", lambda: flash_attention_qkvpacked(qkv, dropout_p=1.0), r"\[0, 1\)"),
        ("not a tensor", lambda: flash_attention_qkvpacked(qkv.tolist()), "qkv must be a torch.Tensor"),
    ]  # fmt: skip


@pytest.mark.parametrize("name", bad_input_names(_bad))
def test_bad_inputs_raise(name, device):
    assert_bad_input_raises(_bad, name, device)


@pytest.mark.gpu
def test_gpu_bf16():
    torch.manual_seed(9)
    qkv = randn(2, 2048, 16 + 2 * 4, 64, dtype=torch.bfloat16, device="cuda")
    kw = dict(causal=True, return_lse=True)
    check_against_reference(
        lambda qkv: flash_attention_qkvpacked(qkv, nheads_kv=4, **kw),
        lambda qkv: attention_qkvpacked_reference(qkv, nheads_kv=4, **kw),
        [qkv],
        torch.bfloat16,
        names=("qkv",),
    )
