"""kernels.flash_attention_varlen (packed sequences) against the per-sequence float64 reference."""

from __future__ import annotations

import pytest
import torch

from kernels import flash_attention_varlen
from kernels.reference import attention_varlen_reference
from tests.kernels._flash_utils import check_against_reference, randn

F16, F32 = torch.float16, torch.float32


def _cu(lens, device):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


# (dtype, q lengths, k lengths, nheads, nheads_kv, headdim, causal, window); lengths include 0 and 1
CASES = [
    (F32, [5, 0, 35, 1], [7, 3, 50, 1], 4, 2, 64, False, None),
    (F16, [5, 0, 35, 1], [7, 3, 50, 1], 4, 2, 64, True, None),
    (F16, [17, 40], [17, 40], 2, 1, 40, True, (8, None)),
    (F32, [33, 1, 20], [20, 64, 20], 2, 2, 80, False, (4, 4)),
]


def _check_varlen(case, device, seed, deterministic=True, lse_grad=False):
    """One packed batch against the per-sequence float64 reference, gradients included."""
    dtype, lq, lk, h, hk, d, causal, window = case
    torch.manual_seed(seed)
    cu_q, cu_k = _cu(lq, device), _cu(lk, device)
    q = randn(sum(lq), h, d, dtype=dtype, device=device)
    k, v = (randn(sum(lk), hk, d, dtype=dtype, device=device) for _ in range(2))
    kw = dict(causal=causal, window=window, return_lse=True)
    check_against_reference(
        lambda q, k, v: flash_attention_varlen(
            q, k, v, cu_q, cu_k, max(lq), max(lk), deterministic=deterministic, **kw
        ),
        lambda q, k, v: attention_varlen_reference(q, k, v, cu_q, cu_k, **kw),
        [q, k, v],
        dtype,
        lse_grad=lse_grad,
    )


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-{c[2]}-d{c[5]}-c{c[6]}-w{c[7]}"
)
def test_varlen_matches_reference(case, device):
    _check_varlen(case, device, seed=sum(case[1]) + case[5])


def test_varlen_atomic_dq(device):
    _check_varlen(CASES[1], device, seed=5, deterministic=False)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_varlen_lse_gradient(deterministic, device):
    """A loss on the packed lse too (empty and one-token sequences among them) reaches q and k."""
    _check_varlen(CASES[1], device, seed=11, deterministic=deterministic, lse_grad=True)


def test_varlen_strided_packed_qkv(device):
    """q, k, v as views of one packed (total, 3, H, D) tensor, as a fused QKV projection gives them."""
    torch.manual_seed(7)
    qkv = torch.randn(30, 3, 2, 32, dtype=F32, device=device)
    cu = _cu([10, 20], device)
    q, k, v = qkv.unbind(1)
    out = flash_attention_varlen(q, k, v, cu, cu, 20, 20, causal=True)
    ref = attention_varlen_reference(q, k, v, cu, cu, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "cu_q, max_q, match",
    [
        ([0, 4, 8], 4, None),  # valid: the control
        ([0, 5, 4], 5, "non-decreasing"),
        ([0, 4, 7], 4, "must equal the packed length"),
        ([1, 4, 8], 4, "must start at 0"),
        ([0, 2, 8], 4, "shorter than the longest"),
    ],
)
def test_varlen_bad_cu_seqlens(cu_q, max_q, match, device):
    q = torch.randn(8, 2, 16, dtype=F32, device=device)
    cu = torch.tensor(cu_q, dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 4, 8], dtype=torch.int32, device=device)
    if match is None:
        flash_attention_varlen(q, q, q, cu, cu_k, max_q, 4)
        return
    with pytest.raises(ValueError, match=match):
        flash_attention_varlen(q, q, q, cu, cu_k, max_q, 4)


@pytest.mark.parametrize("max_q", ["4", 4.0, True], ids=["str", "float", "bool"])
def test_varlen_max_seqlen_must_be_an_int(max_q, device):
    q = torch.randn(8, 2, 16, dtype=F32, device=device)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="max_seqlen_q must be an int"):
        flash_attention_varlen(q, q, q, cu, cu, max_q, 4)


def test_varlen_bad_inputs(device):
    q = torch.randn(8, 2, 16, dtype=F32, device=device)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="int32"):
        flash_attention_varlen(q, q, q, cu.long(), cu, 4, 4)
    with pytest.raises(ValueError, match="total, nheads, headdim"):
        flash_attention_varlen(q[None], q, q, cu, cu, 4, 4)
    with pytest.raises(ValueError, match="same batch"):
        flash_attention_varlen(q, q, q, cu, torch.tensor([0, 8], dtype=torch.int32, device=device), 4, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k must be a torch.Tensor"):
        flash_attention_varlen(q, q, q, cu, [0, 4, 8], 4, 4)


@pytest.mark.gpu
def test_gpu_varlen_bf16():
    torch.manual_seed(11)
    lq = [1000, 1, 3000, 517]
    lk = [1200, 64, 3000, 517]
    cu_q, cu_k = _cu(lq, "cuda"), _cu(lk, "cuda")
    dt = torch.bfloat16
    q = randn(sum(lq), 8, 128, dtype=dt, device="cuda")
    k, v = (randn(sum(lk), 2, 128, dtype=dt, device="cuda") for _ in range(2))
    kw = dict(causal=True, return_lse=True)
    check_against_reference(
        lambda q, k, v: flash_attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw),
        lambda q, k, v: attention_varlen_reference(q, k, v, cu_q, cu_k, **kw),
        [q, k, v],
        dt,
    )
