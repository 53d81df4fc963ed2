"""Dropout inside the attention kernels: Philox masks regenerated from (seed, position), never stored.

`kernels.reference.dropout_mask` draws, in torch, the mask the kernels draw (checked bit for bit below),
so the reference can be given the exact mask and forward and backward compared with it.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import flash_attention, flash_attention_varlen
from kernels._common import DROPOUT_ANY_OFFSET, DROPOUT_ON_SPANS, draw_seed, dropout_keep, dropout_keep_tile
from kernels._flash_bwd import flash_attn_backward
from kernels._flash_fwd import flash_attn_forward
from kernels.flash_attention import dropout_mask
from kernels.reference import attention_backward_reference, attention_reference, dropout_keep_reference
from tests.kernels._flash_utils import check_against_reference, randn

F16, F32 = torch.float16, torch.float32


@triton.jit
def _keep_kernel(
    out_ptr, tile_ptr, seed, row0, col0, p, block_m: tl.constexpr, block_n: tl.constexpr, mode: tl.constexpr
):
    """Both draws of one tile: entry by entry (the definition) and as the kernels draw it (8 entries a call)."""
    rows = row0 + tl.arange(0, block_m).to(tl.int64)
    offs_n = tl.arange(0, block_n)
    offs = tl.arange(0, block_m)[:, None] * block_n + offs_n[None, :]
    keep = dropout_keep(seed, rows[:, None], col0 + offs_n[None, :], p)
    tl.store(out_ptr + offs, keep.to(tl.int8))
    tl.store(tile_ptr + offs, dropout_keep_tile(seed, rows, col0, p, block_n, mode).to(tl.int8))


# seeds at the ends of draw_seed's range (1 becomes a constexpr in Triton) and past 2^32, row ids past 2^32,
# tiles starting off a 32-column span (a tile then straddles spans), columns past 2^32; tiles 64 wide and
# 16 wide (narrower than a span: always picked out of one)
@pytest.mark.parametrize(
    "seed,row0,col0,p",
    [
        (0, 0, 0, 0.3),
        (1, 17, 5, 0.9),
        (123456789, 5_000_000_000, 1 << 20, 0.5),
        (2**31 - 2, 2**40 + 7, 3, 0.1),
        (2**40 + 3, 99, 0, 0.5),  # a seed with a high word: both key words
        (77, 3, 1022, 0.5),
        (78, 2**32 - 1, 2**34 + 1, 0.2),
    ],
)
@pytest.mark.parametrize("block_n", [64, 16])
def test_kernel_philox_is_the_torch_philox_bit_for_bit(seed, row0, col0, p, block_n, device):
    rows = torch.arange(row0, row0 + 32, device=device)[:, None]
    want = dropout_keep_reference(seed, rows, torch.arange(col0, col0 + block_n, device=device), p)
    # a kernel told its tiles start on 32-column spans leaves out the path for tiles that do not
    modes = [DROPOUT_ANY_OFFSET, *([DROPOUT_ON_SPANS] if col0 % 32 == 0 else [])]
    for mode in modes:
        out, tile = (torch.empty(32, block_n, dtype=torch.int8, device=device) for _ in range(2))
        _keep_kernel[(1,)](out, tile, seed, row0, col0, p, block_m=32, block_n=block_n, mode=mode.value)
        assert torch.equal(out.bool(), want)
        assert torch.equal(tile.bool(), want), f"mode {mode.value}"


def test_mask_has_no_visible_structure():
    """Neighbouring entries (along rows, columns, heads, batch) and nearby seeds are independent draws:
    with p = 0.5 two independent entries agree half the time. Columns 1 and 8 apart share a Philox call
    (two halves of a word; two words), 2 apart do not."""
    m = dropout_mask(7, 2, 4, 128, 256, 0.5, "cpu")  # 262k draws: 5 sigma of an agreement rate ~0.005
    assert abs(m.float().mean().item() - 0.5) < 0.005
    for a, b in [
        *((m[..., lag:], m[..., :-lag]) for lag in (1, 2, 8, 16)),
        (m[..., 1:, :], m[..., :-1, :]),
        (m[:, 1:], m[:, :-1]),
        (m[1], m[0]),
    ]:
        assert abs((a == b).float().mean().item() - 0.5) < 0.01
    assert abs((m == dropout_mask(8, 2, 4, 128, 256, 0.5, "cpu")).float().mean().item() - 0.5) < 0.005


def test_keep_rate_and_seed_dependence(device):
    p = 0.2
    m1 = dropout_mask(123, 2, 4, 64, 256, p, device)
    assert m1.shape == (2, 4, 64, 256)
    assert abs(m1.float().mean().item() - (1 - p)) < 0.01  # 131k draws: std of the mean ~0.001
    assert torch.equal(m1, dropout_mask(123, 2, 4, 64, 256, p, device))
    assert not torch.equal(m1, dropout_mask(124, 2, 4, 64, 256, p, device))


def _check_with_the_kernels_mask(dtype, b, sq, sk, h, hk, d, causal, device, lse_grad=False):
    """The kernel against the reference given the mask the kernel drew, gradients included (so the
    backward must regenerate that mask)."""
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

    check_against_reference(kernel, ref, [q, k, v], dtype, lse_grad=lse_grad)


@pytest.mark.parametrize("split_dkdv", [False, True], ids=["dkdv", "dv-then-dk"])
@pytest.mark.parametrize(
    "dtype, b, sq, sk, h, hk, d, causal",
    [(F32, 2, 45, 70, 2, 1, 32, True), (F16, 1, 33, 33, 4, 2, 64, False)],
)
def test_forward_and_backward_use_the_same_mask(
    dtype, b, sq, sk, h, hk, d, causal, split_dkdv, device, monkeypatch
):
    """In both passes of the wide-head backward too (forced here at small head dims)."""
    if split_dkdv:
        import kernels._flash_bwd as bwd

        monkeypatch.setattr(bwd, "SPLIT_DKDV_ABOVE", 0)
    _check_with_the_kernels_mask(dtype, b, sq, sk, h, hk, d, causal, device)


def test_lse_gradient_with_dropout(device):
    """lse is the undropped softmax's, so its gradient goes through P, not the dropped P."""
    _check_with_the_kernels_mask(F32, 2, 45, 70, 2, 1, 32, True, device, lse_grad=True)


