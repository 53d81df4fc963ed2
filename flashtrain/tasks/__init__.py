"""What a run learns: a task gives the trainer its model, batches, loss and evaluation.

- `lm` (`tasks/lm.py`): next-token prediction on a tokenised corpus (`data/`), the default;
- `listops`, `pathfinder` (`tasks/classification.py`): Long Range Arena classification on
  procedurally generated data (`data/lra/`).

Each task object offers: `build_model()`, `next_batch()`, `loss(model, x, y)`, `evaluate(...)`,
`sampler` (with state_dict/load_state_dict for exact resume), `tokens_per_batch()`,
`flops_per_token(model)` and `tokenizer_name`.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("lm", "listops", "pathfinder")
POOLINGS = ("mean", "cls")  # what models.classifier.SequenceClassifier implements


@dataclass
class TaskConfig:
    """What the run learns: language modelling, or an LRA classification task."""

    kind: str = "lm"  # "lm", "listops" or "pathfinder"
    resolution: int = 32  # pathfinder: image side (32, 64, 128 = Path-X, 256 = Path-256)
    n_train: int | None = None  # examples per split; None = LRA's sizes (160k/20k/20k, ListOps 96k/2k/2k)
    n_val: int | None = None
    n_test: int | None = None
    data_seed: int = 0  # seed of the generated data set (not of training)
    num_proc: int | None = None  # processes generating the data; None = all cores
    cache_dir: str | None = (
        None  # generated data cache; None = $FLASHTRAIN_DATA_CACHE/lra or ~/.cache/flashtrain/lra
    )
    pooling: str = "mean"  # classifier pooling: "mean" or "cls" (a learned first token)
    positions: str = "learned"  # classifier positions: learned, sincos (fixed), sincos_init (trained), rotary
    init_from: str | None = (
        None  # run or checkpoint directory of a smaller-image model to start from (Path-X)
    )

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task.kind={self.kind!r}; choose lm, listops or pathfinder")
        from flashtrain.models.classifier import POSITIONS

        if self.positions not in POSITIONS:
            raise ValueError(f"task.positions={self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.pooling not in POOLINGS:  # checked here, not after the data are generated
            raise ValueError(f"task.pooling={self.pooling!r}; choose one of {', '.join(POOLINGS)}")
        for name in ("n_train", "n_val", "n_test"):  # an empty split fails later, far from the setting
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 1, or null (LRA's size)")


def build_task(cfg, *, rank: int, world_size: int, dp_rank: int, dp: int):
    """The task object for `cfg.task.kind` (data are prepared here: rank 0 first, then the others)."""
    if cfg.task.kind == "lm":
        from flashtrain.tasks.lm import LMTask

        return LMTask(cfg, rank=rank, world_size=world_size, dp_rank=dp_rank, dp=dp)
    from flashtrain.tasks.classification import ClassificationTask

    return ClassificationTask(cfg, rank=rank, world_size=world_size, dp_rank=dp_rank, dp=dp)
