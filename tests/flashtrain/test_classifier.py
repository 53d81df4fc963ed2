"""The LRA encoder classifier: position upsampling, padding, learning, and the LRA task plumbing."""

import pytest
import torch

from flashtrain.models.classifier import (
    ClassifierConfig,
    SequenceClassifier,
    rotary_angles,
    sincos_grid,
    sincos_table,
)
from flashtrain.models.gpt import GPTConfig


def encoder(**kw):
    base = dict(
        causal=False,
        n_layer=2,
        n_head=2,
        d_model=32,
        vocab_size=256,
        max_seq_len=64,
        dropout=0.0,
        attention="reference",
    )
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("positions", ["learned", "sincos", "sincos_init", "rotary"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("factor", [2, 4])
def test_upsampled_positions_preserve_the_function_on_duplicated_images(backend, factor, positions):
    """Path-64 -> Path-X transfer: duplicate every pixel into a k×k block and the position grid alike."""
    torch.manual_seed(0)
    cfg = ClassifierConfig(encoder=encoder(attention=backend), image_size=4, positions=positions)
    model = SequenceClassifier(cfg).double().eval()
    trained = {name for name, _ in model.named_parameters()}
    images = torch.randint(0, 256, (3, 4, 4))
    before = model(images.flatten(1))
    model.upsample_positions(factor)
    big = images.repeat_interleave(factor, 1).repeat_interleave(factor, 2)  # (B, 4k, 4k)
    after = model(big.flatten(1))
    torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-10)
    assert model.cfg.image_size == 4 * factor
    assert {name for name, _ in model.named_parameters()} == trained  # a fixed table stays fixed


@pytest.mark.parametrize("side, dim", [(5, 8), (16, 32), (32, 64)])
def test_sincos_grid_places_each_pixel_nearest_its_neighbours(side, dim):
    """Half the channels follow the row, half the column, and the encoding closest to a pixel's own is
    one of its 4-neighbours': what lets attention find adjacent pixels before anything is learned."""
    grid = sincos_grid(side, dim).double()
    assert grid.shape == (side, side, dim)
    r, c = torch.randint(0, side, (2,)).tolist()
    torch.testing.assert_close(
        grid[r, :, : dim // 2], sincos_table(side, dim // 2)[r].double().expand(side, -1)
    )
    torch.testing.assert_close(
        grid[:, c, dim // 2 :], sincos_table(side, dim // 2)[c].double().expand(side, -1)
    )
    k = torch.arange(dim // 4, dtype=torch.float64)
    expected = torch.cat([torch.sin(3 / 10000 ** (k / (dim // 4))), torch.cos(3 / 10000 ** (k / (dim // 4)))])
    torch.testing.assert_close(sincos_table(side, dim // 2)[3].double(), expected, rtol=1e-6, atol=1e-6)
    flat = grid.flatten(0, 1)
    dist = torch.cdist(flat, flat)
    dist.fill_diagonal_(float("inf"))
    nearest = dist.argmin(1)
    rows, cols = torch.arange(side * side) // side, torch.arange(side * side) % side
    steps = (rows[nearest] - rows).abs() + (cols[nearest] - cols).abs()
    assert (steps == 1).all()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_rotary_scores_depend_on_the_2d_offset_only(pooling):
    """Axial rotary positions: a query-key score is unchanged when both pixels move by the same 2-D
    offset, and equal offsets along rows and along columns rotate different channel pairs."""
    torch.manual_seed(0)
    head_dim, side = 16, 6
    angles = rotary_angles((side, side), head_dim, theta=100.0)  # (side, side, head_dim / 2)
    assert angles.shape == (side, side, head_dim // 2)
    torch.testing.assert_close(angles[2, 5, :4], angles[2, 0, :4])  # row pairs ignore the column
    torch.testing.assert_close(angles[0, 3, 4:], angles[5, 3, 4:])  # column pairs ignore the row
    from flashtrain.models.gpt import apply_rotary

    q, k = torch.randn(2, head_dim, dtype=torch.float64)

    def score(a, b):  # query at pixel a, key at pixel b
        def rot(x, p):
            cos, sin = angles[p].cos().double(), angles[p].sin().double()
            return apply_rotary(x.view(1, 1, 1, -1), cos, sin)

        return (rot(q, a) * rot(k, b)).sum().item()

    # angles are float32
    assert score((1, 1), (2, 3)) == pytest.approx(score((3, 2), (4, 4)), rel=1e-6)
    assert score((1, 1), (2, 1)) != pytest.approx(score((1, 1), (1, 2)), rel=1e-3)
    # the model: no added positions and nothing trained for them, yet positions are seen: without
    # them a mean-pooled encoder could not tell an image from its transpose
    cfg = ClassifierConfig(encoder=encoder(), image_size=8, positions="rotary", pooling=pooling)
    model = SequenceClassifier(cfg).double().eval()
    assert "rot_2d" in model.state_dict()
    assert not any("rot" in n or "pos" in n for n, _ in model.named_parameters())
    for block in model.blocks:  # sharpen attention: at the 0.02-std start it is nearly uniform
        block.attn.c_attn.weight.data *= 20
    image = torch.randint(0, 256, (1, 8, 8))
    out, transposed = model(image.flatten(1)), model(image.transpose(1, 2).flatten(1))
    assert (out - transposed).abs().max() > 1e-2 * out.abs().max()
    model.rot_2d.zero_()  # no rotation: now the transpose is the same set of pixels
    out, transposed = model(image.flatten(1)), model(image.transpose(1, 2).flatten(1))
    torch.testing.assert_close(out, transposed, rtol=1e-12, atol=1e-12)


def test_rotary_sequence_positions():
    """1-D inputs (ListOps) get 1-D rotary angles: all pairs turn with the position, GPT's frequencies."""
    cfg = ClassifierConfig(encoder=encoder(vocab_size=16), num_classes=10, pad_id=0, positions="rotary")
    model = SequenceClassifier(cfg)
    head_dim = cfg.encoder.head_dim
    freqs = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(model.rot_1d, torch.arange(64.0)[:, None] * freqs)
    model(torch.randint(1, 16, (2, 20))).sum().backward()


def test_fixed_positions_are_saved_but_not_trained():
    torch.manual_seed(0)
    fixed = SequenceClassifier(ClassifierConfig(encoder=encoder(), image_size=8, positions="sincos"))
    init = SequenceClassifier(ClassifierConfig(encoder=encoder(), image_size=8, positions="sincos_init"))
    assert "pos_2d" in fixed.state_dict() and "pos_2d" not in dict(fixed.named_parameters())
    assert "pos_2d" in dict(init.named_parameters())
    torch.testing.assert_close(fixed.pos_2d, init.pos_2d.detach())
    # the start has the learned start's scale: RMS 0.02 per channel
    assert abs(fixed.pos_2d.pow(2).mean().sqrt().item() - 0.02) < 2e-3
    fixed(torch.randint(0, 256, (2, 64))).sum().backward()
    assert all(p.grad is not None for p in fixed.parameters() if p.requires_grad)
    sequence = SequenceClassifier(ClassifierConfig(encoder=encoder(), positions="sincos"))
    torch.testing.assert_close(sequence.pos_1d, sincos_table(64, 32) * 0.02 * 2**0.5)


@pytest.mark.parametrize("positions", ["learned", "sincos_init"])
def test_init_std_sets_the_starting_scale(positions):
    """model.init_std reaches the classifier's embeddings, positions, CLS token and linear weights."""
    torch.manual_seed(0)
    cfg = ClassifierConfig(
        encoder=encoder(d_model=64, init_std=0.125), image_size=8, positions=positions, pooling="cls"
    )
    model = SequenceClassifier(cfg)
    for name in ("embed.weight", "blocks.0.attn.c_attn.weight", "blocks.1.mlp.c_fc.weight", "pos_2d", "cls"):
        rms = model.get_parameter(name).pow(2).mean().sqrt().item()
        assert abs(rms - 0.125) < 0.125 * 0.15, (name, rms)


def test_bias_false_leaves_no_bias_anywhere():
    """model.bias=false reaches the final LayerNorm and the head too, not only the blocks."""
    model = SequenceClassifier(ClassifierConfig(encoder=encoder(bias=False), image_size=8))
    assert not [name for name, _ in model.named_parameters() if name.endswith("bias")]
    model(torch.randint(0, 256, (2, 64))).sum().backward()


def test_uint8_pixels_equal_int64_ids_and_floats_are_refused():
    """The trainer sends pixels as uint8 (their stored type); the model widens them itself."""
    model = SequenceClassifier(ClassifierConfig(encoder=encoder(), image_size=8)).eval()
    pixels = torch.randint(0, 256, (2, 64), dtype=torch.uint8)
    torch.testing.assert_close(model(pixels), model(pixels.long()), rtol=0, atol=0)
    with pytest.raises(TypeError, match="integer ids"):
        model(pixels.float())


def test_padding_changes_nothing():
    torch.manual_seed(0)
    cfg = ClassifierConfig(encoder=encoder(vocab_size=16, attention="sdpa"), num_classes=10, pad_id=0)
    model = SequenceClassifier(cfg).double().eval()
    tokens = torch.randint(1, 16, (2, 20))
    padded = torch.cat([tokens, torch.zeros(2, 9, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), model(tokens))


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_classifier_learns_a_small_generated_image_task(positions):
    """Noisy dark 8×8 images, half of them with one bright pixel somewhere: find the pixel."""
    gen = torch.Generator().manual_seed(0)

    def batch(n):
        images = torch.randint(0, 40, (n, 8, 8), generator=gen)
        rows, cols = torch.randint(0, 8, (2, n), generator=gen)
        labels = torch.randint(0, 2, (n,), generator=gen)
        marked = labels == 1
        images[torch.arange(n)[marked], rows[marked], cols[marked]] = 255
        return images.flatten(1), labels

    torch.manual_seed(0)
    cfg = ClassifierConfig(encoder=encoder(attention="sdpa"), image_size=8, positions=positions)
    model = SequenceClassifier(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(150):
        x, y = batch(64)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x, y = batch(512)
    with torch.no_grad():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    assert accuracy > 0.95, accuracy


def test_bad_classifier_configs():
    with pytest.raises(ValueError, match="positions"):
        ClassifierConfig(encoder=encoder(), positions="rope")
    with pytest.raises(ValueError, match="divisible by 4"):
        ClassifierConfig(encoder=encoder(d_model=30, n_head=2), positions="sincos")
    with pytest.raises(ValueError, match="head dim divisible by 4"):
        ClassifierConfig(encoder=encoder(d_model=36, n_head=2), image_size=8, positions="rotary")
    with pytest.raises(ValueError, match="head dim divisible by 2"):
        ClassifierConfig(encoder=encoder(d_model=30, n_head=2), positions="rotary")
    with pytest.raises(ValueError, match="task.positions=rotary"):
        ClassifierConfig(encoder=encoder(pos_embedding="rotary"))
    with pytest.raises(ValueError, match="causal must be false"):
        ClassifierConfig(encoder=encoder(causal=True))
    with pytest.raises(ValueError, match="pooling"):
        ClassifierConfig(encoder=encoder(), pooling="max")
    model = SequenceClassifier(ClassifierConfig(encoder=encoder()))
    with pytest.raises(ValueError, match="needs an image model"):
        model.upsample_positions(2)


@pytest.mark.parametrize("positions", ["learned", "sincos", "rotary"])
def test_pathx_starts_from_a_path64_style_checkpoint(tmp_path, positions):
    """task.init_from loads a smaller-image run and duplicates its position grid (Path-64 -> Path-X),
    a fixed sin-cos grid included (it is saved with the model)."""
    from flashtrain.config import compose_config
    from flashtrain.trainer import Trainer

    common = [
        "debug=lra_cpu",
        f"trainer.out_dir={tmp_path}",
        f"task.cache_dir={tmp_path}/lra",
        "trainer.max_steps=1",
        f"task.positions={positions}",
    ]
    small = Trainer(compose_config(["experiment=lra/pathfinder32", "trainer.run_name=small", *common]))
    small.fit()
    big_overrides = [
        "experiment=lra/pathx",
        *common,
        "task.resolution=64",
        f"task.init_from={tmp_path}/small",
    ]
    big = Trainer(compose_config(big_overrides))
    assert big.model.cfg.image_size == 64
    other = "learned" if positions != "learned" else "rotary"
    with pytest.raises(ValueError, match=f"task.positions: checkpoint '{positions}', this run '{other}'"):
        Trainer(compose_config([*big_overrides, f"task.positions={other}"]))
    name = "rot_2d" if positions == "rotary" else "pos_2d"
    grid = getattr(small.model, name).detach()
    torch.testing.assert_close(
        getattr(big.model, name).detach(), grid.repeat_interleave(2, 0).repeat_interleave(2, 1)
    )
    big.fit()
    with pytest.raises(ValueError, match="task.resolution: checkpoint 32, this run 48"):
        Trainer(
            compose_config(
                [
                    "experiment=lra/pathx",
                    *common,
                    "trainer.run_name=pathx48",  # a run of its own: lra_pathx now holds big's checkpoint
                    "task.resolution=48",
                    f"task.init_from={tmp_path}/small",
                ]
            )
        )


def test_pathfinder_batches_from_memory_equal_the_arrow_files(tmp_path):
    """Pathfinder pixels are copied once into uint8 arrays (fast batches); every batch equals the one
    read from the Arrow files, for shuffled training rows and the ordered evaluation splits."""
    import numpy as np

    from flashtrain.config import compose_config
    from flashtrain.tasks.classification import ClassificationTask, pixels_in_memory

    cfg = compose_config(["experiment=lra/pathfinder32", "debug=lra_cpu", f"task.cache_dir={tmp_path}"])
    task = ClassificationTask(cfg, rank=0, world_size=1, dp_rank=0, dp=1)
    assert task.pixels is not None and task.pixels["train"][0].dtype == np.uint8
    from_memory = [task.next_batch() for _ in range(5)] + list(task.eval_batches("test", None))
    task.pixels, task.sampler = None, type(task.sampler)(32, 4, seed=cfg.trainer.seed)  # the Arrow path
    from_files = [task.next_batch() for _ in range(5)] + list(task.eval_batches("test", None))
    for (x, y), (x2, y2) in zip(from_memory, from_files, strict=True):
        assert x.dtype == x2.dtype == torch.uint8 and y.dtype == y2.dtype == torch.long  # pixels as stored
        torch.testing.assert_close(x, x2, rtol=0, atol=0)
        torch.testing.assert_close(y, y2, rtol=0, atol=0)
    assert pixels_in_memory(task.splits, budget=32 * 1024 - 1) is None  # over the budget: the files stay


@pytest.mark.parametrize("world_size", [1, 3])
def test_epoch_sampler_order_and_resume(world_size):
    """Each epoch is the (seed, epoch) permutation cut into global batches, ragged tail dropped, rank r
    taking its slice; a sampler restored from a mid-epoch state goes on with the same batches."""
    import numpy as np

    from flashtrain.tasks.classification import EpochSampler

    n, b, seed = 23, 2, 7
    per_step = b * world_size
    want = []
    for epoch in range(3):
        order = np.random.default_rng([seed, epoch]).permutation(n)
        want += [order[i : i + per_step] for i in range(0, n - per_step + 1, per_step)]
    ranks = [EpochSampler(n, b, seed=seed, rank=r, world_size=world_size) for r in range(world_size)]
    got = [np.concatenate([s.next_indices() for s in ranks]) for _ in range(len(want))]
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w) and len(set(g)) == per_step
    middle = EpochSampler(n, b, seed=seed, world_size=world_size)
    for _ in range(5):
        middle.next_indices()
    restored = EpochSampler(n, b, seed=seed, world_size=world_size)
    restored.load_state_dict(middle.state_dict())
    for _ in range(8):  # across the epoch boundary
        np.testing.assert_array_equal(restored.next_indices(), middle.next_indices())


def _lm_checkpoint(run_dir, model_overrides=()):
    """A language-model run's checkpoint, its meta as the trainer writes it."""
    from dataclasses import asdict

    from flashtrain import checkpoint as ckpt
    from flashtrain.config import compose_config
    from flashtrain.models.gpt import GPT

    cfg = compose_config(["debug=cpu", "model.vocab_size=320", "model.attention=reference", *model_overrides])
    meta = {"step": 1, "model": asdict(cfg.model), "tokenizer": "byte", "config": asdict(cfg)}
    return ckpt.save_checkpoint(str(run_dir), 1, GPT(cfg.model), {}, meta)


def _never_generate_data(monkeypatch):
    """Checks that must come before the (for Path-X, long) data generation fail the test if they don't."""
    from flashtrain.tasks import classification

    def refuse(task_cfg):
        raise AssertionError("the data were generated before the config was checked")

    monkeypatch.setattr(classification, "load_lra_dataset", refuse)


def test_init_from_names_every_setting_that_keeps_the_weights_from_loading(tmp_path, monkeypatch):
    """A source run with other weight shapes, pooling or task, or an LM run, is refused at set-up with
    one ValueError naming each differing key and both values (was a RuntimeError inside load_state_dict,
    after the data were generated); a missing directory is named as missing."""
    from flashtrain.config import compose_config
    from flashtrain.trainer import Trainer

    common = ["debug=lra_cpu", f"trainer.out_dir={tmp_path}", f"task.cache_dir={tmp_path}/lra"]
    small = Trainer(compose_config(["experiment=lra/pathfinder32", "trainer.run_name=small", *common]))
    small.fit()  # pathfinder32 at debug=lra_cpu: d_model 32, 1 layer, 2 heads, mean pooling, learned
    _never_generate_data(monkeypatch)
    big = ["experiment=lra/pathx", *common, "task.resolution=64", "task.positions=learned"]
    cases = [
        (
            [f"task.init_from={tmp_path}/small", "model.d_model=64", "model.n_layer=2", "task.pooling=cls"],
            [
                "model.d_model: checkpoint 32, this run 64",
                "model.n_layer: checkpoint 1, this run 2",
                "task.pooling: checkpoint 'mean', this run 'cls'",
            ],
        ),
        ([f"task.init_from={tmp_path}/small", "model.n_head=4"], ["model.n_head: checkpoint 2, this run 4"]),
        (
            [f"task.init_from={_lm_checkpoint(tmp_path / 'lm', ['model.d_model=32', 'model.n_layer=1'])}"],
            ["task.kind: checkpoint 'lm', this run 'pathfinder'"],
        ),
        ([f"task.init_from={tmp_path}/nowhere"], [f"task.init_from={tmp_path}/nowhere does not exist"]),
        ([f"task.init_from={tmp_path}/lra"], ["holds no checkpoint"]),  # a directory, not a run
    ]
    for overrides, wanted in cases:
        with pytest.raises(ValueError) as err:
            Trainer(compose_config([*big, *overrides]))
        for text in wanted:
            assert text in str(err.value), (text, str(err.value))
    with pytest.raises(ValueError, match="task.kind=listops: set task.init_from=null"):
        Trainer(compose_config(["experiment=lra/listops", *common, f"task.init_from={tmp_path}/small"]))


def test_task_pooling_is_checked_with_the_config():
    """task.pooling=max was refused only after the data were generated, as "model.pooling"."""
    from flashtrain.config import compose_config

    with pytest.raises(ValueError, match="task.pooling='max'; choose one of mean, cls"):
        compose_config(["experiment=lra/pathfinder32", "debug=lra_cpu", "task.pooling=max"])


@pytest.fixture(scope="module")
def lra_cache(tmp_path_factory):
    """One generated-data cache for the module (keyed by the split sizes, so sizes may differ)."""
    return tmp_path_factory.mktemp("lra")


def _reference_metrics(task, model, split):
    """Loss and accuracy over every example of a split, in one batch."""
    import numpy as np

    x, y = task._batch(split, np.arange(len(task.splits[split])))
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    with torch.no_grad():
        logits = model(x).float()
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(-1) == y).float().mean().item()


def test_evaluation_scores_a_split_smaller_than_a_batch(tmp_path):
    """n_val=8 with trainer.batch_size=16 reported val/loss 0.0 and val/accuracy 0.0 (no full batch):
    the interval and final evaluations now score all 8 examples, like a one-batch reference."""
    from flashtrain.config import compose_config
    from flashtrain.trainer import Trainer

    # fp32 (CUDA's default is bf16 autocast): the reference below runs in fp32, and at 16 a batch bf16's
    # rounding parts batched and one-batch losses by ~1e-3 (an H200, session 70), the size of a missing example
    overrides = [
        "experiment=lra/pathfinder32",
        "debug=lra_cpu",
        "trainer.batch_size=16",
        "trainer.precision=fp32",
    ]
    trainer = Trainer(
        compose_config([*overrides, f"trainer.out_dir={tmp_path}", f"task.cache_dir={tmp_path}"])
    )
    interval, final = trainer.evaluate(), trainer.evaluate(final=True)
    model = trainer.model.eval()  # evaluate() leaves it in training mode (dropout)
    for split, prefix in (("validation", "val"), ("test", "test")):
        loss, accuracy = _reference_metrics(trainer.task, model, split)
        assert loss > 0.1
        # (rel 1e-4: on CUDA the batched and one-batch forwards take different matmul kernels)
        if split == "validation":
            assert interval == pytest.approx({"val/loss": loss, "val/accuracy": accuracy}, rel=1e-4)
        assert final[f"{prefix}/loss"] == pytest.approx(loss, rel=1e-4)
        assert final[f"{prefix}/accuracy"] == pytest.approx(accuracy, rel=1e-4)


@pytest.mark.parametrize("dp", [1, 2, 3])
def test_whole_split_evaluation_counts_every_example_once(lra_cache, dp):
    """12 validation and 5 test examples, batch 4 per rank: every example is scored exactly once across
    the data-parallel ranks (the partial last global batch was dropped: 8 of 12 scored at dp=1, 0 of 5
    at dp=2), every rank runs the same number of batches, and the metrics are per example."""
    import contextlib

    import numpy as np

    from flashtrain.config import compose_config
    from flashtrain.tasks.classification import ClassificationTask, classifier_config

    overrides = ["experiment=lra/pathfinder32", "debug=lra_cpu", "task.n_val=12", "task.n_test=5"]
    cfg = compose_config([*overrides, f"task.cache_dir={lra_cache}"])
    task = ClassificationTask(cfg, rank=0, world_size=1, dp_rank=0, dp=1)
    for split in ("validation", "test"):
        images, labels = task.pixels[split]
        seen, batches = [], []
        for rank in range(dp):
            task.dp_rank, task.dp = rank, dp
            ys = [(x, y) for x, y in task.eval_batches(split, None)]
            batches.append(len(ys))
            for x, y in ys:
                assert x.shape[0] == cfg.trainer.batch_size  # full-size batches, padding included
                real = y >= 0  # padding rows carry a negative label (ignore_index)
                seen += [tuple(row) for row in x[real].numpy()]
                # each real row keeps its own label
                rows = [int(np.flatnonzero((images == row).all(1))[0]) for row in x[real].numpy()]
                assert y[real].tolist() == labels[rows].tolist()
        assert len(set(batches)) == 1  # the same count on every rank: a collective model needs it
        assert len(seen) == len(images), (split, len(seen))
        assert sorted(seen) == sorted(tuple(row) for row in images)  # each exactly once
    if dp == 1:  # the metrics: per example over the whole split, as one batch of all of it gives
        model = SequenceClassifier(classifier_config(cfg)).eval()
        metrics = task.evaluate(model, torch.device("cpu"), contextlib.nullcontext, 1, 1, final=True)
        for split, prefix in (("validation", "val"), ("test", "test")):
            loss, accuracy = _reference_metrics(task, model, split)
            assert metrics[f"{prefix}/loss"] == pytest.approx(loss, rel=1e-5)
            assert metrics[f"{prefix}/accuracy"] == pytest.approx(accuracy, rel=1e-5)


def test_an_empty_evaluation_split_is_refused_at_setup(lra_cache, monkeypatch):
    """A split with no rows (task.n_val >= 1 is checked with the config; a cache can still hold one)
    would evaluate to 0.0; set-up names the setting instead."""
    from flashtrain.config import compose_config
    from flashtrain.tasks import classification

    generated = classification.load_lra_dataset

    def without_validation(task_cfg):
        splits = generated(task_cfg)
        splits["validation"] = splits["validation"].select([])
        return splits

    monkeypatch.setattr(classification, "load_lra_dataset", without_validation)
    cfg = compose_config(["experiment=lra/pathfinder32", "debug=lra_cpu", f"task.cache_dir={lra_cache}"])
    with pytest.raises(ValueError, match="the validation split is empty; set task.n_val >= 1"):
        classification.ClassificationTask(cfg, rank=0, world_size=1, dp_rank=0, dp=1)
