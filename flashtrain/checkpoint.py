"""Checkpoints: written atomically, loaded with `weights_only=True`.

Layout of a run directory:

    <run_dir>/checkpoints/step_0000300/model.safetensors   model weights (tied embeddings kept tied)
    <run_dir>/checkpoints/step_0000300/train_state.pt      optimizer, step, data position, RNG states
    <run_dir>/checkpoints/step_0000300/meta.json           model config, tokenizer, full run config
    <run_dir>/checkpoints/latest                           name of the newest complete checkpoint

A checkpoint is written into a temporary directory (each file fsynced, meta.json last: a step directory
with its meta.json is complete) and renamed into place, and `latest` is replaced atomically after it,
so a run killed at any moment leaves the previous checkpoint intact. Re-saving a step moves the old
directory aside before the new one is renamed in, and `latest_checkpoint` reads the aside copy while
the step's own directory is missing. A run killed before its first `latest` was written resumes from
its newest complete step directory.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import asdict, fields
from types import SimpleNamespace

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_model

from flashtrain.log import get_logger
from flashtrain.models.gpt import GPT, GPTConfig

log = get_logger()

LATEST = "latest"
META = "meta.json"  # written last: its presence marks a complete checkpoint
REPLACED = ".replaced-"  # prefix of a step directory moved aside while the same step is saved again


def checkpoint_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def checkpoint_name(step: int) -> str:
    """The directory name of step `step`'s checkpoint under `checkpoint_root` (sorts by step)."""
    return f"step_{step:07d}"


def saved_steps(run_dir: str) -> list[str]:
    """Names of a run's step directories, oldest first (`checkpoint_name` sorts by step); the
    directories a save renamed into place, complete unless damaged since (see `complete_steps`)."""
    root = checkpoint_root(run_dir)
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if d.startswith("step_"))


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, META))


def complete_steps(run_dir: str) -> list[str]:
    """Names of the step directories that hold their meta.json, oldest first."""
    root = checkpoint_root(run_dir)
    return [d for d in saved_steps(run_dir) if is_complete(os.path.join(root, d))]


def _replaced_copy(root: str, name: str) -> str | None:
    """The complete copy of step `name` that a re-save moved aside and has not yet replaced, if any."""
    for d in sorted(os.listdir(root)):
        if d.startswith(f"{REPLACED}{name}-") and is_complete(os.path.join(root, d)):
            return os.path.join(root, d)
    return None


def latest_checkpoint(run_dir: str) -> str | None:
    """Path of the newest complete checkpoint of a run, or None when the run has none.

    Without a `latest` pointer (a run killed between its first checkpoint's rename and the pointer
    write) this is the newest complete step directory: starting over would overwrite and prune them."""
    root = checkpoint_root(run_dir)
    pointer = os.path.join(root, LATEST)
    if not os.path.exists(pointer):
        steps = complete_steps(run_dir)
        if not steps:
            return None
        log.warning(f"{pointer} is missing; using the newest complete checkpoint, {steps[-1]}")
        return os.path.join(root, steps[-1])
    with open(pointer) as f:
        name = f.read().strip()
    path = os.path.join(root, name)
    if os.path.isdir(path):
        return path
    replaced = _replaced_copy(root, name)  # killed while re-saving this step: its old copy is intact
    if replaced is not None:
        return replaced
    steps = complete_steps(run_dir)
    hint = f"; write the name of a complete one into it (e.g. echo {steps[-1]} > {pointer})" if steps else ""
    raise ValueError(
        f"{pointer} names {path}, which does not exist; the checkpoint directory was edited by hand{hint}"
    )


