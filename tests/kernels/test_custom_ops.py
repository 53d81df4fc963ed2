"""The dense FlashAttention path as torch operators: torch.compile traces a model through it without
a graph break, with the same outputs and gradients as eager, and the ops pass torch's own checks
(schema, fake tensors)."""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels import flash_attention, flash_attention_qkvpacked, flash_attention_varlen


def _inputs(device, dtype=torch.float32, batch=2, seqlen=33, nheads=4, nheads_kv=2, headdim=16):
    q = torch.randn(batch, seqlen, nheads, headdim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen, nheads_kv, headdim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen, nheads_kv, headdim, device=device, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal,window,padded", [(True, None, False), (False, (5, 3), True)])
def test_compiled_fullgraph_matches_eager(causal, window, padded, device):
    q, k, v = _inputs(device)
    mask = None
    if padded:
        mask = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=device)
        mask[0, -7:] = False

    def attend(q, k, v):
        out, lse = flash_attention(
            q, k, v, causal=causal, window=window, key_padding_mask=mask, return_lse=True
        )
        return (out * 2).sum(dim=-1), lse  # ops on both sides of the kernel, as in a model

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)  # fullgraph: a break raises
    out_c, lse_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(out_c.sum() + lse_c.sum(), (q, k, v))  # lse's gradient too
    out_e, lse_e = attend(q, k, v)
    grads_e = torch.autograd.grad(out_e.sum() + lse_e.sum(), (q, k, v))
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close(lse_c, lse_e)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(gc, ge)


def test_compiled_dropout_uses_the_forwards_mask_in_the_backward(device):
    """The seed drawn inside the forward op reaches the backward op: compiled and eager runs from the
    same torch seed give the same dropped outputs and gradients."""
    q, k, v = _inputs(device)
    attend = lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=0.3)  # noqa: E731
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    torch.manual_seed(7)
    out_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(out_c.sum(), (q, k, v))
    torch.manual_seed(7)
    out_e = attend(q, k, v)
    grads_e = torch.autograd.grad(out_e.sum(), (q, k, v))
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(gc, ge)


def test_opcheck_forward_and_backward_ops(device):
    """The operators themselves carry no autograd (that is `_FlashAttnFunc`), so they are checked on
    inputs that do not require grad."""
    q, k, v = (t.detach() for t in _inputs(device, seqlen=17))
    fwd = torch.ops.flashtrain.flash_attn_fwd.default
    torch.library.opcheck(fwd, (q, k, v, None, None, None, 0, 0, 0.25, None, 0, 0.0))
    out, lse2, seed = fwd(q, k, v, None, None, None, 0, 0, 0.25, None, 0, 0.0)
    dout = torch.randn_like(out)
    bwd_args = (
        dout,
        q,
        k,
        v,
        out,
        lse2,
        None,
        None,
        None,
        0,
        0,
        0.25,
        None,
        0,
        0.0,
        seed,
        False,
    )
    bwd = torch.ops.flashtrain.flash_attn_bwd.default
    torch.library.opcheck(bwd, bwd_args)
    torch.library.opcheck(bwd, (*bwd_args, torch.randn_like(lse2)))  # with lse's gradient


def test_compiled_qkvpacked_fullgraph_matches_eager(device):
    """The packed path as a model calls it: projection output viewed as heads, one op per direction."""
    torch.manual_seed(4)
    x = torch.randn(2, 33, 32, device=device, requires_grad=True)
    w = torch.randn(4 * 16 * 2, 32, device=device, requires_grad=True)  # 4 query heads, 2 kv heads, d16

    def attend(x, w):
        qkv = (x @ w.t()).view(2, 33, 8, 16)
        return flash_attention_qkvpacked(qkv, nheads_kv=2, causal=True).sum(dim=-1)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    out_c = compiled(x, w)
    grads_c = torch.autograd.grad(out_c.sum(), (x, w))
    out_e = attend(x, w)
    grads_e = torch.autograd.grad(out_e.sum(), (x, w))
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(gc, ge)


def test_opcheck_qkvpacked_backward_op(device):
    qkv = torch.randn(2, 17, 8, 16, device=device)
    q, k, v = qkv.split([4, 2, 2], dim=2)
    out, lse2, seed = torch.ops.flashtrain.flash_attn_fwd.default(
        q, k, v, None, None, None, 0, 0, 0.25, None, 0, 0.0
    )
    args = (torch.randn_like(out), qkv, 2, out, lse2, None, 0.25, None, 0, 0.0, seed, False)
    bwd = torch.ops.flashtrain.flash_attn_bwd_qkvpacked.default
    torch.library.opcheck(bwd, args)
    torch.library.opcheck(bwd, (*args, torch.randn_like(lse2)))


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_forward_seed_output_stays_off_the_host_without_dropout(dropout_p, device):
    """The forward's seed output: a CPU scalar the backward reads with dropout; without dropout an
    empty tensor on q's device, so a compiled block has no CPU output to cut its CUDA graphs at."""
    q, k, v = (t.detach() for t in _inputs(device, seqlen=9))
    args = (q, k, v, None, None, None, 0, 0, 0.25, None, 0, dropout_p)
    fwd = torch.ops.flashtrain.flash_attn_fwd.default
    torch.library.opcheck(fwd, args, test_utils=("test_schema", "test_faketensor"))
    _, _, seed = fwd(*args)
    if dropout_p:
        assert seed.device.type == "cpu" and seed.shape == ()
    else:
        assert seed.device == q.device and seed.numel() == 0


def test_inference_calls_skip_autograd_with_the_same_results(device, monkeypatch):
    """Where no gradient can flow (no_grad, or no input requiring one) the forward's launcher runs directly,
    without the autograd Function and the op: bitwise the results of the differentiable call, for the dense,
    packed and varlen forms; under torch.compile the op stays (a fullgraph trace under no_grad)."""
    fa = importlib.import_module("kernels.flash_attention")  # (the module; the package exports the function)
    torch.manual_seed(5)
    q, k, v = _inputs(device)
    mask = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=device)
    mask[1, -9:] = False
    qkv = torch.cat([q, k, v], dim=2).detach().requires_grad_()
    cu = torch.tensor([0, 20, 33], dtype=torch.int32, device=device)
    kw = dict(causal=True, return_lse=True)
    calls = {
        "dense": lambda q, k, v, qkv: flash_attention(q, k, v, key_padding_mask=mask, window=(9, None), **kw),
        "packed": lambda q, k, v, qkv: flash_attention_qkvpacked(qkv, nheads_kv=2, **kw),
        "varlen": lambda q, k, v, qkv: flash_attention_varlen(q[0], k[0], v[0], cu, cu, 20, 20, **kw),
    }
    trained = {name: call(q, k, v, qkv) for name, call in calls.items()}  # (through the Function)
    assert all(out.grad_fn is not None for out, _ in trained.values())

    def refuse(*args):
        raise AssertionError("an inference call went through the autograd Function")

    monkeypatch.setattr(fa._FlashAttnFunc, "apply", refuse)
    detached = [t.detach() for t in (q, k, v, qkv)]
    for name, call in calls.items():
        with torch.no_grad():
            got = call(q, k, v, qkv)
        no_inputs_grad = call(*detached)  # grad mode on, nothing requiring a gradient
        for result in (got, no_inputs_grad):
            assert all(torch.equal(a, b.detach()) for a, b in zip(result, trained[name], strict=True)), name
    with pytest.raises(AssertionError, match="autograd Function"):
        calls["dense"](q, k, v, qkv)  # a differentiable call still takes it
    monkeypatch.undo()

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True) * 2

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)  # (a graph break raises)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), attend(q, k, v))
