"""Dropout inside the attention kernels: Philox masks regenerated from (seed, position), never stored.

The test helper kernels.flash_attention.dropout_mask draws the mask with the kernels' own formula, so
the reference can be given the exact mask and forward and backward compared with it.
"""

from __future__ import annotations

import pytest
import torch

from kernels import flash_attention, flash_attention_varlen
from kernels._common import draw_seed
from kernels.flash_attention import dropout_mask
from kernels.reference import attention_reference
from tests.kernels._flash_utils import check_against_reference, randn

F16, F32 = torch.float16, torch.float32


def test_keep_rate_and_seed_dependence(device):
    p = 0.2
    m1 = dropout_mask(123, 2, 4, 64, 256, p, device)
    assert m1.shape == (2, 4, 64, 256)
    assert abs(m1.float().mean().item() - (1 - p)) < 0.01  # 131k draws: std of the mean ~0.001
    assert torch.equal(m1, dropout_mask(123, 2, 4, 64, 256, p, device))
    assert not torch.equal(m1, dropout_mask(124, 2, 4, 64, 256, p, device))


@pytest.mark.parametrize(
    "dtype, b, sq, sk, h, hk, d, causal",
    [(F32, 2, 45, 70, 2, 1, 32, True), (F16, 1, 33, 33, 4, 2, 64, False)],
)
def test_forward_and_backward_use_the_same_mask(dtype, b, sq, sk, h, hk, d, causal, device):
    """Compare with the reference given the mask the kernel drew; backward too, so it must regenerate it."""
    p = 0.25
    torch.manual_seed(sq)
    q = randn(b, sq, h, d, dtype=dtype, device=device)
    k, v = (randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2))
    torch.manual_seed(99)
    seed = draw_seed()  # the seed flash_attention will draw after the same manual_seed
    mask = dropout_mask(seed, b, h, sq, sk, p, device)

    def kernel(q, k, v):
        torch.manual_seed(99)
        return flash_attention(q, k, v, causal=causal, dropout_p=p, return_lse=True)

    def ref(q, k, v):
        return attention_reference(q, k, v, causal=causal, dropout_p=p, dropout_mask=mask, return_lse=True)

    check_against_reference(kernel, ref, [q, k, v], dtype)


def test_reproducible_under_manual_seed(device):
    q, k, v = (torch.randn(1, 40, 2, 32, device=device) for _ in range(3))
    outs = []
    for s in (5, 5, 6):
        torch.manual_seed(s)
        outs.append(flash_attention(q, k, v, dropout_p=0.5))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    assert not torch.equal(outs[0], flash_attention(q, k, v))


def test_varlen_single_sequence_draws_the_dense_mask(device):
    """With one sequence the varlen Philox ids equal the dense ones, so both paths must agree exactly."""
    torch.manual_seed(8)
    q, k, v = (randn(1, 50, 2, 16, dtype=F32, device=device) for _ in range(3))
    cu = torch.tensor([0, 50], dtype=torch.int32, device=device)
    torch.manual_seed(3)
    dense = flash_attention(q, k, v, dropout_p=0.3, causal=True)
    torch.manual_seed(3)
    packed = flash_attention_varlen(q[0], k[0], v[0], cu, cu, 50, 50, dropout_p=0.3, causal=True)
    torch.testing.assert_close(packed, dense[0], atol=1e-6, rtol=1e-6)
    g_dense = torch.autograd.grad(dense, (q, k, v), torch.ones_like(dense))
    g_packed = torch.autograd.grad(packed, (q, k, v), torch.ones_like(packed))
    for a, b in zip(g_dense, g_packed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_dropout_bf16():
    p = 0.1
    torch.manual_seed(21)
    dt = torch.bfloat16
    q, k, v = (randn(2, 1024, 8, 64, dtype=dt, device="cuda") for _ in range(3))
    torch.manual_seed(1)
    mask = dropout_mask(draw_seed(), 2, 8, 1024, 1024, p, "cuda")
    assert abs(mask.float().mean().item() - (1 - p)) < 0.005

    def kernel(q, k, v):
        torch.manual_seed(1)
        return flash_attention(q, k, v, causal=True, dropout_p=p, return_lse=True)

    def ref(q, k, v):
        return attention_reference(q, k, v, causal=True, dropout_p=p, dropout_mask=mask, return_lse=True)

    check_against_reference(kernel, ref, [q, k, v], dt)
