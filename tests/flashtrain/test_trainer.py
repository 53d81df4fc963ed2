"""The trainer: exact resume after a kill, atomic checkpoints, NaN handling, clear errors."""

import json
import math
import os
import sys

import pytest
import torch

from flashtrain import checkpoint as ckpt
from flashtrain.config import compose_config
from flashtrain.trainer import NonFiniteLossError, Trainer


class KilledError(Exception):
    """Stands in for SIGKILL: the run stops between two steps without any clean-up of its own."""


def small_config(tmp_path, *overrides):
    return compose_config(
        [
            "debug=cpu",
            f"trainer.out_dir={tmp_path}/runs",
            f"data.cache_dir={tmp_path}/cache",
            "trainer.max_steps=6",
            "trainer.checkpoint_interval=2",
            "trainer.keep_checkpoints=5",
            "trainer.eval_interval=3",
            "model.dropout=0.1",  # dropout makes the RNG state part of what resume must restore
            "optim.warmup_steps=2",
            *overrides,
        ]
    )


def run(cfg, kill_after=None):
    trainer = Trainer(cfg)
    if kill_after is not None:

        def kill(_, step):
            if step == kill_after:
                raise KilledError

        trainer.step_hooks.append(kill)
    try:
        return trainer.fit(), trainer
    finally:
        trainer.close()


def test_killed_and_resumed_run_repeats_the_uninterrupted_losses(tmp_path):
    straight, _ = run(small_config(tmp_path, "trainer.run_name=straight"))
    assert len(straight) == 6 and len(set(straight)) == 6
    with pytest.raises(KilledError):
        run(small_config(tmp_path, "trainer.run_name=killed"), kill_after=5)  # last checkpoint: step 4
    assert os.path.basename(ckpt.latest_checkpoint(f"{tmp_path}/runs/killed")) == "step_0000004"
    resumed, trainer = run(small_config(tmp_path, "trainer.run_name=killed", "trainer.resume=true"))
    assert resumed == straight  # bit-for-bit on CPU: weights, optimizer, data position and RNG all restored
    a = {k: v for k, v in trainer.model.state_dict().items()}
    final = ckpt.latest_checkpoint(f"{tmp_path}/runs/straight")
    reference = Trainer(small_config(tmp_path, "trainer.run_name=straight", "trainer.resume=true")).model
    ckpt.load_checkpoint(final, reference)
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(a[k], v, rtol=0, atol=0)


def test_checkpoint_layout_and_weights_only(tmp_path):
    run(small_config(tmp_path, "trainer.run_name=layout"))
    root = f"{tmp_path}/runs/layout/checkpoints"
    names = sorted(os.listdir(root))
    assert names == ["latest", "step_0000002", "step_0000004", "step_0000006"]
    path = ckpt.latest_checkpoint(f"{tmp_path}/runs/layout")
    state = torch.load(os.path.join(path, "train_state.pt"), weights_only=True)
    assert state["step"] == 6 and len(state["history"]) == 6 and "optimizer" in state
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert meta["model"]["n_layer"] == 2 and meta["tokenizer"] == "byte"
    assert not [n for n in os.listdir(root) if n.startswith(".tmp")]


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    cfg = small_config(tmp_path, "trainer.run_name=crash", "trainer.max_steps=4")
    trainer = Trainer(cfg)
    calls = {"n": 0}
    real_save = torch.save

    def failing_save(obj, path, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint dies half-written
            raise OSError("disk full")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        trainer.fit()
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000002"
    monkeypatch.setattr(torch, "save", real_save)
    resumed = Trainer(
        small_config(tmp_path, "trainer.run_name=crash", "trainer.max_steps=4", "trainer.resume=true")
    )
    assert resumed.step == 2


def test_starting_over_in_a_run_directory_with_checkpoints_is_refused(tmp_path):
    """A second fresh run under the same name wrote its checkpoints beside the first run's, and pruning
    by step number then deleted its own new ones (leaving `latest` naming a deleted directory)."""
    run(small_config(tmp_path, "trainer.run_name=twice"))
    root = f"{tmp_path}/runs/twice/checkpoints"
    before = sorted(os.listdir(root))
    with pytest.raises(
        ValueError, match=r"already holds checkpoints of a run \(latest step_0000006\).*resume"
    ):
        Trainer(small_config(tmp_path, "trainer.run_name=twice", "trainer.max_steps=2"))
    assert sorted(os.listdir(root)) == before
    resumed, _ = run(
        small_config(tmp_path, "trainer.run_name=twice", "trainer.max_steps=8", "trainer.resume=auto")
    )
    assert len(resumed) == 8


def test_pruning_keeps_the_checkpoint_just_written_and_later_ones(tmp_path):
    """Only checkpoints older than the one written make room, whatever else the directory holds."""
    model = torch.nn.Linear(2, 2)
    run_dir = str(tmp_path)
    for step in (10, 12):  # left by some other run
        ckpt.save_checkpoint(run_dir, step, model, {"step": step}, {}, keep=5)
    for step in (2, 4, 6):
        path = ckpt.save_checkpoint(run_dir, step, model, {"step": step}, {}, keep=2)
        assert os.path.isdir(path) and ckpt.latest_checkpoint(run_dir) == path
    assert ckpt.saved_steps(run_dir) == ["step_0000004", "step_0000006", "step_0000010", "step_0000012"]


def test_resume_without_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="has no checkpoint yet"):
        Trainer(small_config(tmp_path, "trainer.run_name=fresh", "trainer.resume=true"))


