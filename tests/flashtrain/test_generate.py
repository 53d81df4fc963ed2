"""Generation with the KV cache gives what full recomputation gives."""

import pytest
import torch

from flashtrain.generate import generate
from flashtrain.models.gpt import GPT, GPTConfig


@pytest.mark.parametrize("pos", ["learned", "rotary"])
@pytest.mark.parametrize("window", [None, 6])
def test_cached_greedy_equals_recompute(pos, window):
    torch.manual_seed(0)
    cfg = GPTConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=32,
        vocab_size=50,
        max_seq_len=40,
        pos_embedding=pos,
        window=window,
        attention="reference",
    )
    model = GPT(cfg).double()
    prompt = torch.randint(0, 50, (3, 7))
    out = generate(model, prompt, 12, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(12):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_sampling_is_seeded_and_bounded():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, max_seq_len=20, attention="reference")
    )
    prompt = torch.zeros(2, 3, dtype=torch.long)
    a = generate(model, prompt, 8, top_k=5, generator=torch.Generator().manual_seed(1))
    b = generate(model, prompt, 8, top_k=5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (2, 11)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, prompt, 30)
