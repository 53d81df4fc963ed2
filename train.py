"""Train a GPT: `python train.py` runs the offline default; `python train.py experiment=<name>` a real run.

Hydra composes configs/ into the typed TrainConfig (flashtrain/config.py); any key can be overridden
on the command line (`trainer.max_steps=50 model.n_layer=2`), and `-m` sweeps (`-m optim.lr=1e-3,3e-4`).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from flashtrain.config import register_configs, sweep_member_name, to_train_config

register_configs()


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    from flashtrain.trainer import Trainer

    cfg = to_train_config(dict_cfg)
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # Each sweep member gets its own run directory and W&B run, stable across requeues; an
        # over-long name ends in a hash of the overrides (flashtrain/config.py: sweep_member_name).
        cfg.trainer.run_name = sweep_member_name(
            cfg.trainer.run_name, hydra_cfg.job.override_dirname, hydra_cfg.job.num
        )
    trainer = Trainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    return history[-1]  # the sweeper's objective


if __name__ == "__main__":
    main()