def test_resume_with_another_model_fails_clearly(tmp_path):
    run(small_config(tmp_path, "trainer.run_name=m", "trainer.max_steps=2"))
    with pytest.raises(ValueError, match=r"different model \(model.n_layer: checkpoint 2 vs config 3"):
        Trainer(small_config(tmp_path, "trainer.run_name=m", "trainer.resume=true", "model.n_layer=3"))


def test_nan_loss_stops_with_a_message(tmp_path):
    trainer = Trainer(small_config(tmp_path, "trainer.run_name=nan", "trainer.max_steps=3"))
    with torch.no_grad():
        trainer.model.transformer.wte.weight[:] = float("nan")
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 0"):
        trainer.fit()


def test_non_finite_gradient_with_a_finite_loss_names_the_parameter(tmp_path):
    trainer = Trainer(small_config(tmp_path, "trainer.run_name=badgrad", "trainer.max_steps=3"))
    fc = trainer.model.transformer.h[1].mlp.c_fc.weight
    fc.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(
        NonFiniteLossError,
        match=r"gradient norm is (inf|nan) \(loss \d.*non-finite gradients in transformer\.h\.1\.mlp\.c_fc\.weight",
    ):
        trainer.fit()


def test_an_overflowing_gradient_norm_names_the_largest_gradients(tmp_path):
    """Finite gradients whose squares overflow fp32: the norm is inf though no gradient is."""
    trainer = Trainer(small_config(tmp_path, "trainer.run_name=bignorm", "trainer.max_steps=3"))
    trainer.model.transformer.h[0].attn.c_proj.weight.register_hook(lambda g: torch.full_like(g, 1e25))
    with pytest.raises(
        NonFiniteLossError,
        match=r"no inf/NaN gradient; largest \|gradient\|: transformer\.h\.0\.attn\.c_proj\.weight \de\+25",
    ):
        trainer.fit()


@pytest.mark.parametrize("scale, clipped", [(10.0, True), (1e-3, False)])
def test_gradients_are_clipped_to_the_global_norm(tmp_path, scale, clipped):
    trainer = Trainer(small_config(tmp_path, f"trainer.run_name=clip{scale}", "optim.grad_clip=1.0"))
    params = list(trainer.model.parameters())
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, scale * (1 + i % 3))
    before = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
    grads, norm = trainer.strategy.grad_norm()
    returned = norm.item()
    trainer.strategy.clip_grads(grads, norm, returned, 1.0)
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
    assert returned == pytest.approx(before, rel=1e-5)  # the norm before clipping is what is logged
    assert after == pytest.approx(1.0 if clipped else before, rel=1e-4)


