"""The ring's per-step adapter: the dropout-aware reference backward, the global-coordinate dropout
hash, and the Triton launchers with the signed windows the ring produces."""

import pytest
import torch

from flashtrain.distributed.local_attention import (
    PositionMask,
    dropout_keep_mask,
    local_backward,
    local_forward,
)
from kernels.reference import attention_reference


def _qkv(seqlen_q, seqlen_k, nheads, nheads_kv, dtype=torch.float64, headdim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, nheads, headdim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(2, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64).to(dtype)
    dout = torch.randn(2, seqlen_q, nheads, headdim, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, dout


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, (-2, 6))])
@pytest.mark.parametrize("nheads_kv", [4, 2])
def test_dropout_backward_matches_autograd(causal, window, nheads_kv):
    q, k, v, dout = _qkv(9, 12, 4, nheads_kv)
    mask = PositionMask(torch.arange(30, 39), torch.arange(5, 17), dropout_p=0.3, dropout_seed=1234)
    out, lse = local_forward(q, k, v, causal=causal, softmax_scale=0.3, window=window, mask=mask)
    grads = local_backward(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=0.3, window=window, mask=mask
    )
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    drop = dropout_keep_mask(1234, 2, torch.arange(4), mask.q_pos, mask.k_pos, 0.3)
    ref = attention_reference(qr, kr, vr, causal=causal, softmax_scale=0.3, window=window, dropout_p=0.3,
                              dropout_mask=drop)  # fmt: skip
    ref.backward(dout)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_dropout_mask_is_global_and_unbiased():
    pos = torch.arange(64)
    full = dropout_keep_mask(7, 2, torch.arange(3), pos, pos, 0.25)
    # any sub-block drawn with its global coordinates is the same block of the full mask
    part = dropout_keep_mask(7, 2, torch.arange(1, 3), pos[10:20], pos[40:64], 0.25)
    assert torch.equal(part, full[:, 1:3, 10:20, 40:64])
    assert abs(full.float().mean().item() - 0.75) < 0.02  # 24576 draws: 5 sigma is about 0.014
    assert not torch.equal(full, dropout_keep_mask(8, 2, torch.arange(3), pos, pos, 0.25))


# windows as the ring produces them for one shard against another: shifted and signed
_WINDOWS = [
    (False, None),
    (True, None),
    (True, (3, None)),
    (False, (-3, 9)),
    (False, (6, -2)),
    (False, (None, 2)),
]


@pytest.mark.parametrize("causal,window", _WINDOWS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(16, 16), (16, 32)])
def test_triton_backend_matches_reference(causal, window, seqlen_q, seqlen_k):
    pytest.importorskip("triton")
    q, k, v, dout = _qkv(seqlen_q, seqlen_k, 4, 2, dtype=torch.float32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, dout = (t.to(dev) for t in (q, k, v, dout))
    kw = dict(causal=causal, softmax_scale=0.25, window=window)
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
