"""Long Range Arena classification (ListOps, Pathfinder / Path-X / Path-256) as a trainer task.

The data are generated procedurally (`data.lra`), cached through `datasets`, and read in epochs of a
seeded permutation; like the LM window sampler, every data-parallel rank takes its rows of one global
batch, and the position in the stream is saved in checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashtrain.models.classifier import ClassifierConfig, SequenceClassifier
from flashtrain.tasks import TaskConfig


def split_sizes(cfg: TaskConfig) -> dict:
    """{n_train, n_val, n_test} of the task: the config's, else LRA's sizes."""
    defaults = (96_000, 2_000, 2_000) if cfg.kind == "listops" else (160_000, 20_000, 20_000)
    given = (cfg.n_train, cfg.n_val, cfg.n_test)
    n_train, n_val, n_test = (d if g is None else g for g, d in zip(given, defaults, strict=True))
    return dict(n_train=n_train, n_val=n_val, n_test=n_test)


def load_lra_dataset(cfg: TaskConfig):
    from data.lra.dataset import build_listops_dataset, build_pathfinder_dataset

    common = dict(**split_sizes(cfg), seed=cfg.data_seed, num_proc=cfg.num_proc, cache_dir=cfg.cache_dir)
    if cfg.kind == "listops":
        return build_listops_dataset(**common)
    return build_pathfinder_dataset(cfg.resolution, **common)


def classifier_config(cfg, image_size: int | None = None) -> ClassifierConfig:
    """The classifier a run config describes: the model group is its (non-causal) encoder."""
    listops = cfg.task.kind == "listops"
    encoder = replace(cfg.model, causal=False, vocab_size=16 if listops else 256)
    return ClassifierConfig(
        encoder=encoder,
        num_classes=10 if listops else 2,
        image_size=None if listops else (image_size or cfg.task.resolution),
        pooling=cfg.task.pooling,
        positions=cfg.task.positions,
        pad_id=0 if listops else None,
    )


# Label of an evaluation row that pads the last batch: cross_entropy's ignore_index, no class's index.
IGNORE = -100


def init_checkpoint(cfg) -> str:
    """The checkpoint `task.init_from` names (a run's latest, or a checkpoint directory), refused unless
    this run can load its weights: a Pathfinder run with the same weight shapes at a multiple of its
    resolution. Every difference is named at once, with the values on both sides."""
    from flashtrain import checkpoint as ckpt

    given, task = cfg.task.init_from, cfg.task
    if task.kind != "pathfinder":
        raise ValueError(
            f"task.init_from transfers a smaller-image Pathfinder model to larger images; this run is "
            f"task.kind={task.kind}: set task.init_from=null"
        )
    if not os.path.isdir(given):
        raise ValueError(
            f"task.init_from={given} does not exist; give a run directory or one of its checkpoint directories"
        )
    path = ckpt.checkpoint_of(given)
    if path is None:
        raise ValueError(
            f"task.init_from={given} holds no checkpoint (no meta.json, no checkpoints/latest); give a run "
            "directory that wrote one, or a checkpoint directory"
        )
    written = ckpt.read_meta(path).get("config", {})
    diffs = init_from_mismatches(written, cfg)
    if diffs:
        lines = "; ".join(f"{key}: checkpoint {a!r}, this run {b!r}" for key, a, b in diffs)
        resolution = " (task.resolution: a multiple of its)" if diffs[-1][0] == "task.resolution" else ""
        raise ValueError(
            f"task.init_from={given} ({path}) holds a model this run cannot start from: {lines}. Set these "
            f"to the checkpoint's values{resolution}, or point task.init_from at a Pathfinder run trained "
            "with this run's"
        )
    return path


def init_from_mismatches(written: dict, cfg) -> list[tuple[str, object, object]]:
    """(key, checkpoint's value, this run's) for each setting of a run config `written` (a checkpoint's
    meta["config"]) that keeps this run from loading its weights: the task (which fixes the classes and
    the input vocabulary), pooling, positions, and the encoder fields that shape a tensor."""
    old_task = written.get("task") or {"kind": "lm"}  # a config without a task section: an LM run's
    old_model = written.get("model", {})
    task, model = cfg.task, cfg.model
    pairs = [
        ("task.kind", old_task.get("kind", "lm"), task.kind),
        ("task.pooling", old_task.get("pooling", "mean"), task.pooling),
        ("task.positions", old_task.get("positions", "learned"), task.positions),
        *((f"model.{k}", old_model.get(k), getattr(model, k)) for k in ("d_model", "n_layer", "n_head")),
        # None means n_head: compare the key/value heads the weights have
        ("model.n_kv_head", old_model.get("n_kv_head") or old_model.get("n_head"), model.kv_heads),
        ("model.bias", old_model.get("bias", True), model.bias),
    ]
    diffs = [(key, a, b) for key, a, b in pairs if a != b]
    small = old_task.get("resolution")
    if old_task.get("kind") == task.kind and (not isinstance(small, int) or task.resolution % small):
        diffs.append(("task.resolution", small, task.resolution))  # the grid is duplicated k×k
    return diffs


# Bytes of uint8 pixels (all splits) held in memory per process: Pathfinder-32 (205 MB) and Path-64
# (820 MB) fit; Path-X and Path-256 stay in the memory-mapped Arrow files.
PIXELS_IN_MEMORY = 1 << 30


def pixels_in_memory(splits, budget: int = PIXELS_IN_MEMORY) -> dict | None:
    """{split: (images (n, H·H) uint8, labels (n,) int64)} copied out of the Arrow files, or None when
    they exceed `budget` bytes. A training step then gathers its batch with one numpy index (0.3 ms for
    256 Pathfinder-32 images on a 2-core CPU) instead of an Arrow fancy index (3.3 ms); the trainer
    syncs with the GPU every step, so that time is the GPU's idle time."""
    if sum(split.num_rows * split.features["pixels"].length for split in splits.values()) > budget:
        return None
    out = {}
    for name, split in splits.items():
        table = split.with_format("arrow")[:]  # the rows in order (through any indices mapping)
        flat = table.column("pixels").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        images = flat.reshape(split.num_rows, -1)  # uint8, as stored
        labels = table.column("label").to_numpy().astype(np.int64)
        out[name] = (images, labels)
    return out


class EpochSampler:
    """Seeded permutation per epoch; rank r of `world_size` takes rows r·B:(r+1)·B of each global batch."""

    def __init__(self, n: int, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1):
        global_batch = batch_size * world_size
        if n < global_batch:
            raise ValueError(f"{n} training examples are fewer than one global batch of {global_batch}")
        self.n, self.batch_size, self.seed, self.rank, self.world_size = n, batch_size, seed, rank, world_size
        self.epoch, self.pos = 0, 0
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

    def _epoch_order(self) -> np.ndarray:
        # Drawn once per epoch: permuting LRA's 160k training images takes ~2 ms, paid every step
        # before, while the GPU waits for the next batch.
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, np.random.default_rng([self.seed, self.epoch]).permutation(self.n))
        return self._order[1]

    def next_indices(self) -> np.ndarray:
        global_batch = self.batch_size * self.world_size
        if self.pos + global_batch > self.n:  # drop the ragged tail: every step sees a full batch
            self.epoch, self.pos = self.epoch + 1, 0
        order = self._epoch_order()
        rows = order[self.pos : self.pos + global_batch][
            self.rank * self.batch_size : (self.rank + 1) * self.batch_size
        ]
        self.pos += global_batch
        return np.sort(
            rows
        )  # sorted reads are faster from the Arrow file; order within a batch is irrelevant

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['n']} examples / seed {state['seed']}, not {self.n} / {self.seed}; "
                "resume with the same task and trainer.seed"
            )
        self.epoch, self.pos = state["epoch"], state["pos"]


