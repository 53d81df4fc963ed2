"""Fused vocabulary projection + cross-entropy (`kernels.linear_cross_entropy`) against plain autograd.

The per-row kernel runs through the Triton interpreter here (CUDA on the GPU machine); the whole op
(chunks, gradients made in the forward, autocast) is compared with `linear_cross_entropy_reference`
in float64 under the flash-attention tolerance rule.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import linear_cross_entropy
from kernels.cross_entropy import cross_entropy_rows_
from kernels.reference import linear_cross_entropy_reference
from tests.kernels._flash_utils import assert_close_rule


def _targets(rows, vocab, device, ignore_every=3):
    targets = torch.randint(0, vocab, (rows,), device=device)
    targets[::ignore_every] = -100  # some ignored rows (padding, prompt tokens)
    return targets


@pytest.mark.parametrize("rows,vocab", [(1, 1), (5, 37), (9, 130), (3, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("use_triton", [True, False], ids=["triton", "torch"])
def test_rows_loss_and_gradient(rows, vocab, dtype, use_triton, device):
    logits = torch.randn(rows, vocab, device=device, dtype=dtype) * 4
    targets = _targets(rows, vocab, device)
    grad = logits.clone()
    losses = cross_entropy_rows_(grad, targets, use_triton=use_triton)
    assert_rows_match_reference(losses, grad, logits, targets)


@pytest.mark.parametrize(
    "tiling",
    [dict(BLOCK_V=64, GROUP=1), dict(BLOCK_V=32, GROUP=8), dict(BLOCK_V=16, GROUP=16)],
    ids=["per-logit", "group8", "one-group"],
)
def test_rows_kernel_tilings(tiling, device):
    """Every grouping of the running max gives the same softmax: one running max per logit, groups of
    8, and one group per block; a vocabulary that ends inside a group and inside a block."""
    rows, vocab = 6, 75
    logits = (torch.randn(rows, vocab, device=device) * 4).half()
    logits[0] -= 30000.0  # a row far below zero: the first pass's max must move down from its start
    targets = _targets(rows, vocab, device)
    grad = logits.clone()
    losses = cross_entropy_rows_(grad, targets, use_triton=True, tiling=dict(**tiling, num_warps=1))
    assert_rows_match_reference(losses, grad, logits, targets)


def assert_rows_match_reference(losses, grad, logits, targets):
    """Per-row losses and the overwritten logits against float64 autograd, under the tolerance rule
    (PyTorch's own fp32 softmax of the same low-precision logits sets the scale)."""
    dtype = logits.dtype
    ref = logits.double().requires_grad_()
    ref_losses = F.cross_entropy(ref, targets, reduction="none")
    (ref_grad,) = torch.autograd.grad(ref_losses.sum(), ref)
    lp = logits.float().requires_grad_()
    lp_losses = F.cross_entropy(lp, targets, reduction="none")
    (lp_grad,) = torch.autograd.grad(lp_losses.sum(), lp)
    assert losses.dtype == torch.float32 and grad.dtype == dtype
    assert_close_rule("losses", losses, ref_losses, lp_losses, torch.float32)
    assert_close_rule("dlogits", grad, ref_grad, lp_grad.to(dtype), dtype)
    assert torch.all(grad[targets == -100] == 0) and torch.all(losses[targets == -100] == 0)


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_cross_entropy_matches_autograd(chunk, dtype, device):
    tokens, width, vocab = 23, 16, 50
    hidden = torch.randn(tokens, width, device=device, dtype=dtype, requires_grad=True)
    weight = (torch.randn(vocab, width, device=device, dtype=dtype) * 0.5).requires_grad_()
    targets = _targets(tokens, vocab, device)

    loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk)
    dh, dw = torch.autograd.grad(loss * 0.5, (hidden, weight))  # a non-unit upstream gradient

    ins64 = [x.detach().double().requires_grad_() for x in (hidden, weight)]
    inslp = [x.detach().clone().requires_grad_() for x in (hidden, weight)]
    ref64 = linear_cross_entropy_reference(*ins64, targets)
    reflp = linear_cross_entropy_reference(*inslp, targets)
    g64 = torch.autograd.grad(ref64 * 0.5, ins64)
    glp = torch.autograd.grad(reflp * 0.5, inslp)
    assert loss.dtype == torch.float32 and dh.dtype == dtype and dw.dtype == dtype
    if dtype == torch.float32:
        # one fp32 sum over the rows: its rounding is a single sample, which the reference's own
        # rounding can undercut by luck (it did, 1 run in 30), so bound it relative to the sum
        torch.testing.assert_close(loss.double(), ref64.detach(), rtol=2e-6, atol=1e-5)
    else:
        assert_close_rule("loss", loss, ref64, reflp, dtype)
    assert_close_rule("dhidden", dh, g64[0], glp[0], dtype)
    assert_close_rule("dweight", dw, g64[1], glp[1], dtype)


