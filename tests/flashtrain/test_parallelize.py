"""Transforms applied from outside the model: activation checkpointing recomputes what the forward ran."""

import threading

import pytest
import torch

from flashtrain.models.attention import attention_override, reference_attention
from flashtrain.models.gpt import GPT, GPTConfig
from flashtrain.parallelize import apply_ac


def _override(q, k, v, **kw):
    """Stands in for the ring: an attention the model's own backend cannot be mistaken for."""
    return reference_attention(q, k, v, **{**kw, "softmax_scale": 0.7})


def _grads_in_thread(loss, params) -> list[torch.Tensor]:
    """autograd.grad on a fresh thread: the backward of CUDA tensors runs on autograd's device
    threads (CPU backward runs on the caller's), which do not inherit the caller's context."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(grads=torch.autograd.grad(loss, params)))
    worker.start()
    worker.join()
    return list(result["grads"])


@pytest.mark.parametrize("backward", ["on_another_thread", "after_the_override_ends"])
def test_checkpointed_blocks_recompute_with_the_forwards_attention_override(backward):
    """The sp=2 GPU runs with activation checkpointing stopped on gradients of 1e23: the recompute in
    the backward did not see the ring override and attended locally on the shard."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, vocab_size=97, max_seq_len=64, attention="reference")
    model = GPT(cfg)
    params = list(model.parameters())
    idx = torch.randint(0, cfg.vocab_size, (2, 24))
    with attention_override(_override):
        expected = torch.autograd.grad(model(idx, idx), params)
    apply_ac(model)
    with attention_override(_override):
        loss = model(idx, idx)
        if backward == "on_another_thread":
            grads = _grads_in_thread(loss, params)
    if backward == "after_the_override_ends":
        grads = torch.autograd.grad(loss, params)
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e)


def _grads(cfg, state, idx, transform):
    torch._dynamo.reset()
    model = GPT(cfg).to(idx.device)
    model.load_state_dict(state)
    transform(model)
    torch.manual_seed(1)  # the same dropout draws for every variant
    return torch.autograd.grad(model(idx, idx), list(model.parameters()))


def test_checkpointed_blocks_are_compiled_around_a_graph_break(device):
    """With activation checkpointing and compile, an eager attention (the block-sparse launcher is
    `torch.compiler.disable`d) breaks the block's graph; the pieces around it must still compile
    (compiling the checkpointed block left all of it eager: only ATen kernels in Path-X's profile, when
    the dense kernel broke graphs too). Gradients equal those of compiled blocks without checkpointing."""
    from torch._dynamo.utils import counters

    from flashtrain.parallelize import apply_compile

    torch.manual_seed(0)
    cfg = GPTConfig(
        n_layer=2, n_head=2, d_model=32, vocab_size=97, max_seq_len=64, attention="block_sparse",
        block_sparse_block=16, dropout=0.2,
    )  # fmt: skip
    idx = torch.randint(0, cfg.vocab_size, (2, 32), device=device)
    state = GPT(cfg).state_dict()
    expected = _grads(cfg, state, idx, apply_compile)

    def compiled_checkpoint(model):  # the old order: compile sees the checkpoint
        apply_ac(model)
        apply_compile(model)

    counters.clear()
    _grads(cfg, state, idx, compiled_checkpoint)
    assert counters["aot_autograd"]["total"] == 0  # nothing compiled: the whole block ran eagerly
    counters.clear()
    grads = _grads(cfg, state, idx, lambda model: apply_ac(model, compile_blocks=True))
    assert counters["aot_autograd"]["total"] > 0
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)
    torch._dynamo.reset()


def test_triton_attention_compiles_without_graph_breaks_and_checkpoints(device):
    """The dense Triton attention is a pair of torch operators: a compiled block is one graph.
    Checkpointed, the recompute in the backward draws the forward's attention-dropout masks (the seed
    comes from the CPU generator, whose state the checkpoint restores): gradients equal those without
    checkpointing."""
    from torch._dynamo.utils import counters

    from flashtrain.parallelize import apply_compile

    torch.manual_seed(0)
    cfg = GPTConfig(
        n_layer=2, n_head=2, d_model=32, vocab_size=97, max_seq_len=64, attention="triton", dropout=0.2,
        attn_dropout=0.3,
    )  # fmt: skip
    idx = torch.randint(0, cfg.vocab_size, (2, 32), device=device)
    state = GPT(cfg).state_dict()
    counters.clear()
    expected = _grads(cfg, state, idx, apply_compile)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["aot_autograd"]["total"] > 0
    grads = _grads(cfg, state, idx, lambda model: apply_ac(model, compile_blocks=True))
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)
    torch._dynamo.reset()
