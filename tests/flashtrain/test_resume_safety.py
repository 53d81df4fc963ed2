"""Resume safety: a kill at any point of a save leaves a checkpoint to resume from, damaged or
mismatched checkpoints fail with one clear error, and resuming never starts over existing checkpoints.
Kills are simulated by making a step of the save raise, not with signals."""

import logging
import os
import shutil

import pytest
import torch

from flashtrain import checkpoint as ckpt
from flashtrain.tasks import TaskConfig
from flashtrain.trainer import Trainer
from tests.flashtrain.test_trainer import KilledError, run, small_config


@pytest.fixture
def warnings_seen(caplog):
    """Messages of the flashtrain logger (which does not propagate to the root logger caplog reads)."""
    logger = logging.getLogger("flashtrain")
    logger.addHandler(caplog.handler)
    yield lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    logger.removeHandler(caplog.handler)


def _save_tiny(run_dir: str, step: int, weight: float) -> str:
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, weight)
    return ckpt.save_checkpoint(run_dir, step, model, {"step": step}, {"step": step}, keep=5)


def _weight(path: str) -> float:
    model = torch.nn.Linear(2, 2)
    ckpt.load_checkpoint(path, model)
    return model.weight[0, 0].item()


# ---- 1. a missing `latest` pointer ----------------------------------------------------------------


def test_a_run_killed_before_its_first_pointer_resumes_from_its_step_directory(tmp_path, monkeypatch):
    """Killed between the first checkpoint's rename and the `latest` write: resume=auto started at step
    0 and then overwrote and pruned the step directories."""
    name = ("trainer.run_name=x", "trainer.checkpoint_interval=3", "trainer.eval_interval=0")

    def killed(path, text):
        raise KilledError

    monkeypatch.setattr(ckpt, "_write_text_atomic", killed)
    with pytest.raises(KilledError):
        run(small_config(tmp_path, *name, "trainer.max_steps=6"))
    monkeypatch.undo()
    run_dir = f"{tmp_path}/runs/x"
    assert ckpt.saved_steps(run_dir) == ["step_0000003"]
    assert not os.path.exists(f"{run_dir}/checkpoints/latest")
    with pytest.raises(ValueError, match="already holds checkpoints"):  # resume=false refuses as before
        Trainer(small_config(tmp_path, *name, "trainer.max_steps=9"))
    resumable = (*name, "trainer.resume=auto", "trainer.max_steps=9", "trainer.keep_checkpoints=1")
    trainer = Trainer(small_config(tmp_path, *resumable))
    assert trainer.step == 3  # not 0
    trainer.fit()
    trainer.close()
    assert ckpt.saved_steps(run_dir) == ["step_0000009"]


def test_the_newest_complete_step_directory_stands_in_for_a_missing_pointer(tmp_path, warnings_seen):
    run_dir = str(tmp_path)
    _save_tiny(run_dir, 3, 1.0)
    _save_tiny(run_dir, 6, 2.0)
    os.remove(f"{run_dir}/checkpoints/latest")
    os.makedirs(f"{run_dir}/checkpoints/step_0000009")  # no meta.json: not complete
    assert ckpt.latest_checkpoint(run_dir) == f"{run_dir}/checkpoints/step_0000006"
    assert any("step_0000006" in m for m in warnings_seen())


def test_only_incomplete_step_directories_are_not_overwritten(tmp_path):
    cfg = small_config(tmp_path, "trainer.run_name=inc", "trainer.resume=auto")
    os.makedirs(f"{tmp_path}/runs/inc/checkpoints/step_0000003")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        Trainer(cfg)


# ---- 2. saving a step twice ----------------------------------------------------------------------


def test_a_stop_on_a_checkpoint_step_saves_it_once(tmp_path, monkeypatch):
    saved = []
    real = ckpt.save_checkpoint

    def counting(run_dir, step, *a, **k):
        saved.append(step)
        return real(run_dir, step, *a, **k)

    monkeypatch.setattr(ckpt, "save_checkpoint", counting)
    cfg = small_config(
        tmp_path, "trainer.run_name=t", "trainer.checkpoint_interval=1", "trainer.time_limit_s=1e-6"
    )
    _, trainer = run(cfg)
    assert trainer.preempted and saved == [1]


