"""Experiment tracking through Weights & Biases, offline unless configured otherwise.

The W&B run id is derived from the run name, so a resumed or requeued run appends to the same run.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass


@dataclass
class LoggerConfig:
    """Where metrics go."""

    kind: str = "wandb"  # "wandb" or "none"
    mode: str = "offline"  # W&B mode: "offline" (no network; `wandb sync` later) or "online"
    project: str = "flashtrain"  # W&B project
    entity: str | None = None  # W&B team or user (online mode)

    def __post_init__(self):
        if self.kind not in ("wandb", "none"):
            raise ValueError(
                f"logger.kind={self.kind!r}; choose 'wandb' or 'none' (logger=none turns tracking off)"
            )
        if self.mode not in ("offline", "online"):
            raise ValueError(f"logger.mode={self.mode!r}; choose 'offline' or 'online'")


def run_id(run_name: str) -> str:
    """Stable W&B id for a run name (W&B ids allow only [a-z0-9] and a few symbols)."""
    return hashlib.sha1(run_name.encode()).hexdigest()[:16]


class Tracker:
    def __init__(self, cfg: LoggerConfig, run_name: str, run_dir: str, config: dict, enabled: bool):
        self._run = None
        if cfg.kind == "none" or not enabled:
            return
        import wandb

        os.makedirs(run_dir, exist_ok=True)
        self._run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=run_name,
            id=run_id(run_name),
            resume="allow",
            mode=cfg.mode,
            dir=run_dir,
            config=config,
        )

    @property
    def dir(self) -> str | None:
        return None if self._run is None else self._run.dir

    def log(self, metrics: dict, step: int) -> None:
        if self._run is not None:
            self._run.log(metrics, step=step)

    def finish(self) -> None:
        if self._run is not None:
            import wandb

            self._run.finish()
            # finish() may return before the W&B service has written the run file; teardown waits for
            # the service, so a requeue (Slurm kills the job at once) cannot lose the run's last records.
            wandb.teardown()
            self._run = None
