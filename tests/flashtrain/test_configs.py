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

from flashtrain.config import MAX_SWEEP_RUN_NAME, compose_config, sweep_member_name, unknown_keys
from flashtrain.models.classifier import SequenceClassifier
from flashtrain.models.gpt import GPT
from flashtrain.tasks.classification import classifier_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = sorted(
    os.path.relpath(p, f"{ROOT}/configs/experiment")[: -len(".yaml")]
    for p in glob.glob(f"{ROOT}/configs/experiment/**/*.yaml", recursive=True)
)
MODELS = sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{ROOT}/configs/model/*.yaml"))


def _group(name: str) -> list[str]:
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{ROOT}/configs/{name}/*.yaml"))


def _debug_for(experiment: str) -> str:
    return "lra_cpu" if experiment.startswith("lra/") else "cpu"  # LRA tasks shrink their images too


# Every preset a run can select: the default, each experiment alone and with its debug preset, each
# option of the other groups, and the sweep presets. Each must pass the unknown-key and unused-setting
# checks as well as composition.
PRESETS = (
    [[], ["debug=cpu"]]
    + [[f"experiment={e}"] for e in EXPERIMENTS]
    + [[f"experiment={e}", f"debug={_debug_for(e)}"] for e in EXPERIMENTS]
    + [[f"data={d}"] + (["data.path=/tmp/corpus"] if d == "files" else []) for d in _group("data")]
    + [[f"{g}={o}"] for g in ("logger", "parallel", "optim", "trainer") for o in _group(g)]
    + [[f"+sweep={s}"] for s in _group("sweep")]
)


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

    debug = _debug_for(experiment)
    cfg = compose_config(
        [
            f"experiment={experiment}",
            f"debug={debug}",
            f"trainer.out_dir={tmp_path}",
            f"data.cache_dir={tmp_path}/c",
            # task.* is read only by the LRA tasks (and refused under task.kind=lm)
            *([f"task.cache_dir={tmp_path}/lra"] if experiment.startswith("lra/") else []),
        ]
    )
    trainer = Trainer(cfg)
    history = trainer.fit()
    assert len(history) == cfg.trainer.max_steps and all(map(torch.isfinite, torch.tensor(history)))


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigCompositionException, match="model.n_layers"):
        compose_config(["model.n_layers=3"])


@pytest.mark.parametrize("overrides", PRESETS, ids=lambda o: " ".join(o) or "default")
def test_every_preset_composes(overrides):
    """Including with Hydra's own `hydra` node, the one legitimate key outside the schema."""
    from hydra import compose, initialize_config_dir

    compose_config(overrides)
    with initialize_config_dir(config_dir=f"{ROOT}/configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    assert unknown_keys(cfg) == []


def test_added_unknown_keys_are_refused_with_the_closest_key():
    """`+key=value` bypasses Hydra's own check; the typos used to be ignored (3 steps, byte tokenizer)."""
    with pytest.raises(ValueError, match="unknown config keys") as err:
        compose_config(["+trainer.max_step=10", "+data.tokenzier=gpt2", "+foo=1", "+trainer.lr=1"])
    message = str(err.value)
    for expected in (
        "trainer.max_step (did you mean trainer.max_steps?)",
        "data.tokenzier (did you mean data.tokenizer?)",
        "foo (no similar key)",
        "trainer.lr (did you mean optim.lr?)",
    ):
        assert expected in message, message


def test_added_nested_unknown_key_is_named_once():
    with pytest.raises(ValueError, match=r"unknown config key: model\.extra \(no similar key\)"):
        compose_config(["+model.extra={a: 1, b: 2}"])


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["task.init_from=/nonexistent/run"], "task.init_from='/nonexistent/run'"),
        (["task.resolution=64", "task.pooling=cls"], "task.resolution=64, task.pooling='cls'"),
        (["debug=lra_cpu"], "task.n_train=32"),  # the LRA debug preset on the default LM run
    ],
)
def test_task_settings_are_refused_for_lm(overrides, named):
    """Every task.* field but kind is read only by the LRA tasks; under task.kind=lm they were ignored."""
    with pytest.raises(ValueError, match="only the LRA classification tasks") as err:
        compose_config(overrides)
    assert named in str(err.value)


def test_task_settings_are_accepted_for_lra():
    cfg = compose_config(["experiment=lra/pathx", "task.init_from=/elsewhere/run"])
    assert cfg.task.init_from == "/elsewhere/run"


def _override_dirname(overrides: list[str]) -> str:
    """What Hydra names a job by (hydra.job.override_dirname), with configs/config.yaml's exclusions."""
    from hydra import compose, initialize_config_dir

    from flashtrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=f"{ROOT}/configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    return cfg.hydra.job.override_dirname


def test_sweep_members_on_different_corpora_get_different_names():
    """data.path used to be excluded from the name: both members ran as one run (refused or resumed)."""
    names = {
        sweep_member_name("default", _override_dirname(["data=files", f"data.path=/tmp/z/{d}"]), 0)
        for d in ("tA", "tB")
    }
    assert names == {"default-data.path=_tmp_z_tA,data=files", "default-data.path=_tmp_z_tB,data=files"}
    # where things go still does not name a run
    assert _override_dirname(["trainer.out_dir=/x", "data.cache_dir=/y", "trainer.resume=auto"]) == ""


def test_long_sweep_names_end_in_a_hash_of_the_overrides():
    """~15 overrides used to give a name the file system refused (File name too long)."""
    many = ",".join(f"model.block_sparse_density=0.{i},trainer.seed={i}" for i in range(8))
    name = sweep_member_name("gpt2_small_64k_rotary", many, 3)
    other = sweep_member_name("gpt2_small_64k_rotary", many.replace("seed=7", "seed=8"), 3)
    assert len(name) <= MAX_SWEEP_RUN_NAME and len(other) <= MAX_SWEEP_RUN_NAME
    assert name.startswith("gpt2_small_64k_rotary-model.block_sparse_density=0.0,trainer.seed=0")
    assert name != other and name == sweep_member_name("gpt2_small_64k_rotary", many, 5)  # stable
    assert sweep_member_name("r" * 200, many, 0) == sweep_member_name("r" * 200, many, 1)  # hash only
    # short names stay readable and unchanged, so existing sweeps still resume into their runs
    assert sweep_member_name("default", "optim.lr=0.001", 0) == "default-optim.lr=0.001"
    assert sweep_member_name("default", "", 4) == "default-4"


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