def test_a_kill_while_a_step_is_saved_again_leaves_a_complete_latest(tmp_path, monkeypatch):
    """The old save deleted the step's directory before renaming the new one in: killed there, `latest`
    named a missing directory and the run could not resume."""
    run_dir = str(tmp_path)
    _save_tiny(run_dir, 2, 1.0)
    real_replace = os.replace

    def killed_renaming_in(src, dst):
        if os.path.basename(src).startswith(".tmp-step_"):
            raise KilledError
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_renaming_in)
    with pytest.raises(KilledError):
        _save_tiny(run_dir, 2, 2.0)
    monkeypatch.undo()
    path = ckpt.latest_checkpoint(run_dir)
    assert ckpt.is_complete(path) and _weight(path) == 1.0  # the old copy, set aside
    _save_tiny(run_dir, 2, 3.0)  # the next save cleans up
    assert _weight(ckpt.latest_checkpoint(run_dir)) == 3.0
    assert sorted(os.listdir(f"{run_dir}/checkpoints")) == ["latest", "step_0000002"]


def test_saved_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    _save_tiny(str(tmp_path), 1, 1.0)
    names = {os.path.basename(p) for p in synced if ".tmp-step_" in p}
    assert {"model.safetensors", "train_state.pt", "meta.json"} <= names


# ---- 3. the validation split, and saving before evaluating --------------------------------------


def test_a_validation_split_smaller_than_a_batch_fails_at_setup(tmp_path):
    # (the offline corpus is the running Python's standard library: on Python 3.12's the validation split
    # held 300 windows)
    with pytest.raises(ValueError, match=r"validation split .* trainer.batch_size=100000"):
        Trainer(small_config(tmp_path, "trainer.run_name=v", "trainer.batch_size=100000"))


def test_a_failed_evaluation_keeps_the_steps_checkpoint(tmp_path):
    cfg = small_config(
        tmp_path, "trainer.run_name=e", "trainer.eval_interval=2", "trainer.checkpoint_interval=2"
    )
    trainer = Trainer(cfg)

    def failing(*a, **k):
        raise RuntimeError("evaluation failed")

    trainer.task.evaluate = failing
    try:
        with pytest.raises(RuntimeError, match="evaluation failed"):
            trainer.fit()
    finally:
        trainer.close()
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000002"


def test_resume_from_a_step_that_evaluated_repeats_the_losses(tmp_path):
    """Saving before evaluating saves the same state (evaluation draws no random numbers)."""
    every_2 = ("trainer.eval_interval=2", "trainer.checkpoint_interval=2")
    straight, _ = run(small_config(tmp_path, "trainer.run_name=a", *every_2))
    with pytest.raises(KilledError):
        run(small_config(tmp_path, "trainer.run_name=b", *every_2), kill_after=3)
    resumed, _ = run(small_config(tmp_path, "trainer.run_name=b", *every_2, "trainer.resume=true"))
    assert resumed == straight


# ---- 4. a changed task -------------------------------------------------------------------------


def _pathfinder(**changes) -> TaskConfig:
    return TaskConfig(**{"kind": "pathfinder", "n_train": 32, "n_val": 8, "n_test": 8, **changes})


def test_a_changed_task_setting_is_named_with_both_values():
    saved = vars(_pathfinder())
    with pytest.raises(ValueError) as e:
        ckpt.check_same_task(saved, _pathfinder(data_seed=1, pooling="cls", resolution=64), "ck")
    message = str(e.value)
    for part in ("task.data_seed: checkpoint 0 vs config 1", "task.pooling: checkpoint 'mean' vs config 'cls'",
                 "task.resolution: checkpoint 32 vs config 64", "another trainer.run_name"):  # fmt: skip
        assert part in message
    with pytest.raises(ValueError, match="task.n_val: checkpoint 8 vs config 9"):  # other data
        ckpt.check_same_task(saved, _pathfinder(n_val=9), "ck")
    with pytest.raises(ValueError, match="task.kind: checkpoint 'lm' vs config 'pathfinder'"):
        ckpt.check_same_task(None, _pathfinder(), "ck")