def _fsync(path: str) -> None:
    """Flush a file's (or a directory's entries') data to disk: a rename is atomic, but without this
    a crash can leave the renamed file empty or truncated. One call per file, after it is written."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: str, step: int, model: torch.nn.Module, train_state: dict, meta: dict, keep: int = 2
) -> str:
    """Write a checkpoint for `step` and point `latest` at it; keep the newest `keep` checkpoints.

    `model` is the plain single-device module (unwrap DDP/FSDP before calling); `train_state`
    holds only tensors and plain Python values so it loads with weights_only=True.
    """
    root = checkpoint_root(run_dir)
    os.makedirs(root, exist_ok=True)
    name = checkpoint_name(step)
    final = os.path.join(root, name)
    tmp = os.path.join(root, f".tmp-{name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_model(model, os.path.join(tmp, "model.safetensors"))
    torch.save(train_state, os.path.join(tmp, "train_state.pt"))
    for file in ("model.safetensors", "train_state.pt"):
        _fsync(os.path.join(tmp, file))
    with open(os.path.join(tmp, META), "w") as f:  # last: marks the directory complete
        json.dump(meta, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    _fsync(tmp)
    _publish(root, tmp, name)
    # Only checkpoints older than this one make room: one of a later step cannot be this run's (it was
    # left by another run), and the newest `keep` by number could otherwise exclude this very checkpoint.
    older = [d for d in saved_steps(run_dir) if d < name]
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


def _publish(root: str, tmp: str, name: str) -> None:
    """Rename the written directory `tmp` to `name` and point `latest` at it. A step saved again (e.g. a
    checkpoint at the step a resumed run starts from) is replaced without a moment in which `latest`
    resolves to no complete checkpoint: the old copy is renamed aside (`latest_checkpoint` reads it
    until the new one is in place), and deleted only after `latest` names the new one."""
    final = os.path.join(root, name)
    if os.path.exists(final):
        aside = os.path.join(root, f"{REPLACED}{name}-{os.getpid()}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync(root)  # the renames themselves reach the disk before `latest` names them
    _write_text_atomic(os.path.join(root, LATEST), name)
    # now that `latest` names a directory that exists, no copy set aside (this one, or one a killed
    # save left) is read any more
    for d in os.listdir(root):
        if d.startswith(REPLACED):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


# What reading a damaged file raises: torch's zip reader (RuntimeError "PytorchStreamReader failed"),
# a cut pickle (EOFError, UnpicklingError), safetensors' header check, a cut JSON, a missing file.
DAMAGE_ERRORS = (OSError, EOFError, RuntimeError, pickle.UnpicklingError, SafetensorError, ValueError)


class DamagedCheckpointError(ValueError):
    pass


def damaged(path: str, what: str, error: BaseException) -> DamagedCheckpointError:
    """One error for an unreadable checkpoint file: which, why, and the previous complete checkpoint
    to resume from instead."""
    root, name = os.path.split(os.path.normpath(path))
    older = [d for d in complete_steps(os.path.dirname(root)) if d < name]
    if older:
        previous = os.path.join(root, older[-1])
        advice = (
            f"the previous complete checkpoint is {previous}: resume from it by pointing {root}/{LATEST} at "
            f"it (echo {older[-1]} > {root}/{LATEST}) and deleting {path}"
        )
    else:
        advice = (
            f"there is no earlier complete checkpoint in {root}; start a new run (another trainer.run_name)"
        )
    return DamagedCheckpointError(
        f"checkpoint {path} is damaged: its {what} cannot be read ({type(error).__name__}: {error}); {advice}"
    )


def read_meta(path: str) -> dict:
    try:
        with open(os.path.join(path, META)) as f:
            return json.load(f)
    except DAMAGE_ERRORS as e:  # JSONDecodeError is a ValueError
        raise damaged(path, META, e) from e


def read_train_state(path: str) -> dict:
    """train_state.pt of checkpoint `path` (weights_only), or a DamagedCheckpointError."""
    try:
        return torch.load(os.path.join(path, "train_state.pt"), weights_only=True, map_location="cpu")
    except DAMAGE_ERRORS as e:
        raise damaged(path, "train_state.pt", e) from e


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors in checkpoint `path`, or a DamagedCheckpointError."""
    try:
        return load_file(os.path.join(path, "model.safetensors"))
    except DAMAGE_ERRORS as e:
        raise damaged(path, "model.safetensors", e) from e


