"""The typed run configuration: one dataclass per component, composed here and registered with Hydra.

Each component's config lives beside the component (GPTConfig in models/gpt.py, LMDataConfig in
data/lm.py, ...). Hydra merges the YAML files of `configs/` into this schema, so an unknown key or a
value of the wrong type stops the run with a message naming the key. Keys added with `+key=value`
bypass Hydra's own check; `to_train_config` refuses those it does not know (`unknown_keys`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
import typing
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from data.lm import LMDataConfig
from flashtrain.models.gpt import GPTConfig
from flashtrain.optim import OptimConfig
from flashtrain.parallelize import ParallelConfig
from flashtrain.tasks import TaskConfig
from flashtrain.tracking import LoggerConfig
from flashtrain.trainer_config import TrainerConfig

# Longest run name a sweep member gets (a directory name: most file systems stop at 255 bytes, and
# the run directory's path must also fit under PATH_MAX with its checkpoints). See sweep_member_name.
MAX_SWEEP_RUN_NAME = 120


@dataclass
class TrainConfig:
    """A whole training run."""

    model: GPTConfig = field(default_factory=GPTConfig)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    def __post_init__(self):
        self.check_unused_task_settings()

    def check_unused_task_settings(self) -> None:
        """Every task.* field but `kind` is read only by the LRA classification tasks; under task.kind=lm
        one that differs from its default was set for nothing (e.g. task.init_from), so say so."""
        if self.task.kind != "lm":
            return
        default = TaskConfig()
        unused = [
            f"task.{f.name}={getattr(self.task, f.name)!r}"
            for f in dataclasses.fields(TaskConfig)
            if f.name != "kind" and getattr(self.task, f.name) != getattr(default, f.name)
        ]
        if unused:
            raise ValueError(
                f"{', '.join(unused)}: only the LRA classification tasks (task.kind=listops or pathfinder) "
                "read this, and task.kind=lm; remove it, or choose an LRA task (experiment=lra/...)"
            )


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def _nested_schema(hint) -> type | None:
    """The dataclass a field holds (also through `X | None`), or None for a plain value."""
    if dataclasses.is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), None)


def _schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Dotted paths of every field of `schema`, nested dataclasses included."""
    hints = typing.get_type_hints(schema)
    paths = []
    for f in dataclasses.fields(schema):
        paths.append(prefix + f.name)
        sub = _nested_schema(hints[f.name])
        if sub is not None:
            paths += _schema_keys(sub, f"{prefix}{f.name}.")
    return paths


def _unknown_paths(node: dict, schema: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(schema)
    names = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key, value in node.items():
        if key not in names:
            found.append(f"{prefix}{key}")
            continue
        sub = _nested_schema(hints[key])
        if sub is not None and isinstance(value, dict):
            found += _unknown_paths(value, sub, f"{prefix}{key}.")
    return found


def _closest(path: str, known: list[str]) -> str | None:
    """The known key most like `path`: a sibling first (`trainer.max_step` -> `trainer.max_steps`),
    else the same field name anywhere (`trainer.lr` -> `optim.lr`)."""
    parent, _, name = path.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(name, list(siblings), n=1)
    if match:
        return siblings[match[0]]
    # stricter away from the siblings: a near miss there is more likely a coincidence
    anywhere = difflib.get_close_matches(name, [k.rpartition(".")[2] for k in known], n=1, cutoff=0.8)
    return next(k for k in known if k.rpartition(".")[2] == anywhere[0]) if anywhere else None


def unknown_keys(cfg: DictConfig, schema: type = TrainConfig) -> list[str]:
    """Dotted paths of the keys in `cfg` that no field of `schema` declares.

    Hydra refuses an unknown `key=value`, but `+key=value` adds the key to the structured config and
    OmegaConf.to_object keeps it as a stray attribute that nothing reads. Hydra's own `hydra` node is
    the one legitimate key outside the schema (present only when composed with return_hydra_config);
    the `defaults` list is consumed by composition and never reaches here.
    """
    tree = OmegaConf.to_container(cfg, resolve=False)
    tree.pop("hydra", None)
    return _unknown_paths(tree, schema, "")


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Hydra's DictConfig -> dataclasses; unknown keys are refused here, and each component's
    __post_init__ validates its values."""
    unknown = unknown_keys(cfg)
    if unknown:
        known = _schema_keys(TrainConfig)
        described = []
        for path in unknown:
            match = _closest(path, known)
            described.append(f"{path} (did you mean {match}?)" if match else f"{path} (no similar key)")
        raise ValueError(
            f"unknown config key{'s' if len(unknown) > 1 else ''}: {', '.join(described)}. The schema has "
            "no such setting, so it would be ignored; fix the name and drop the '+' of the override"
        )
    return OmegaConf.to_object(cfg)


def sweep_member_name(run_name: str, override_dirname: str, job_num: int) -> str:
    """A sweep member's run name: `<run_name>-<its overrides>`, stable across requeues.

    `override_dirname` is Hydra's `key=value,...` of the member's command-line overrides, minus the
    keys configs/config.yaml excludes (those that only say where things go). Characters other than
    letters, digits and `_.=,-` become `_`. A name longer than MAX_SWEEP_RUN_NAME keeps a readable head
    of the overrides and ends in a hash of the whole override string, so it stays unique and fits a
    directory name.
    """
    suffix = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", override_dirname) or str(job_num)
    name = f"{run_name}-{suffix}"
    if len(name) <= MAX_SWEEP_RUN_NAME:
        return name
    digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:12]
    head = suffix[: max(0, MAX_SWEEP_RUN_NAME - len(run_name) - len(digest) - 2)]
    return f"{run_name}-{head}-{digest}" if head else f"{run_name}-{digest}"


def compose_config(overrides: list[str] | None = None, config_dir: str | None = None) -> TrainConfig:
    """The TrainConfig `python train.py <overrides>` would run with (for tests and notebooks)."""
    import os

    from hydra import compose, initialize_config_dir

    register_configs()
    config_dir = config_dir or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"
    )
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=overrides or []))