def test_task_settings_that_change_neither_data_nor_model_may_change():
    saved = vars(_pathfinder())
    ckpt.check_same_task(saved, _pathfinder(num_proc=4, cache_dir="/elsewhere", init_from="/run"), "ck")
    lra_sizes = TaskConfig(kind="pathfinder")
    ckpt.check_same_task({**vars(lra_sizes), "n_train": 160_000}, lra_sizes, "ck")  # null is LRA's size
    ckpt.check_same_task(None, TaskConfig(resolution=64), "ck")  # the LM task reads no LRA setting
    ckpt.check_same_task({"kind": "pathfinder", "n_train": 32, "n_val": 8, "n_test": 8}, _pathfinder(), "ck")


def test_resuming_an_lra_run_with_another_data_seed_fails_before_loading(tmp_path):
    from flashtrain.config import compose_config

    common = ["experiment=lra/pathfinder32", "debug=lra_cpu", f"trainer.out_dir={tmp_path}",
              f"task.cache_dir={tmp_path}/lra", "trainer.run_name=p", "trainer.max_steps=1"]  # fmt: skip
    run(compose_config(common))
    with pytest.raises(ValueError, match="task.data_seed: checkpoint 0 vs config 1.*trainer.run_name"):
        Trainer(compose_config([*common, "trainer.resume=true", "task.data_seed=1"]))


# ---- 5. damaged checkpoint files -----------------------------------------------------------------


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize(
    "damage, what",
    [
        (lambda d: _truncate(f"{d}/train_state.pt"), "train_state.pt"),
        (lambda d: _truncate(f"{d}/model.safetensors"), "model.safetensors"),
        (lambda d: open(f"{d}/model.safetensors", "wb").close(), "model.safetensors"),
        (lambda d: os.remove(f"{d}/meta.json"), "meta.json"),
    ],
)
def test_a_damaged_checkpoint_names_itself_and_the_previous_one(tmp_path, damage, what):
    name = ("trainer.run_name=d", "trainer.max_steps=4", "trainer.eval_interval=0")
    run(small_config(tmp_path, *name))
    root = f"{tmp_path}/runs/d/checkpoints"
    damage(f"{root}/step_0000004")
    message = (
        rf"{root}/step_0000004 is damaged: its {what} cannot be read .*{root}/step_0000002.*echo step_0000002"
    )
    with pytest.raises(ValueError, match=message):
        Trainer(small_config(tmp_path, *name, "trainer.resume=true"))
    # the advice works: point `latest` at the previous checkpoint and delete the damaged one
    with open(f"{root}/latest", "w") as f:
        f.write("step_0000002")
    shutil.rmtree(f"{root}/step_0000004")
    trainer = Trainer(small_config(tmp_path, *name, "trainer.resume=true"))
    assert trainer.step == 2
    trainer.close()


def test_damage_without_an_earlier_checkpoint_says_to_start_a_new_run(tmp_path):
    path = _save_tiny(str(tmp_path), 1, 1.0)
    _truncate(f"{path}/train_state.pt")
    with pytest.raises(ValueError, match="is damaged.*no earlier complete checkpoint.*trainer.run_name"):
        ckpt.load_checkpoint(path, torch.nn.Linear(2, 2))


# ---- 6. resumes that train nothing or another batch -----------------------------------------------


def test_resume_past_max_steps_says_nothing_is_trained(tmp_path, warnings_seen):
    name = ("trainer.run_name=n", "trainer.max_steps=4", "trainer.eval_interval=0")
    run(small_config(tmp_path, *name))
    history, _ = run(small_config(tmp_path, *name, "trainer.resume=true", "trainer.max_steps=3"))
    assert len(history) == 4
    assert any("already at step 4 >= trainer.max_steps=3" in m for m in warnings_seen())


def test_a_changed_global_batch_on_the_same_world_size_is_warned(tmp_path, warnings_seen):
    name = ("trainer.run_name=g", "trainer.max_steps=2", "trainer.eval_interval=0")
    run(small_config(tmp_path, *name))
    resume = (*name, "trainer.resume=true", "trainer.max_steps=3")

    def batch_warnings():
        return [m for m in warnings_seen() if "global batch changes" in m]

    Trainer(small_config(tmp_path, *resume, "trainer.grad_accum=1")).close()
    assert len(batch_warnings()) == 1 and "from 4 to 2" in batch_warnings()[0]
    Trainer(small_config(tmp_path, *resume, "trainer.batch_size=4", "trainer.grad_accum=1")).close()
    assert len(batch_warnings()) == 1  # the same global batch, split otherwise: nothing to warn about