def _load_weights_into(model: torch.nn.Module, path: str) -> None:
    try:
        load_model(model, os.path.join(path, "model.safetensors"))
    except (OSError, SafetensorError) as e:  # not RuntimeError: that is a model that does not match
        raise damaged(path, "model.safetensors", e) from e


def check_same_model(saved: dict, current: GPTConfig, path: str) -> None:
    """A resume must load weights into the model that wrote them; name every field that differs."""
    now = asdict(current)
    diff = {k: (saved.get(k), now[k]) for k in now if saved.get(k) != now[k]}
    if diff:
        lines = ", ".join(f"model.{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"checkpoint {path} was written by a different model ({lines}); resume with the same model "
            "config, or start a new run (another trainer.run_name)"
        )


# The task settings a resume must keep, per task kind: those that choose the data (generator seed and
# split sizes: a changed size generates other examples and reshuffles the epochs) or the model's shape
# (resolution sets the position grid, pooling and positions the head and its parameters; the number of
# classes follows from the kind). num_proc, cache_dir and init_from (the checkpoint's weights replace
# what it loaded) may change. The LM task reads its data settings from `data`, which the data sampler
# checks on resume.
_CLASSIFICATION_KEYS = ("kind", "n_train", "n_val", "n_test", "data_seed", "pooling", "positions")
RESUME_TASK_KEYS = {
    "lm": ("kind",),
    "listops": _CLASSIFICATION_KEYS,
    "pathfinder": (*_CLASSIFICATION_KEYS, "resolution"),
}


def _resolved_task(task: dict) -> dict:
    """The task settings as they act: unset split sizes are LRA's sizes, so null and the size it
    stands for compare equal."""
    if task.get("kind") in ("listops", "pathfinder"):
        from flashtrain.tasks.classification import split_sizes

        fields = {k: task.get(k) for k in ("kind", "n_train", "n_val", "n_test")}
        task = {**task, **split_sizes(SimpleNamespace(**fields))}
    return task


def check_same_task(saved: dict | None, current, path: str) -> None:
    """A resume must continue on the same data with the same model: name every task setting that differs."""
    # a key the checkpoint lacks (written before it existed) had its default; no task section: an LM run
    defaults = {f.name: f.default for f in fields(current)}
    old, now = _resolved_task({**defaults, **(saved or {})}), _resolved_task(asdict(current))
    keys = RESUME_TASK_KEYS[now["kind"]] if old.get("kind") == now["kind"] else ("kind",)
    diff = [f"task.{k}: checkpoint {old.get(k)!r} vs config {now[k]!r}" for k in keys if old.get(k) != now[k]]
    if diff:
        raise ValueError(
            f"checkpoint {path} was written for another task ({', '.join(diff)}); resume with the checkpoint's "
            "values, or start a new run (another trainer.run_name)"
        )


def load_checkpoint(path: str, model: torch.nn.Module) -> dict:
    """Load weights into `model` (plain module) and return the training state (weights_only)."""
    _load_weights_into(model, path)
    return read_train_state(path)


def checkpoint_of(run_or_checkpoint: str) -> str | None:
    """A checkpoint directory as given, or a run directory's latest checkpoint; None when it has none."""
    if os.path.exists(os.path.join(run_or_checkpoint, META)):
        return run_or_checkpoint
    return latest_checkpoint(run_or_checkpoint)


def load_model_for_inference(run_or_checkpoint: str, device: str = "cpu") -> tuple[GPT, str]:
    """Build the model a checkpoint (or a run's latest) was trained with; returns (model, tokenizer name)."""
    path = checkpoint_of(run_or_checkpoint)
    if path is None:
        raise ValueError(
            f"no checkpoint in {run_or_checkpoint}; pass a run directory or a checkpoint directory"
        )
    meta = read_meta(path)
    model = GPT(GPTConfig(**meta["model"]))
    _load_weights_into(model, path)
    return model.to(device).eval(), meta["tokenizer"]
