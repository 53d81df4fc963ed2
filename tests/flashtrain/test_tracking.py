"""W&B tracking: the offline run directory holds the run's config, system metrics and every step's
metrics; a resumed run appends to the same W&B run.

The `.wandb` file is read record by record with W&B's own protobuf schema (`wandb.proto`). wandb >= 0.2x
no longer ships a Python reader for the file, so its framing (LevelDB's log format, which `wandb sync`
reads) is decoded here: a 7-byte header, then 32 KiB blocks of records, each with a 7-byte header
(checksum, length, type) and split across blocks as FIRST/MIDDLE/LAST pieces.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import struct

import pytest
import torch

from flashtrain.config import compose_config
from flashtrain.tracking import run_id
from flashtrain.trainer import Trainer

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
STEP_METRICS = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"}


def wandb_records(path: str):
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:7] == b":W&B\xe1\xbe\x00", f"{path} is not a W&B run file (header {data[:7]!r})"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (FIRST, MIDDLE):
            pieces = (pieces if kind == MIDDLE else b"") + chunk
            continue
        assert kind in (FULL, LAST), f"bad record type {kind} in {path}"
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pieces + chunk if kind == LAST else chunk)
        pieces = b""
        yield record


def offline_runs(run_dir: str) -> list[dict]:
    """Each offline W&B run under the run directory, by first step: its id, config, history, record kinds."""
    runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"id": None, "config": {}, "history": {}, "kinds": set()}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            run["kinds"].add(kind)
            if kind == "run":
                run["id"] = record.run.run_id
                run["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                run["history"][row["_step"]] = row
        runs.append(run)
    # Directory names only order runs to the second (a same-second rerun gets a "-1" suffix).
    return sorted(runs, key=lambda r: min(r["history"], default=0))


def _cfg(tmp_path, *overrides):
    return compose_config(
        [
            "debug=cpu",
            "logger.kind=wandb",
            f"trainer.out_dir={tmp_path}/runs",
            f"data.cache_dir={tmp_path}/cache",
            "trainer.max_steps=5",
            *overrides,
        ]
    )


@pytest.fixture(autouse=True)
def _quiet_offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the config alone must make the run offline
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(var, raising=False)  # never requeue the job pytest itself may run in


def _fit(cfg):
    trainer = Trainer(cfg)
    try:
        return trainer.fit(), trainer
    finally:
        trainer.close()


def test_offline_run_holds_config_system_metrics_and_every_step(tmp_path):
    history, trainer = _fit(_cfg(tmp_path, "trainer.run_name=tracked"))
    (run,) = offline_runs(trainer.run_dir)
    assert run["id"] == run_id("tracked")
    assert run["config"]["trainer"]["max_steps"] == 5 and run["config"]["model"]["n_layer"] == 2
    assert {"stats", "exit"} <= run["kinds"]  # system metrics, and a clean finish `wandb sync` can upload
    assert sorted(run["history"]) == [1, 2, 3, 4, 5]
    for step, row in run["history"].items():
        assert STEP_METRICS <= set(row), row
        assert row["train/loss"] == history[step - 1]  # the logged loss is the trained loss, exactly
        assert row["train/tokens_per_s"] > 0 and row["train/grad_norm"] > 0
    assert "val/loss" in run["history"][5]  # the last step evaluates
    lrs = [run["history"][s]["train/lr"] for s in range(1, 6)]
    assert lrs[0] < lrs[1]  # warmup: the lr logged is the schedule's, not a constant


def test_resumed_run_appends_to_the_same_wandb_run(tmp_path):
    straight, _ = _fit(_cfg(tmp_path, "trainer.run_name=whole", "logger.kind=none"))
    trainer = Trainer(_cfg(tmp_path, "trainer.run_name=requeued", "trainer.resume=auto"))
    trainer.step_hooks.append(lambda t, step: step == 2 and os.kill(os.getpid(), signal.SIGUSR1))
    trainer.fit()
    trainer.close()
    assert trainer.preempted
    _fit(_cfg(tmp_path, "trainer.run_name=requeued", "trainer.resume=auto"))
    first, second = offline_runs(trainer.run_dir)
    assert first["id"] == second["id"] == run_id("requeued")
    assert "exit" in first["kinds"]  # finished before the requeue, so the first part is complete too
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3, 4, 5]  # no gap, no overlap
    logged = [row["train/loss"] for run in (first, second) for _, row in sorted(run["history"].items())]
    assert logged == straight


def test_reader_reassembles_records_split_across_blocks(tmp_path):
    # ~560 bytes per step: 70 steps pass a 32 KiB block boundary, where a record is split in pieces.
    _, trainer = _fit(_cfg(tmp_path, "trainer.run_name=long", "trainer.max_steps=70"))
    (path,) = glob.glob(os.path.join(trainer.run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert os.path.getsize(path) > BLOCK
    (run,) = offline_runs(trainer.run_dir)
    assert sorted(run["history"]) == list(range(1, 71))


@pytest.mark.parametrize(
    "override, match",
    [
        ("logger.kind=tensorboard", "choose 'wandb' or 'none'"),
        ("logger.mode=dryrun", "choose 'offline' or 'online'"),
    ],
)
def test_bad_logger_settings_fail_clearly(tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, override)


@pytest.mark.gpu
def test_gpu_run_logs_mfu_and_memory(tmp_path):
    _, trainer = _fit(
        _cfg(tmp_path, "trainer.run_name=gpu", "trainer.device=cuda", "trainer.peak_tflops=100")
    )
    (run,) = offline_runs(trainer.run_dir)
    for row in run["history"].values():
        assert 0 < row["train/mfu"] < 1 and row["train/max_mem_gib"] > 0
    assert torch.cuda.max_memory_allocated() > 0
