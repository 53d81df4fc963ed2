"""Generation with the KV cache gives what full recomputation gives."""

import pytest
import torch

from flashtrain.generate import DecodeStep, generate, new_caches
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
    assert torch.equal(generate(model, prompt, 12, temperature=0), _greedy_by_recompute(model, prompt, 12))


@torch.no_grad()
def _greedy_by_recompute(model, prompt, new_tokens):
    """The greedy continuation from a forward over the whole sequence for each token (no cache)."""
    seq = prompt
    for _ in range(new_tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


def _small_gpt(
    pos="rotary", window=None, n_kv_head=2, dtype=torch.float64, device="cpu", attention="reference",
    max_seq_len=48,
):  # fmt: skip
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=64, vocab_size=50, max_seq_len=max_seq_len,
                    pos_embedding=pos, window=window, attention=attention)  # fmt: skip
    return GPT(cfg).to(device, dtype).eval()


@pytest.mark.parametrize("pos, window", [("learned", None), ("rotary", None), ("rotary", 5)])
def test_a_decode_step_with_its_position_on_the_device_gives_the_eager_steps_logits(pos, window):
    """DecodeStep (what a CUDA graph captures) places each token by device-side slots and lengths; run
    eagerly it must give, step by step, the logits of the host-placed steps."""
    model = _small_gpt(pos, window)
    prompt = torch.randint(0, 50, (3, 9))
    host, device_side = new_caches(model, 3, 20), new_caches(model, 3, 20)
    with torch.no_grad():
        assert torch.equal(model(prompt, caches=host), model(prompt, caches=device_side))
        step = DecodeStep(model, device_side, capture=False)
        for _ in range(11):
            nxt = torch.randint(0, 50, (3, 1))
            expected = model(nxt, caches=host)
            assert torch.equal(step(nxt), expected)
            assert device_side[0].seqlen == host[0].seqlen
        for a, b in zip(host, device_side, strict=True):
            assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
        with pytest.raises(ValueError, match="KV cache holds 20 tokens; cannot add one more"):
            step(nxt)


def test_a_cuda_graph_off_cuda_is_refused_with_what_to_change():
    model = _small_gpt()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(
        ValueError, match="cuda_graph=True needs the prompt and model on a CUDA device, not cpu"
    ):
        generate(model, prompt, 4, cuda_graph=True)
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device, not cpu"):
        DecodeStep(model, new_caches(model, 1, 8), capture=True)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "pos, window, n_kv_head", [("learned", None, 4), ("rotary", 7, 1), ("rotary", None, 2)]
)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_gpu_generation_through_a_cuda_graph_gives_the_eager_tokens(pos, window, n_kv_head, temperature):
    """The captured step replays the eager step's kernels (flash_decode included) on the same inputs, so
    greedy and seeded sampled tokens are the same, in bf16, at batch 2 over 30 new tokens."""
    model = _small_gpt(pos, window, n_kv_head, torch.bfloat16, "cuda", attention="triton")
    prompt = torch.randint(0, 50, (2, 13), device="cuda")
    runs = [
        generate(
            model,
            prompt,
            30,
            temperature=temperature,
            top_k=20,
            cuda_graph=graph,
            generator=torch.Generator("cuda").manual_seed(3),
        )  # fmt: skip
        for graph in (False, True)
    ]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.gpu
def test_gpu_a_captured_step_replays_the_eager_logits_at_every_position():
    model = _small_gpt("rotary", 6, 2, torch.bfloat16, "cuda", attention="triton")
    prompt = torch.randint(0, 50, (3, 5), device="cuda")
    eager, graphed = new_caches(model, 3, 40), new_caches(model, 3, 40)
    with torch.no_grad():
        model(prompt, caches=eager), model(prompt, caches=graphed)
        step = DecodeStep(model, graphed, capture=True)
        for _ in range(35):
            nxt = torch.randint(0, 50, (3, 1), device="cuda")
            assert torch.equal(step(nxt), model(nxt, caches=eager))


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("route", ["flash_attention", "flash_decode"])
def test_gpu_a_prompt_prefilled_either_way_matches_the_float32_reference(monkeypatch, window, route):
    """An empty cache's prompt goes through `flash_attention` from PREFILL_FLASH_TOKENS tokens on, else
    through `flash_decode`; both give the reference's logits within bf16's error."""
    import flashtrain.generate as gen
    import kernels

    monkeypatch.setattr(gen, "PREFILL_FLASH_TOKENS", 0 if route == "flash_attention" else 10**9)
    calls = []
    kernel = getattr(kernels, route)

    def counted(*args, **kwargs):
        calls.append(route)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(kernels, route, counted)
    model = _small_gpt("rotary", window, 2, torch.bfloat16, "cuda", "triton", max_seq_len=300)
    prompt = torch.randint(0, 50, (2, 300), device="cuda")
    with torch.no_grad():
        logits = model(prompt, caches=new_caches(model, 2, 300)).float()
        reference = _small_gpt("rotary", window, 2, torch.float32, "cuda", max_seq_len=300)
        reference.load_state_dict(model.state_dict())
        expected = reference(prompt)
    assert len(calls) == model.cfg.n_layer
    assert (logits - expected).abs().max() <= 0.05 * expected.abs().max()


