"""Checkpoints: written atomically, loaded with `weights_only=True`.

Layout of a run directory:

    <run_dir>/checkpoints/step_0000300/model.safetensors   model weights (tied embeddings kept tied)
    <run_dir>/checkpoints/step_0000300/train_state.pt      optimizer, step, data position, RNG states
    <run_dir>/checkpoints/step_0000300/meta.json           model config, tokenizer, full run config
    <run_dir>/checkpoints/latest                           name of the newest complete checkpoint

A checkpoint is written into a temporary directory and renamed into place, and `latest` is replaced
atomically after it, so a run killed at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict

import torch
from safetensors.torch import load_model, save_model

from flashtrain.models.gpt import GPT, GPTConfig

LATEST = "latest"


def checkpoint_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def checkpoint_name(step: int) -> str:
    """The directory name of step `step`'s checkpoint under `checkpoint_root` (sorts by step)."""
    return f"step_{step:07d}"


def saved_steps(run_dir: str) -> list[str]:
    """Names of a run's complete checkpoints, oldest first (`checkpoint_name` sorts by step)."""
    root = checkpoint_root(run_dir)
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if d.startswith("step_"))


def latest_checkpoint(run_dir: str) -> str | None:
    """Path of the newest complete checkpoint of a run, or None."""
    pointer = os.path.join(checkpoint_root(run_dir), LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        path = os.path.join(checkpoint_root(run_dir), f.read().strip())
    if not os.path.isdir(path):
        raise ValueError(
            f"{pointer} names {path}, which does not exist; the checkpoint directory was edited by hand"
        )
    return path


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
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
    if os.path.exists(final):  # re-saving the same step (e.g. a requeue right after a save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(os.path.join(root, LATEST), name)
    # Only checkpoints older than this one make room: one of a later step cannot be this run's (it was
    # left by another run), and the newest `keep` by number could otherwise exclude this very checkpoint.
    older = [d for d in saved_steps(run_dir) if d < name]
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


def read_meta(path: str) -> dict:
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)


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


def load_checkpoint(path: str, model: torch.nn.Module) -> dict:
    """Load weights into `model` (plain module) and return the training state (weights_only)."""
    load_model(model, os.path.join(path, "model.safetensors"))
    return torch.load(os.path.join(path, "train_state.pt"), weights_only=True, map_location="cpu")


def load_model_for_inference(run_or_checkpoint: str, device: str = "cpu") -> tuple[GPT, str]:
    """Build the model a checkpoint (or a run's latest) was trained with; returns (model, tokenizer name)."""
    path = run_or_checkpoint
    if not os.path.exists(os.path.join(path, "meta.json")):
        path = latest_checkpoint(run_or_checkpoint)
        if path is None:
            raise ValueError(
                f"no checkpoint in {run_or_checkpoint}; pass a run directory or a checkpoint directory"
            )
    meta = read_meta(path)
    model = GPT(GPTConfig(**meta["model"]))
    load_model(model, os.path.join(path, "model.safetensors"))
    return model.to(device).eval(), meta["tokenizer"]
