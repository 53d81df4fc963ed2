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


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-1.0), "temperature=-1.0 must be finite and >= 0"),
        (dict(temperature=float("nan")), "temperature=nan must be finite"),
        (dict(top_k=0), "top_k=0 must be >= 1, or None"),  # was a shape error inside topk
        (dict(max_new_tokens=-2), "max_new_tokens=-2 must be >= 0"),  # was a negative-size tensor
        (dict(idx=torch.zeros(1, 0)), r"idx must be token ids \(batch, T >= 1\)"),  # an empty prompt
    ],
)
def test_bad_sampling_settings_fail_clearly(kwargs, match):
    model = GPT(
        GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, max_seq_len=20, attention="reference")
    )
    args = dict(idx=torch.zeros(2, 3, dtype=torch.long), max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=match):
        generate(model, args.pop("idx"), args.pop("max_new_tokens"), **args)


def _checkpoint(run_dir, overrides, model, tokenizer):
    """A checkpoint whose meta is what the trainer writes for a run of `overrides`."""
    from dataclasses import asdict

    from flashtrain import checkpoint as ckpt
    from flashtrain.config import compose_config

    cfg = compose_config(overrides)
    meta = {"step": 1, "model": asdict(cfg.model), "tokenizer": tokenizer, "config": asdict(cfg)}
    return ckpt.save_checkpoint(str(run_dir), 1, model, {}, meta)


@pytest.mark.parametrize("experiment", ["pathfinder32", "listops"])
def test_generate_refuses_a_classification_run(tmp_path, capsys, experiment):
    """An LRA run's checkpoint failed with "model.vocab_size is unset" while building a GPT from it;
    the command now says that generation needs a language-model run, before building anything."""
    from flashtrain.generate import main
    from flashtrain.models.classifier import ClassifierConfig, SequenceClassifier

    overrides = [f"experiment=lra/{experiment}", "debug=lra_cpu"]
    model = SequenceClassifier(ClassifierConfig(encoder=GPTConfig(causal=False, vocab_size=16, n_layer=1)))
    kind = "listops" if experiment == "listops" else "pathfinder"
    _checkpoint(tmp_path, overrides, model, f"lra-{kind}")
    for run in (str(tmp_path), f"{tmp_path}/checkpoints/step_0000001"):  # a run, or one checkpoint
        with pytest.raises(SystemExit):
            main(["--run", run, "--device", "cpu"])
        err = capsys.readouterr().err
        assert f"task.kind={kind} run" in err and "generation needs a language-model run" in err


def test_generate_samples_from_a_language_model_run(tmp_path, capsys):
    from flashtrain.generate import main

    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=320, max_seq_len=32, attention="reference")
    overrides = ["debug=cpu", "model.n_layer=1", "model.d_model=16", "model.vocab_size=320"]
    overrides += ["model.max_seq_len=32", "model.attention=reference"]
    _checkpoint(tmp_path, overrides, GPT(cfg), "byte")
    main(["--run", str(tmp_path), "--prompt", "ab", "--max-new-tokens", "4", "--device", "cpu"])
    assert capsys.readouterr().out.startswith("ab")