# (kind, its GPTConfig fields, n_kv_head): a band, a butterfly with fewer factors than its blocks allow
# (once refused at every length shorter than 8 blocks), a random layout with a pattern per head, and the
# same under GQA (flash_decode masks each head of a kv group by its own row)
BLOCK_SPARSE_MODELS = [
    ("local", dict(block_sparse_local=1), 4),
    ("butterfly", dict(block_sparse_factors=2, block_sparse_local=0), 4),
    ("random", dict(block_sparse_density=0.3), 4),
    ("random", dict(block_sparse_density=0.3), 2),
]
BLOCK_SPARSE_IDS = ["local", "butterfly", "random", "random_gqa"]


def _block_sparse_gpt(kind, fields, n_kv_head, device, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, vocab_size=50, max_seq_len=64,
               pos_embedding="rotary")  # fmt: skip
    sparse = GPT(GPTConfig(**cfg, attention="block_sparse", block_sparse_kind=kind, block_sparse_block=16,
                           **fields)).to(device, dtype).eval()  # fmt: skip
    dense = GPT(GPTConfig(**cfg, attention="reference")).to(device, dtype).eval()
    dense.load_state_dict(sparse.state_dict())
    return sparse, dense


@pytest.mark.parametrize("kind, fields, n_kv_head", BLOCK_SPARSE_MODELS, ids=BLOCK_SPARSE_IDS)
def test_a_block_sparse_model_generates_through_its_cache_what_its_forward_gives(
    kind, fields, n_kv_head, device
):
    """The cache's steps attend through the rows of the model's one layout (over max_seq_len), so every
    step's logits are those of a forward over the whole sequence so far, across row blocks (a 44-token
    prompt, 16-token blocks: the steps finish block 2 and enter block 3), whether the host places each
    step or DecodeStep does from the device (what a CUDA graph captures), and the greedy tokens are the
    same."""
    sparse, dense = _block_sparse_gpt(kind, fields, n_kv_head, device)
    prompt = torch.randint(0, 50, (2, 44), device=device)
    host, device_side = new_caches(sparse, 2, 64), new_caches(sparse, 2, 64)
    seq = prompt
    with torch.no_grad():
        logits = sparse(prompt, caches=host)
        sparse(prompt, caches=device_side)
        step = DecodeStep(sparse, device_side, capture=False)
        for _ in range(7):
            torch.testing.assert_close(logits, sparse(seq), rtol=1e-4, atol=1e-4)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits = sparse(nxt, caches=host)
            torch.testing.assert_close(step(nxt), logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(sparse(seq), dense(seq), atol=1e-3)  # the layout matters at this length
    assert torch.equal(generate(sparse, prompt, 7, temperature=0), seq)


@pytest.mark.gpu
@pytest.mark.parametrize("kind, fields, n_kv_head", BLOCK_SPARSE_MODELS, ids=BLOCK_SPARSE_IDS)
def test_gpu_block_sparse_generation_through_a_cuda_graph_gives_the_eager_tokens(kind, fields, n_kv_head):
    """A block-sparse model's decode step finds its layout row on the device, so a captured step replays
    the eager step's kernels: the same greedy tokens in bf16, across row blocks."""
    sparse, _ = _block_sparse_gpt(kind, fields, n_kv_head, "cuda", torch.bfloat16)
    prompt = torch.randint(0, 50, (2, 13), device="cuda")
    runs = [generate(sparse, prompt, 40, temperature=0, cuda_graph=graph) for graph in (False, True)]
    assert torch.equal(runs[0], runs[1])


def test_a_block_sparse_cache_takes_queries_that_start_inside_a_row_block(device):
    """Several new tokens from a position inside a row block: a call up to the block's end, then the
    aligned rest in one; the last logits are the whole sequence's forward's."""
    sparse, _ = _block_sparse_gpt(*BLOCK_SPARSE_MODELS[2], device)
    prompt = torch.randint(0, 50, (2, 53), device=device)
    caches = new_caches(sparse, 2, 64)
    with torch.no_grad():
        sparse(prompt[:, :5], caches=caches)
        logits = sparse(prompt[:, 5:], caches=caches)
        torch.testing.assert_close(logits, sparse(prompt), rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="KV cache holds 64 tokens; cannot add 53 to 53"):
            sparse(prompt, caches=caches)


def test_a_block_sparse_model_on_the_cpu_without_the_interpreter_is_refused(monkeypatch):
    import kernels._common

    sparse, _ = _block_sparse_gpt(*BLOCK_SPARSE_MODELS[0], "cpu")
    monkeypatch.setattr(kernels._common, "INTERPRET", False)
    with pytest.raises(ValueError, match=r"need a CUDA device; it is on cpu: load it on a GPU"):
        new_caches(sparse, 1, 64)


def test_generation_leaves_a_training_model_in_training_mode():
    """Sampling in the middle of training must not switch the caller's dropout off for the steps after."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, max_seq_len=20, dropout=0.1,
                          attention="reference"))  # fmt: skip
    model.train()
    generate(model, torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    generate(model, torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    assert not model.training


def test_a_model_that_attends_both_ways_is_refused():
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, max_seq_len=20, causal=False))
    with pytest.raises(ValueError, match=r"needs a causal model \(model.causal=true\)"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 4)


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
        (dict(temperature=-1.0), "temperature=-1.0 must be a finite number >= 0"),
        (dict(temperature=float("nan")), "temperature=nan must be a finite number"),
        (dict(temperature=None), "temperature=None must be a finite number"),  # (torch's TypeError before)
        (dict(temperature="1"), "temperature='1' must be a finite number"),
        (dict(top_k=0), "top_k=0 must be an int >= 1, or None"),  # was a shape error inside topk
        (dict(top_k=2.5), "top_k=2.5 must be an int >= 1"),
        (dict(top_k=True), "top_k=True must be an int >= 1"),
        (dict(max_new_tokens=-2), "max_new_tokens=-2 must be an int >= 0"),  # was a negative-size tensor
        (dict(max_new_tokens=True), "max_new_tokens=True must be an int"),  # (generated one token)
        (dict(max_new_tokens=2.5), "max_new_tokens=2.5 must be an int"),
        (dict(cuda_graph="no"), "cuda_graph must be True, False or None"),  # (read as True)
        (dict(generator=1), "generator must be a torch.Generator or None, got int"),
        (
            dict(idx=torch.zeros(1, 0, dtype=torch.long)),
            r"idx must be int64 or int32 token ids \(batch, T >= 1\)",
        ),
        (dict(idx=torch.ones(1, 3, dtype=torch.bool)), "idx must be int64 or int32 token ids"),
        (dict(idx=torch.tensor([[1, 30]])), r"outside the model's vocabulary \[0, 30\)"),  # (IndexError)
        (dict(idx=torch.tensor([[-1, 2]])), r"outside the model's vocabulary \[0, 30\)"),
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


@pytest.mark.parametrize(
    "device, match",
    [("gpu", "'gpu': not a device; use cpu, cuda or cuda:N"), ("cuda", "no CUDA device is visible here")],
)
def test_generate_refuses_a_device_it_cannot_use(tmp_path, capsys, monkeypatch, device, match):
    """Before, --device cuda without a GPU failed inside torch ("Torch not compiled with CUDA enabled")."""
    from flashtrain.generate import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        main(["--run", str(tmp_path), "--device", device])
    assert match in capsys.readouterr().err


def test_generate_samples_from_a_language_model_run(tmp_path, capsys):
    from flashtrain.generate import main

    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=320, max_seq_len=32, attention="reference")
    overrides = ["debug=cpu", "model.n_layer=1", "model.d_model=16", "model.vocab_size=320"]
    overrides += ["model.max_seq_len=32", "model.attention=reference"]
    _checkpoint(tmp_path, overrides, GPT(cfg), "byte")
    main(["--run", str(tmp_path), "--prompt", "ab", "--max-new-tokens", "4", "--device", "cpu"])
    assert capsys.readouterr().out.startswith("ab")