class ClassificationTask:
    """Everything the trainer needs to know about an LRA task."""

    def __init__(self, cfg, *, rank: int, world_size: int, dp_rank: int, dp: int):
        from flashtrain.tasks.lm import rank_zero_first

        self.cfg, self.task = cfg, cfg.task
        if cfg.parallel.sp > 1:
            raise ValueError("LRA classification runs without sequence parallelism; set parallel.sp=1")
        # before the data: generating Path-X takes long, and a wrong init_from would only fail after it
        self.init_checkpoint = None if self.task.init_from is None else init_checkpoint(cfg)
        splits = rank_zero_first(rank, world_size, lambda: load_lra_dataset(self.task))
        for split, setting in (("validation", "task.n_val"), ("test", "task.n_test")):
            if len(splits[split]) == 0:  # the evaluations would report 0.0 for an empty split
                raise ValueError(f"the {split} split is empty; set {setting} >= 1 (or null for LRA's size)")
        self.splits = splits.with_format("numpy")
        self.column = "tokens" if self.task.kind == "listops" else "pixels"
        self.seq_len = cfg.model.max_seq_len if self.task.kind == "listops" else self.task.resolution**2
        self.pixels = pixels_in_memory(splits) if self.task.kind == "pathfinder" else None
        tc = cfg.trainer
        self.sampler = EpochSampler(
            len(self.splits["train"]), tc.batch_size, seed=tc.seed, rank=dp_rank, world_size=dp
        )
        self.dp_rank, self.dp = dp_rank, dp
        self.tokenizer_name = f"lra-{self.task.kind}"

    # ---- model ----------------------------------------------------------------------------------

    def build_model(self) -> SequenceClassifier:
        if self.task.kind == "listops" and self.cfg.model.max_seq_len < 2000:
            raise ValueError("ListOps expressions reach 1999 tokens; set model.max_seq_len >= 2000")
        if self.init_checkpoint is None:
            return SequenceClassifier(classifier_config(self.cfg))
        return self._model_from_smaller_images(self.init_checkpoint)

    def _model_from_smaller_images(self, path: str) -> SequenceClassifier:
        """The checked (`init_checkpoint`) smaller-image model at `path`, its positions upsampled."""
        from safetensors.torch import load_model

        from flashtrain import checkpoint as ckpt

        small = ckpt.read_meta(path)["config"]["task"]["resolution"]
        model = SequenceClassifier(classifier_config(self.cfg, image_size=small))
        load_model(model, os.path.join(path, "model.safetensors"))
        if self.task.resolution > small:
            model.upsample_positions(self.task.resolution // small)
        return model

    # ---- data -----------------------------------------------------------------------------------

    def _batch(self, split: str, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pixels is not None:
            images, labels = self.pixels[split]
            # uint8 as stored: widened on the device by the model (SequenceClassifier.forward)
            return torch.from_numpy(images[rows]), torch.from_numpy(labels[rows])
        batch = self.splits[split][rows]
        labels = torch.as_tensor(batch["label"], dtype=torch.long)
        if self.task.kind == "listops":
            tokens = np.zeros((len(rows), self.seq_len), dtype=np.int64)  # pad id 0
            for i, seq in enumerate(batch["tokens"]):
                tokens[i, : len(seq)] = seq
            return torch.from_numpy(tokens), labels
        return torch.as_tensor(np.asarray(batch["pixels"]), dtype=torch.uint8), labels

    def next_batch(self):
        return self._batch("train", self.sampler.next_indices())

    def eval_batches(self, split: str, max_batches: int | None):
        """The split in order, each rank its share of every global batch; every rank yields the same
        number of full-size batches (a collective model needs each rank's forward), the last global
        batch padded: padding rows are labelled IGNORE, so every example is scored exactly once."""
        bs = self.cfg.trainer.batch_size
        n = len(self.splits[split])
        per_step = bs * self.dp
        steps = -(-n // per_step)  # ceil: the partial last global batch counts too
        if max_batches is not None:
            steps = min(max_batches, steps)
        for step in range(steps):
            start = step * per_step + self.dp_rank * bs
            rows = np.arange(start, start + bs)
            real = rows < n  # a rank past the end gets a batch of padding only
            x, y = self._batch(split, np.where(real, rows, 0))  # padded with copies of row 0
            # a new tensor: y may be a view of the (read-only, memory-mapped) Arrow labels
            yield x, torch.where(torch.from_numpy(real), y, IGNORE)

    # ---- objective ------------------------------------------------------------------------------

    @staticmethod
    def loss(model, inputs, targets) -> torch.Tensor:
        return F.cross_entropy(model(inputs).float(), targets)

    def evaluate(
        self, model, device, autocast, max_batches: int | None, world_size: int, final: bool = False
    ) -> dict:
        """Validation loss and accuracy over max_batches global batches; at the end of the run (final)
        over the whole validation and test splits."""
        if not final:
            return self._evaluate_split("validation", model, device, autocast, max_batches, world_size)
        metrics = self._evaluate_split("validation", model, device, autocast, None, world_size)
        metrics.update(self._evaluate_split("test", model, device, autocast, None, world_size))
        return metrics

    def _evaluate_split(self, split, model, device, autocast, max_batches, world_size) -> dict:
        totals = torch.zeros(3, device=device)  # loss sum, correct, count
        for x, y in self.eval_batches(split, max_batches):
            x, y = x.to(device), y.to(device)
            with autocast():
                logits = model(x).float()
            totals[0] += F.cross_entropy(logits, y, reduction="sum", ignore_index=IGNORE)
            totals[1] += (logits.argmax(-1) == y).sum()  # a padding row's IGNORE matches no class
            totals[2] += (y != IGNORE).sum()
        if world_size > 1:
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)  # blocks
        loss_sum, correct, count = totals.tolist()  # host-device sync
        if count == 0:  # set-up refuses empty splits; never report 0.0 for nothing scored
            raise RuntimeError(f"no {split} example was scored")
        prefix = "val" if split == "validation" else split
        # averaged over examples (across ranks), not over batches: the last batch may be partial
        return {f"{prefix}/loss": loss_sum / count, f"{prefix}/accuracy": correct / count}

    def tokens_per_batch(self) -> int:
        return self.cfg.trainer.batch_size * self.seq_len

    def flops_per_token(self, model) -> float:
        """6·params + 12·L·d·N for full (non-causal) attention, times the layout's density when
        block-sparse (the kernel computes only the kept tiles)."""
        params = sum(p.numel() for p in model.parameters())
        enc = model.cfg.encoder
        attention = 12 * enc.n_layer * enc.d_model * self.seq_len
        if enc.attention == "block_sparse":
            from flashtrain.models.block_sparse import ModelLayout

            attention *= ModelLayout(enc).for_sequence(self.seq_len, "cpu").density
        return 6 * params + attention
