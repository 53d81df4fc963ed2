"""The typed run configuration: one dataclass per component, composed here and registered with Hydra.

Each component's config lives beside the component (GPTConfig in models/gpt.py, LMDataConfig in
data/lm.py, ...). Hydra merges the YAML files of `configs/` into this schema, so an unknown key or a
value of the wrong type stops the run with a message naming the key.
"""

from __future__ import annotations

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


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Hydra's DictConfig -> dataclasses; each component's __post_init__ validates its values here."""
    return OmegaConf.to_object(cfg)


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