def test_autocast_projects_in_the_autocast_dtype(device):
    """fp32 weights and hidden under bf16 autocast: the projection runs in bf16 (as F.linear would),
    gradients come back in the inputs' fp32."""
    tokens, width, vocab = 19, 8, 40
    hidden = torch.randn(tokens, width, device=device, requires_grad=True)
    weight = torch.randn(vocab, width, device=device, requires_grad=True)
    targets = _targets(tokens, vocab, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets, chunk=8)
        ref = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
    dh, dw = torch.autograd.grad(loss, (hidden, weight))
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    assert dh.dtype == torch.float32 and dw.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(dh, rh, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dw, rw, rtol=2e-2, atol=2e-2)


def test_without_grad_and_frozen_weight(device):
    hidden = torch.randn(10, 8, device=device, requires_grad=True)
    weight = torch.randn(30, 8, device=device)  # frozen: no weight gradient is built
    targets = _targets(10, 30, device)
    ref = linear_cross_entropy_reference(hidden.double(), weight.double(), targets)
    with torch.no_grad():
        # fp32 against float64: fp32's tolerance (float64's own would fail on rounding alone)
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, chunk=4), ref.float())
    loss = linear_cross_entropy(hidden, weight, targets, chunk=4)
    (dh,) = torch.autograd.grad(loss, hidden)
    (rh,) = torch.autograd.grad(linear_cross_entropy_reference(hidden, weight, targets), hidden)
    torch.testing.assert_close(dh, rh, rtol=1e-4, atol=1e-5)


def test_all_targets_ignored_gives_zero_loss_and_gradients(device):
    hidden = torch.randn(6, 8, device=device, requires_grad=True)
    weight = torch.randn(12, 8, device=device, requires_grad=True)
    targets = torch.full((6,), -100, device=device)
    loss = linear_cross_entropy(hidden, weight, targets)
    dh, dw = torch.autograd.grad(loss, (hidden, weight))
    assert loss.item() == 0.0 and not dh.any() and not dw.any()


@pytest.mark.parametrize(
    "hidden_shape,weight_shape,target_shape,chunk,match",
    [
        ((4, 8, 2), (10, 8), (4,), 4, "hidden must be a 2-d tensor \\(tokens, width\\)"),
        ((4, 8), (10, 6), (4,), 4, "hidden \\(tokens, width\\)"),
        ((4, 8), (10, 8), (5,), 4, "targets must be"),
        ((4, 8), (10, 8), (4,), 0, "chunk=0"),
        ((4, 8), (10, 8), (4,), 2.5, "chunk=2.5 must be an int"),
        ((4, 8), (10, 8), (4,), True, "chunk=True must be an int"),
        ((4, 8), (10, 8), (4,), None, "chunk=None must be an int"),
    ],
)
def test_bad_shapes_raise(hidden_shape, weight_shape, target_shape, chunk, match):
    hidden, weight = torch.randn(hidden_shape), torch.randn(weight_shape)
    targets = torch.zeros(target_shape, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(hidden, weight, targets, chunk=chunk)


def test_bad_targets_raise():
    hidden, weight = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(ValueError, match="targets must be int64 or int32"):
        linear_cross_entropy(hidden, weight, torch.zeros(4))
    with pytest.raises(ValueError, match="targets must be a torch.Tensor"):
        linear_cross_entropy(hidden, weight, [0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 10\)"):
        linear_cross_entropy(hidden, weight, torch.tensor([0, 1, 10, -100]))


@pytest.mark.parametrize("ignore_index", [1.5, None, "pad", True])
def test_ignore_index_must_be_an_int(ignore_index):
    """A float ignore_index matched no target and ignored nothing, silently; None raised torch's error."""
    hidden, weight, targets = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match="ignore_index must be an int"):
        linear_cross_entropy(hidden, weight, targets, ignore_index=ignore_index)


@pytest.mark.parametrize("which", ["hidden", "weight"])
def test_integer_hidden_or_weight_raises(which):
    """An int64 hidden ran the projection as an integer matmul and returned a number."""
    tensors = {"hidden": torch.randn(4, 8), "weight": torch.randn(10, 8)}
    tensors[which] = tensors[which].long()
    with pytest.raises(ValueError, match=f"{which} must be a floating-point tensor, got torch.int64"):
        linear_cross_entropy(tensors["hidden"], tensors["weight"], torch.tensor([0, 1, 2, 3]))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,vocab", [(4096, 50304), (1000, 32003)])
def test_gpu_bf16_matches_autocast_linear(tokens, vocab):
    """The GPU path at a language model's size, under bf16 autocast as the trainer runs it."""
    torch.manual_seed(0)
    width = 768
    hidden = torch.randn(tokens, width, device="cuda", requires_grad=True)
    weight = (torch.randn(vocab, width, device="cuda") * 0.02).requires_grad_()
    targets = _targets(tokens, vocab, "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets, chunk=1024)
        ref = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
    dh, dw = torch.autograd.grad(loss, (hidden, weight))
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    ins64 = [x.detach().double().requires_grad_() for x in (hidden, weight)]
    ref64 = linear_cross_entropy_reference(*ins64, targets)
    g64 = torch.autograd.grad(ref64, ins64)
    assert_close_rule("loss", loss, ref64, ref, torch.bfloat16)
    assert_close_rule("dhidden", dh, g64[0], rh, torch.bfloat16)
    assert_close_rule("dweight", dw, g64[1], rw, torch.bfloat16)