def test_a_step_reads_the_device_once(tmp_path, monkeypatch):
    """The loss and the gradient norm come to the host together: one sync per step, not one each."""
    trainer = Trainer(small_config(tmp_path, "trainer.run_name=one_sync", "optim.grad_clip=1.0"))
    trainer.train_step()  # first step: lazy set-up may read what it likes
    reads = []

    def counted(real, name):
        def read(t):
            caller = sys._getframe(1).f_code.co_filename  # torch's CPU optimizer reads its step count too
            if os.sep + "flashtrain" + os.sep in caller:
                reads.append(name)
            return real(t)

        return read

    for name in ("item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), name))
    loss = trainer.train_step()
    assert reads == ["tolist"] and math.isfinite(loss) and trainer.last_grad_norm > 0


def test_nan_loss_skip_policy_skips_then_gives_up(tmp_path):
    trainer = Trainer(
        small_config(
            tmp_path, "trainer.run_name=skip", "trainer.nan_policy=skip", "trainer.max_skipped_steps=2"
        )
    )
    with torch.no_grad():
        trainer.model.transformer.wte.weight[0, 0] = float("inf")
    before = trainer.model.transformer.h[0].mlp.c_fc.weight.clone()
    with pytest.raises(NonFiniteLossError, match="3 consecutive non-finite steps"):
        trainer.fit()
    assert torch.equal(before, trainer.model.transformer.h[0].mlp.c_fc.weight)  # no update was applied


def test_loss_falls_on_the_default_corpus(tmp_path):
    history, _ = run(
        small_config(
            tmp_path,
            "trainer.run_name=falls",
            "trainer.max_steps=30",
            "optim.lr=3e-3",
            "model.dropout=0.0",
            "trainer.checkpoint_interval=0",
        )
    )
    assert sum(history[-5:]) / 5 < history[0] - 1.0


@pytest.mark.parametrize(
    "override, match",
    [
        ("trainer.seq_len=512", "longer than model.max_seq_len"),
        ("trainer.global_batch=5", "global_batch=5"),
        ("model.vocab_size=100", "smaller than the tokenizer's vocabulary"),
        ("trainer.out_dir=/proc/flashtrain", "cannot write to the run directory"),
        # a name over the file system's 255 bytes was met with advice to move trainer.out_dir
        ("trainer.run_name=" + "r" * 300, r"give a shorter trainer.run_name \(this one has 300 characters\)"),
        # each of these was taken before: a negative interval evaluated or checkpointed every step, 0
        # evaluation batches failed only at the first evaluation, and a 0 peak or decay read as unset
        ("trainer.eval_interval=-1", r"trainer.eval_interval=-1 must be >= 0"),
        ("trainer.checkpoint_interval=-1", r"trainer.checkpoint_interval=-1 must be >= 0"),
        ("trainer.eval_batches=0", r"trainer.eval_batches=0 must be >= 1"),
        ("trainer.global_batch=0", r"trainer.global_batch=0 must be >= 1"),
        ("trainer.peak_tflops=0", r"trainer.peak_tflops=0.0 must be > 0"),
        ("optim.decay_steps=0", r"optim.decay_steps=0 must be >= 1"),
        ("optim.beta2=1.0", r"optim.beta2=1.0 must lie in \[0, 1\)"),
        ("model.window=0", r"model.window=0 must be >= 1, or null"),
    ],
)
def test_bad_settings_fail_clearly(tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        Trainer(small_config(tmp_path, override))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["trainer.cuda_graphs=true"], "set trainer.compile=true too"),
        (["trainer.cuda_graphs=true", "trainer.compile=true", "trainer.activation_checkpointing=true"],
         "cannot replay blocks recomputed by activation checkpointing"),
        (["trainer.cuda_graphs=true", "trainer.compile=true", "trainer.device=cpu"], "needs a CUDA device, not cpu"),
    ],
)  # fmt: skip
def test_cuda_graph_settings_fail_clearly(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        Trainer(small_config(tmp_path, *overrides))


@pytest.mark.parametrize(
    "override, match",
    [
        ("parallel.strategy=deepspeed", "does not run under DeepSpeed's engine"),
        ("model.attn_dropout=0.1", r"model.attn_dropout=0.1: set one of them off"),
    ],
)
def test_cuda_graph_settings_a_gpu_run_refuses(tmp_path, monkeypatch, override, match):
    """Checked as soon as the device is known, so a CPU stands in for the GPU here."""
    monkeypatch.setattr(Trainer, "_pick_device", lambda self, name: torch.device("cuda"))
    cfg = small_config(tmp_path, "trainer.compile=true", "trainer.cuda_graphs=true", override)
    with pytest.raises(ValueError, match=match):
        Trainer(cfg)


@pytest.mark.parametrize("backend", ["triton", "triton_nondeterministic", "block_sparse"])
def test_a_triton_backend_on_the_cpu_is_refused_without_the_interpreter(tmp_path, monkeypatch, backend):
    """Before, the run got as far as the first attention call and said to move tensors to CUDA."""
    import kernels._common

    monkeypatch.setattr(kernels._common, "INTERPRET", False)
    cfg = small_config(tmp_path, f"model.attention={backend}", "trainer.device=cpu")
    with pytest.raises(
        ValueError, match=f"model.attention={backend} runs our Triton kernels.*use model.attention=auto"
    ):
        Trainer(cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_gpu_cuda_graphs_train_as_plain_compiled_blocks(tmp_path, grad_accum):
    """Blocks replayed from CUDA graphs (trainer.cuda_graphs) give the losses of the same compiled blocks
    launched kernel by kernel, with and without gradient accumulation (whose gradients must not stay
    in the graphs' memory), an evaluation and the optimizer in between."""
    common = [
        "trainer.device=cuda", "trainer.compile=true", "model.dropout=0.0", "model.attention=triton",
        "trainer.max_steps=4", "trainer.eval_interval=2", "trainer.checkpoint_interval=0",
        f"trainer.grad_accum={grad_accum}",
    ]  # fmt: skip
    plain, _ = run(small_config(tmp_path / "plain", *common))
    graphs, _ = run(small_config(tmp_path / "graphs", *common, "trainer.cuda_graphs=true"))
    assert len(graphs) == len(plain) == 4
    torch.testing.assert_close(torch.tensor(graphs), torch.tensor(plain), rtol=1e-3, atol=1e-3)


HYBRID = ["parallel=ddp", "parallel.sp=4", "parallel.sp_mode=hybrid", "parallel.ulysses=2"]


@pytest.mark.parametrize(
    "world, overrides, match",
    [
        # the third check was dead: sp=2 on one process failed as "does not divide the world size 1"
        (1, ["parallel.sp=2"], r"parallel.sp=2 needs 2 processes or a multiple of it"),
        (3, ["parallel=ddp", "parallel.sp=2"], r"parallel.sp=2 does not divide the world size 3"),
        (2, ["parallel.strategy=none"], r"launched with 2 processes but parallel.strategy=none"),
        (4, [*HYBRID, "model.n_head=1"], r"model.n_head=1 is not divisible by .*parallel.ulysses=2 "),
        # 66 tokens split over the 2 ring ranks, but their 33-token shards not over the 2 Ulysses ranks each
        (4, [*HYBRID, "parallel.sp_layout=contiguous", "trainer.seq_len=66"], r"seq_len=66 .* multiple of 4"),
        (
            4,
            ["parallel=fsdp", "parallel.reshard_after_forward=3"],
            r"reshard_after_forward=3 must divide the 4",
        ),
    ],
)
def test_bad_degrees_fail_before_the_process_group(tmp_path, monkeypatch, world, overrides, match):
    """The degree and split checks read only the config and torchrun's WORLD_SIZE, before any process
    group: here no group is made (every rank of a real launch raises alike, tests/distributed/
    test_data_parallel.py); without the check the trainer would fail asking torch for RANK instead."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.delenv("RANK", raising=False)  # so that a missed check fails at once, without a rendezvous
    with pytest.raises(ValueError, match=match):
        Trainer(small_config(tmp_path, *overrides))


@pytest.mark.parametrize(
    "overrides, summary",
    [
        ([], "auto"),
        (
            ["parallel.sp_mode=ulysses", "parallel.sp_layout=contiguous"],
            "auto (parallel.sp_mode=ulysses, parallel.sp_layout=contiguous unused at sp=1)",
        ),
        (["model.block_sparse_block=64"], "auto (model.block_sparse_block=64 unused by auto)"),
        # the butterfly takes no density; the random layout takes it and no band
        (
            ["model.attention=block_sparse", "model.block_sparse_block=16", "model.block_sparse_density=0.5"],
            "block_sparse (model.block_sparse_density=0.5 unused by block_sparse, butterfly layout)",
        ),
        (
            [
                "model.attention=block_sparse",
                "model.block_sparse_block=16",
                "model.block_sparse_kind=random",
                "model.block_sparse_density=0.5",
                "model.block_sparse_local=2",
            ],
            "block_sparse (model.block_sparse_local=2 unused by block_sparse, random layout)",
        ),
    ],
)
def test_settings_the_attention_does_not_read_are_said(tmp_path, overrides, summary):
    trainer = Trainer(small_config(tmp_path, *overrides))
    try:
        assert trainer._attention_summary() == summary
    finally:
        trainer.close()


def test_wandb_offline_run_directory_and_stable_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = small_config(tmp_path, "trainer.run_name=tracked", "logger.kind=wandb", "trainer.max_steps=2")
    run(cfg)
    cfg = small_config(
        tmp_path,
        "trainer.run_name=tracked",
        "logger.kind=wandb",
        "trainer.max_steps=4",
        "trainer.resume=true",
    )
    run(cfg)
    wandb_dir = f"{tmp_path}/runs/tracked/wandb"
    runs = sorted(d for d in os.listdir(wandb_dir) if d.startswith("offline-run-"))
    from flashtrain.tracking import run_id

    assert len(runs) == 2 and all(
        run_id("tracked") in r for r in runs
    )  # the same W&B run, twice (W&B suffixes a second directory made in the same second with "-1")
    files = os.listdir(os.path.join(wandb_dir, runs[-1]))
    assert any(f.endswith(".wandb") for f in files)


def test_preemption_signal_checkpoints_and_resume_finishes_the_same(tmp_path):
    import signal

    straight, _ = run(small_config(tmp_path, "trainer.run_name=whole", "trainer.checkpoint_interval=0"))
    trainer = Trainer(small_config(tmp_path, "trainer.run_name=pre", "trainer.checkpoint_interval=0"))
    trainer.step_hooks.append(lambda t, step: step == 3 and os.kill(os.getpid(), signal.SIGUSR1))
    history = trainer.fit()
    assert (
        trainer.preempted and len(history) == 3
    )  # stopped right after the signal, outside Slurm: no requeue
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000003"
    resumed, _ = run(
        small_config(tmp_path, "trainer.run_name=pre", "trainer.checkpoint_interval=0", "trainer.resume=true")
    )
    assert resumed == straight


def test_preemption_signal_during_setup_stops_after_the_first_step(tmp_path):
    """A signal that arrives before the loop starts (data and model still loading) is not lost."""
    import signal

    trainer = Trainer(small_config(tmp_path, "trainer.run_name=early", "trainer.checkpoint_interval=0"))
    os.kill(os.getpid(), signal.SIGUSR1)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert trainer.preempted and len(history) == 1
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000001"


def test_time_limit_checkpoints_and_resume_finishes_the_same(tmp_path, monkeypatch):
    """trainer.time_limit_s (fixed-length leases): past it the run checkpoints and stops like a
    preempted one, without asking Slurm to requeue; resume=auto continues to the same result."""
    straight, _ = run(small_config(tmp_path, "trainer.run_name=whole", "trainer.checkpoint_interval=0"))
    leased = ("trainer.run_name=leased", "trainer.checkpoint_interval=0", "trainer.resume=auto")
    requeues = []
    monkeypatch.setattr("flashtrain.trainer.requeue_slurm_job", lambda: requeues.append(1))
    history, trainer = run(small_config(tmp_path, *leased, "trainer.time_limit_s=1e-6"))
    assert trainer.preempted and trainer.preemption.reason == "time limit" and len(history) == 1
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000001"
    assert not requeues  # a time limit is not a preemption: nothing asks Slurm to requeue
    resumed, trainer = run(small_config(tmp_path, *leased, "trainer.time_limit_s=3600"))
    assert not trainer.preempted and resumed == straight  # the history is restored with the checkpoint


@pytest.mark.parametrize("value", ["0", "-5"])
def test_time_limit_must_be_positive(tmp_path, value):
    with pytest.raises(ValueError, match="trainer.time_limit_s"):
        small_config(tmp_path, f"trainer.time_limit_s={value}")


def test_garbage_is_collected_on_the_step_schedule_during_fit(tmp_path, monkeypatch):
    """trainer.gc_every: automatic collection is off while fit() trains, a young-generation collection
    runs every gc_every steps, and Python's own schedule is back afterwards."""
    import gc

    collections, enabled_in_steps = [], []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or real_collect(*a))
    trainer = Trainer(small_config(tmp_path, "trainer.gc_every=2", "trainer.checkpoint_interval=0"))
    trainer.step_hooks.append(lambda _, step: enabled_in_steps.append(gc.isenabled()))
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert enabled_in_steps == [False] * 6
    assert collections.count((1,)) == 3  # after steps 2, 4 and 6
    assert gc.isenabled()


@pytest.mark.parametrize("every, enabled_inside", [(0, True), (3, False)])
def test_scheduled_gc_restores_automatic_collection(every, enabled_inside):
    import gc

    from flashtrain.gc_schedule import scheduled_gc

    assert gc.isenabled()
    with pytest.raises(KeyError), scheduled_gc(every) as collect_after:  # also when a step raises
        collect_after(3)
        assert gc.isenabled() is enabled_inside
        raise KeyError
    assert gc.isenabled()


def test_gc_every_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="trainer.gc_every"):
        small_config(tmp_path, "trainer.gc_every=-1")
