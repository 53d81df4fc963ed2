"""Weights move between our GPT and transformers' GPT2LMHeadModel without changing the function."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency")

from flashtrain.models import from_hf_gpt2, to_hf_gpt2  # noqa: E402


def _hf_model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=3, n_head=4, n_embd=64, vocab_size=211, n_positions=96)
    return transformers.GPT2LMHeadModel(cfg).eval(), cfg


def _our_logits(model, idx):
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.shape[1]))
    for block in model.transformer.h:
        x = block(x)
    return model.lm_head(model.transformer.ln_f(x))


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_hf_to_ours_same_logits(backend):
    hf, _ = _hf_model()
    ours = from_hf_gpt2(hf, attention=backend).eval()
    idx = torch.randint(0, 211, (2, 57))
    with torch.no_grad():
        expected = hf(idx).logits
        got = _our_logits(ours, idx)
        last = ours(idx)  # the generation path returns the last position's logits
    rel = (got - expected).norm() / expected.norm()
    assert rel <= 1e-4
    torch.testing.assert_close(last[:, -1], expected[:, -1], rtol=1e-4, atol=1e-5)


def test_ours_to_hf_round_trip():
    hf, cfg = _hf_model(seed=1)
    ours = from_hf_gpt2(hf, attention="reference").eval()
    back = transformers.GPT2LMHeadModel(cfg).eval()
    result = back.load_state_dict(to_hf_gpt2(ours), strict=False)
    assert not result.unexpected_keys
    assert all(k.endswith((".attn.bias", ".attn.masked_bias")) for k in result.missing_keys)
    idx = torch.randint(0, 211, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_state_dict_needs_head_count():
    hf, _ = _hf_model()
    with pytest.raises(ValueError, match="n_head"):
        from_hf_gpt2(hf.state_dict())
    model = from_hf_gpt2(hf.state_dict(), n_head=4, attention="reference")
    assert model.cfg.n_layer == 3 and model.cfg.vocab_size == 211


@pytest.mark.parametrize("name", ["CUDAProperties", "use_kernel_forward_from_hub"])
def test_hugging_faces_kernels_names_say_which_package_this_is(name):
    """transformers 5.25+ imports Hugging Face's `kernels` package by the import name of ours: its names give an
    ImportError that says what to change, not "cannot import name"; other missing names stay AttributeErrors."""
    import kernels

    with pytest.raises(ImportError, match=r"flashtrain's attention kernels.*transformers<5\.25"):
        exec(f"from kernels import {name}", {})
    assert not hasattr(kernels, "no_such_name") and hasattr(kernels, "flash_attention")


def test_the_installed_transformers_does_not_import_hugging_faces_kernels():
    """The dev pin (transformers<5.25): the installed transformers builds GPT-2 beside our `kernels`."""
    from transformers.utils import import_utils

    available = getattr(import_utils, "is_kernels_available", lambda: False)
    assert not available(), (
        f"transformers {transformers.__version__} imports Hugging Face's `kernels` package, which our `kernels` "
        "shadows: install transformers<5.25 and uninstall Hugging Face's kernels"
    )