def test_reproducible_under_manual_seed(device):
    q, k, v = (torch.randn(1, 40, 2, 32, device=device) for _ in range(3))
    outs = []
    for s in (5, 5, 6):
        torch.manual_seed(s)
        outs.append(flash_attention(q, k, v, dropout_p=0.5))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    assert not torch.equal(outs[0], flash_attention(q, k, v))


def test_varlen_single_sequence_draws_the_dense_mask(device):
    """With one sequence the varlen row ids equal the dense ones, so both paths must agree exactly."""
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


@pytest.mark.parametrize("causal", [False, True])
def test_row_and_column_offsets_draw_the_full_mask_block(causal, device):
    """The ring numbers a shard's rows and columns as the whole sequence would (`dropout_rows`): the
    kernels then drop exactly the single-process mask's block, forward and backward."""
    b, seqlen, h, hk, d, p, seed = 2, 96, 4, 2, 16, 0.3, 4321
    q0, k0, m, n = 48, 16, 24, 32  # rows [48, 72) against keys [16, 48) of the 96-token sequence
    torch.manual_seed(5)
    q = randn(b, m, h, d, dtype=F32, device=device)
    k, v = (randn(b, n, hk, d, dtype=F32, device=device) for _ in range(2))
    dout = randn(b, m, h, d, dtype=F32, device=device)
    rows = (seqlen * h, seqlen, q0, k0)  # row id (b * h_total + head) * seqlen + q0 + i, column k0 + j
    # global causality (key <= query) in the call's bottom-right aligned coordinates, as the ring does it
    right = q0 - k0 - (n - m) if causal else None
    kw = dict(sm_scale=0.25, win_left=None, win_right=right, key_padding_mask=None, dropout_p=p, seed=seed,
              dropout_rows=rows)  # fmt: skip
    out, lse2 = flash_attn_forward(q, k, v, **kw)
    block = dropout_mask(seed, b, h, seqlen, seqlen, p, device)[:, :, q0 : q0 + m, k0 : k0 + n]
    ref_kw = dict(
        softmax_scale=0.25, dropout_p=p, dropout_mask=block, window=(None, right) if causal else None
    )
    ref_out, ref_lse = attention_reference(q.double(), k.double(), v.double(), return_lse=True, **ref_kw)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    grads = flash_attn_backward(dout, q, k, v, out, lse2, **kw)
    ref_grads = attention_backward_reference(
        dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse, **ref_kw
    )
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_varlen_dropout_numbers_entries_by_packed_position(device):
    """Several packed sequences: each one's mask is the documented block of packed coordinates
    (head h, packed query r, packed key c -> Philox counter (c, h * total_q + r)), forward and backward."""
    torch.manual_seed(12)
    lens_q, lens_k, h, hk, d, p = [5, 17, 9], [7, 17, 30], 4, 2, 16, 0.3
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
    total_q, total_k = sum(lens_q), sum(lens_k)
    q = randn(total_q, h, d, dtype=F32, device=device)
    k, v = (randn(total_k, hk, d, dtype=F32, device=device) for _ in range(2))
    torch.manual_seed(4)
    seed = draw_seed()

    def kernel(q, k, v):
        torch.manual_seed(4)
        return flash_attention_varlen(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, dropout_p=p, return_lse=True
        )

    def ref(q, k, v):
        outs, lses = [], []
        for s in range(len(lens_q)):
            rq = torch.arange(int(cu_q[s]), int(cu_q[s + 1]), device=device)
            rk = torch.arange(int(cu_k[s]), int(cu_k[s + 1]), device=device)
            rows = torch.arange(h, device=device)[:, None, None] * total_q + rq[None, :, None]  # (h, m, 1)
            keep = dropout_keep_reference(seed, rows, rk, p)[None]  # (1, h, m, n)
            out, lse = attention_reference(q[None, rq], k[None, rk], v[None, rk], causal=True, dropout_p=p,
                                           dropout_mask=keep, return_lse=True)  # fmt: skip
            outs.append(out[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, 1)  # lse (h, total_q), as the varlen kernel returns it

    check_against_reference(kernel, ref, [q, k, v], F32)
