"""Every config composes into the typed schema; every experiment builds its model and runs its
debug variant; unknown keys and wrong types fail with the key's name."""

import glob
import os
import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from flashtrain.config import compose_config
from flashtrain.models.classifier import SequenceClassifier
from flashtrain.models.gpt import GPT
from flashtrain.tasks.classification import classifier_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = sorted(
    os.path.relpath(p, f"{ROOT}/configs/experiment")[: -len(".yaml")]
    for p in glob.glob(f"{ROOT}/configs/experiment/**/*.yaml", recursive=True)
)
MODELS = sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{ROOT}/configs/model/*.yaml"))


def test_there_are_experiments():
    assert len(EXPERIMENTS) >= 3


def build_on_meta(cfg):
    with torch.device("meta"):
        if cfg.task.kind == "lm":
            cfg.model.vocab_size = cfg.model.vocab_size or 50304
            return GPT(cfg.model)
        return SequenceClassifier(classifier_config(cfg))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_builds_on_meta(experiment):
    cfg = compose_config([f"experiment={experiment}"])
    model = build_on_meta(cfg)
    assert sum(p.numel() for p in model.parameters()) > 1e5
    if cfg.task.kind == "lm":
        assert cfg.trainer.seq_len <= cfg.model.max_seq_len


@pytest.mark.parametrize("model", MODELS)
def test_model_sizes_on_meta(model):
    cfg = compose_config([f"model={model}", "model.vocab_size=50257"])
    with torch.device("meta"):
        n = GPT(cfg.model).num_params()
    expected = {"gpt2_small": 124e6, "gpt2_medium": 350e6, "gpt2_large": 774e6, "gpt2_xl": 1.56e9}
    if model in expected:
        assert abs(n - expected[model]) / expected[model] < 0.03, n


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_debug_variant_trains_on_cpu(experiment, tmp_path):
    from flashtrain.trainer import Trainer

    debug = "lra_cpu" if experiment.startswith("lra/") else "cpu"  # LRA tasks shrink their images too
    cfg = compose_config(
        [
            f"experiment={experiment}",
            f"debug={debug}",
            f"trainer.out_dir={tmp_path}",
            f"data.cache_dir={tmp_path}/c",
            f"task.cache_dir={tmp_path}/lra",
        ]
    )
    trainer = Trainer(cfg)
    history = trainer.fit()
    assert len(history) == cfg.trainer.max_steps and all(map(torch.isfinite, torch.tensor(history)))


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigCompositionException, match="model.n_layers"):
        compose_config(["model.n_layers=3"])


def test_wrong_type_names_the_key():
    with pytest.raises((ValidationError, ConfigCompositionException), match="trainer.max_steps"):
        compose_config(["trainer.max_steps=many"])


@pytest.mark.parametrize("override", ["task.n_train=0", "task.n_val=0", "task.n_test=-1"])
def test_empty_lra_split_is_refused_at_composition(override):
    """An empty split used to fail only when the data were built (an IndexError in the generator)."""
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=rf"{key}=-?\d must be >= 1"):
        compose_config(["experiment=lra/pathfinder32", override])


def test_missing_files_path_is_reported():
    with pytest.raises(Exception, match="data.path"):
        compose_config(["data=files"])


def test_multirun_sweep_runs_each_member(tmp_path):
    """`python train.py -m optim.lr=...` runs one job per value, each in its own run directory."""
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "debug=cpu",
        "optim.lr=1e-3,2e-3",
        "trainer.max_steps=2",
        f"trainer.out_dir={tmp_path}",
        f"data.cache_dir={tmp_path}/c",
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(d for d in os.listdir(tmp_path) if d.startswith("default-"))
    assert runs == [
        "default-debug=cpu,optim.lr=0.001,trainer.max_steps=2",
        "default-debug=cpu,optim.lr=0.002,trainer.max_steps=2",
    ], runs
