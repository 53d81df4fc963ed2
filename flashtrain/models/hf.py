"""Weights to and from Hugging Face `transformers` GPT-2 (GPT2LMHeadModel layout).

HF GPT-2 stores its linear layers as `Conv1D` with weight (in, out); ours are `nn.Linear` with
weight (out, in), so every matrix is transposed on the way in and out. Embeddings are tied in both.
"""

from __future__ import annotations

import torch

from flashtrain.models.gpt import GPT, GPTConfig

_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF buffers that carry no learned state
_HF_SKIP = (".attn.bias", ".attn.masked_bias")


def _hf_state_dict(hf_model_or_state_dict) -> dict[str, torch.Tensor]:
    if isinstance(hf_model_or_state_dict, dict):
        return hf_model_or_state_dict
    return hf_model_or_state_dict.state_dict()


def _config_from_hf_state(sd: dict[str, torch.Tensor], overrides: dict) -> GPTConfig:
    vocab, d_model = sd["transformer.wte.weight"].shape
    n_positions = sd["transformer.wpe.weight"].shape[0]
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))
    if "n_head" not in overrides:
        raise ValueError("a GPT-2 state dict does not record the head count; pass n_head=... (12 for gpt2)")
    fields = dict(n_layer=n_layer, d_model=d_model, vocab_size=vocab, max_seq_len=n_positions, bias=True)
    fields.update(overrides)
    return GPTConfig(**fields)


def from_hf_gpt2(hf_model_or_state_dict, **overrides) -> GPT:
    """Build our GPT from a `transformers` GPT2LMHeadModel (or its state dict).

    Overrides set GPTConfig fields (e.g. attention="triton"); the head count is read from the HF
    model's config when a model is given, and must be passed as n_head for a bare state dict.
    """
    hf_cfg = getattr(hf_model_or_state_dict, "config", None)
    if hf_cfg is not None:
        overrides = {"n_head": hf_cfg.n_head, **overrides}
        if getattr(hf_cfg, "activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"only GPT-2's tanh GELU is supported, not {hf_cfg.activation_function!r}")
    sd = _hf_state_dict(hf_model_or_state_dict)
    cfg = _config_from_hf_state(sd, overrides)
    if cfg.pos_embedding != "learned" or cfg.kv_heads != cfg.n_head:
        raise ValueError("GPT-2 weights need pos_embedding='learned' and n_kv_head == n_head")
    model = GPT(cfg)
    ours = {}
    for key, value in sd.items():
        if key.endswith(_HF_SKIP) or key == "lm_head.weight":
            continue
        ours[key] = value.t() if key.endswith(_TRANSPOSED) else value
    ours["lm_head.weight"] = ours["transformer.wte.weight"]
    missing, unexpected = model.load_state_dict(ours, strict=False)
    missing = [k for k in missing if not k.startswith("rotary")]
    if missing or unexpected:
        raise ValueError(f"GPT-2 state dict does not match: missing {missing}, unexpected {unexpected}")
    return model


def to_hf_gpt2(model: GPT) -> dict[str, torch.Tensor]:
    """Our GPT's weights as a `transformers` GPT2LMHeadModel state dict (load with strict=False:
    HF's causal-mask buffers are not weights)."""
    cfg = model.cfg
    if cfg.pos_embedding != "learned" or cfg.kv_heads != cfg.n_head or not cfg.bias:
        raise ValueError("only GPT-2-shaped models (learned positions, no GQA, biases) convert to GPT-2")
    sd = {}
    for key, value in model.state_dict().items():
        sd[key] = value.t().contiguous() if key.endswith(_TRANSPOSED) else value
    return sd
