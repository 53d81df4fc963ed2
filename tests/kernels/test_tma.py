"""The TMA-descriptor path of the FlashAttention kernels (Hopper; the interpreter runs it on CPU).

K/V (forward, dq) and Q/dO (dk/dv) tiles stream through 2-D descriptors over the rows of all batches.
A box that runs past a sequence's end reads the next sequence's rows where the pointer path reads
zeros; the kernels mask those scores, so both paths must agree bit for bit in the interpreter.
"""

from __future__ import annotations

import pytest
import torch

import kernels._common as common
from kernels import flash_attention, flash_attention_varlen
from kernels._common import row_descriptor
from tests.kernels._flash_utils import randn

F16, F32 = torch.float16, torch.float32


def test_descriptor_covers_rows_of_all_batches_and_heads(device):
    q = torch.zeros(3, 10, 4, 64, dtype=F16, device=device)
    desc = row_descriptor(q)
    assert desc is not None and desc.shape == [30, 256] and desc.strides == [256, 1]
    # q, k, v as views of one (B, S, 3, H, D) projection: rows 3 * H * D apart
    qkv = torch.zeros(2, 10, 3, 4, 32, dtype=F16, device=device)
    desc = row_descriptor(qkv[:, :, 1])
    assert desc is not None and desc.shape == [20, 128] and desc.strides == [384, 1]
    packed = torch.zeros(17, 2, 16, dtype=F32, device=device)  # varlen (total, H, D)
    assert row_descriptor(packed).shape == [17, 32]


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda d: torch.zeros(2, 8, 2, 40, dtype=F16, device=d), "head dim 40 is not a power of two"),
        (lambda d: torch.zeros(2, 9, 2, 16, dtype=F16, device=d)[:, :8], "batches not end to end"),
        (lambda d: torch.zeros(1, 2, 8, 16, dtype=F16, device=d).transpose(1, 2), "heads outside a row"),
        (lambda d: torch.zeros(8 * 2 * 16 + 1, dtype=F16, device=d)[1:].view(1, 8, 2, 16), "misaligned"),
    ],
    ids=["headdim40", "batch-stride", "bhsd-transposed", "misaligned"],
)
def test_pointer_path_where_a_descriptor_cannot_serve(make, why, device):
    assert row_descriptor(make(device)) is None, why


def test_switch_turns_descriptors_off(monkeypatch, device):
    monkeypatch.setattr(common, "USE_TMA", False)
    assert row_descriptor(torch.zeros(1, 8, 2, 16, dtype=F16, device=device)) is None


def _grads(fn, inputs):
    out, lse = fn(*inputs)
    torch.manual_seed(0)  # the same upstream gradient for both paths
    grads = torch.autograd.grad(out, inputs, torch.randn_like(out))
    return out, lse, *grads


# (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, causal, window): odd lengths so boxes run
# past every sequence's end into the next batch's rows
CASES = [
    (F32, 3, 37, 45, 4, 2, 32, True, None),
    (F16, 2, 50, 33, 2, 1, 16, True, (7, 3)),
    (F32, 2, 19, 70, 2, 2, 64, False, None),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="bit equality holds in the interpreter's arithmetic")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-b{c[1]}-q{c[2]}-k{c[3]}-d{c[6]}")
def test_descriptor_and_pointer_paths_agree_bit_for_bit(case, monkeypatch, device):
    dtype, b, sq, sk, h, hk, d, causal, window = case
    torch.manual_seed(sq + sk)
    q = randn(b, sq, h, d, dtype=dtype, device=device)
    k, v = (randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2))
    assert row_descriptor(q) is not None and row_descriptor(k) is not None

    def fn(q, k, v):
        return flash_attention(q, k, v, causal=causal, window=window, return_lse=True)

    with_tma = _grads(fn, [q, k, v])
    monkeypatch.setattr(common, "USE_TMA", False)
    pointers = _grads(fn, [q, k, v])
    for name, a, p in zip(("out", "lse", "dq", "dk", "dv"), with_tma, pointers, strict=True):
        assert torch.equal(a, p), f"{name} differs between the descriptor and pointer paths"


@pytest.mark.skipif(torch.cuda.is_available(), reason="bit equality holds in the interpreter's arithmetic")
def test_varlen_descriptor_and_pointer_paths_agree_bit_for_bit(monkeypatch, device):
    lq, lk = [5, 0, 35, 1], [7, 3, 50, 1]
    cu_q = torch.tensor([0, 5, 5, 40, 41], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 7, 10, 60, 61], dtype=torch.int32, device=device)
    torch.manual_seed(7)
    q = randn(sum(lq), 4, 32, dtype=F16, device=device)
    k, v = (randn(sum(lk), 2, 32, dtype=F16, device=device) for _ in range(2))

    def fn(q, k, v):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True, return_lse=True)

    with_tma = _grads(fn, [q, k, v])
    monkeypatch.setattr(common, "USE_TMA", False)
    pointers = _grads(fn, [q, k, v])
    for name, a, p in zip(("out", "lse", "dq", "dk", "dv"), with_tma, pointers, strict=True):
        assert torch.equal(a, p), f"{name} differs between the descriptor and pointer paths"
