"""Training throughput of the LRA image experiments, and the time their configured runs would take.

For runs longer than a GPU lease (Path-64: 125k steps; Path-X and Path-256: 50k), issue 7 asks for the
measured throughput and the projected time to finish. Each row builds the experiment's own Trainer
(`python train.py experiment=lra/<name>` with its model, batch, activation checkpointing, attention
backend and optimiser) on a small generated data set of the same images (the step does not depend on
how many images the split holds), times `--steps` training steps after `--warmup`, and one evaluation
of the configured `eval_batches`; the projection is max_steps x step + the evaluations the run makes.

    python benchmarks/bench_lra_throughput.py --experiments path64 pathx path256 --compile
    python benchmarks/bench_lra_throughput.py --experiments pathfinder32 --compile --profile 10  # idle time
    python benchmarks/bench_lra_throughput.py --device cpu --experiments path64 --images 16 --steps 1 \
        --warmup 0 --override model.n_layer=1 --override trainer.batch_size=1   # smoke (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_profile, error_note, gpu_slug, markdown_table, write_results  # noqa: E402
from flashtrain.config import compose_config  # noqa: E402
from flashtrain.tasks import TaskConfig  # noqa: E402
from flashtrain.tasks.classification import split_sizes  # noqa: E402
from flashtrain.trainer import Trainer  # noqa: E402

# an epoch below is one pass over LRA's Pathfinder training split, not over the small probe split
LRA_TRAIN_IMAGES = split_sizes(TaskConfig(kind="pathfinder"))["n_train"]


def device_busy(trainer: Trainer, steps: int) -> dict:
    """Where a training step's time goes (`device_profile` of `steps` steps): busy while any kernel or
    copy runs, idle otherwise (host work, launches, syncs)."""
    p = device_profile(trainer.train_step, steps)
    return {
        "profiled_step_ms": p["wall_ms"],
        "device_busy_ms": p["busy_ms"],
        "device_idle_frac": 1 - p["busy_ms"] / p["wall_ms"],
        "kernels_per_step": p["kernels_per_step"],
        "top_kernels_ms": p["top_kernels_ms"],
    }


def bench_one(
    name: str, steps: int, warmup: int, overrides: list[str], out_dir: str, profile_steps: int = 0
) -> dict:
    cuda = torch.cuda.is_available()
    cfg = compose_config(
        [
            f"experiment=lra/{name}",
            "task.init_from=null",  # the pre-trained start changes nothing in the step's cost
            "logger=none",
            f"trainer.out_dir={out_dir}",
            f"trainer.run_name=throughput_{name}",
            "trainer.progress_bar=false",
            *overrides,
        ]
    )
    tc = cfg.trainer
    row = {
        "experiment": name,
        "resolution": cfg.task.resolution,
        "tokens": cfg.task.resolution**2,
        "batch_size": tc.batch_size,
        "n_layer": cfg.model.n_layer,
        "d_model": cfg.model.d_model,
        "attention": cfg.model.attention,
        "activation_checkpointing": tc.activation_checkpointing,
        "compile": tc.compile,
        "configured_max_steps": tc.max_steps,
        "eval_interval": tc.eval_interval,
        "eval_batches": tc.eval_batches,
    }
    trainer = Trainer(cfg)
    try:
        row["n_params"] = trainer.n_params
        trainer.train_model.train()
        start = time.perf_counter()
        for _ in range(warmup):  # compile and autotuning happen here
            trainer.train_step()
        row["warmup_s"] = time.perf_counter() - start
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            trainer.train_step()  # ends on loss.item(): the step's work is finished
            times.append(time.perf_counter() - t0)
        row["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        trainer.evaluate()  # the first evaluation compiles the eval graph
        t0 = time.perf_counter()
        trainer.evaluate()
        row["eval_s"] = time.perf_counter() - t0
        if profile_steps:
            trainer.train_model.train()
            row.update(device_busy(trainer, profile_steps))
    finally:
        trainer.close()
    step_s = statistics.median(times)
    evals = tc.max_steps // tc.eval_interval if tc.eval_interval else 0
    row.update(
        step_ms=1000 * step_s,
        step_ms_min=1000 * min(times),
        images_per_s=tc.batch_size / step_s,
        tokens_per_s=tc.batch_size * row["tokens"] / step_s,
        epoch_min=LRA_TRAIN_IMAGES / tc.batch_size * step_s / 60,
        configured_epochs=tc.max_steps * tc.batch_size / LRA_TRAIN_IMAGES,
        projected_h=(tc.max_steps * step_s + evals * row["eval_s"]) / 3600,
        status="ok",
    )
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiments", nargs="+", default=["path64", "pathx", "path256"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--images", type=int, default=2048,
        help="training images generated per experiment; 0: LRA's own splits (160k/20k/20k, e.g. a filled cache)",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true", help="trainer.compile=true (per-block torch.compile)"
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test only")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "flashtrain-lra-throughput")
    )
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS",
        help="then profile STEPS more steps (GPU): device busy time per step and the top kernels",
    )  # fmt: skip
    parser.add_argument("--out", default=None)
    a = parser.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run on a GPU machine, or pass --device cpu for a smoke test")
    sizes = [
        f"task.n_train={a.images}",
        f"task.n_val={max(a.images // 8, 64)}",
        f"task.n_test={max(a.images // 8, 64)}",
    ]
    overrides = [
        *(sizes if a.images else []),
        f"task.cache_dir={a.cache_dir}",
        f"trainer.compile={str(a.compile).lower()}",
        f"trainer.device={a.device}",
        *a.override,
    ]
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        for name in a.experiments:
            try:
                row = bench_one(name, a.steps, a.warmup, overrides, out_dir, a.profile)
            except Exception as exc:  # noqa: BLE001 - one failed experiment is a row, the others still run
                row = {"experiment": name, "status": error_note(exc)}
            print(row, flush=True)
            rows.append(row)
            if a.device == "cuda":
                torch.cuda.empty_cache()
    out = a.out or os.path.join("benchmarks", "results", f"lra_throughput_{gpu_slug()}.json")
    write_results(out, rows, {"steps": a.steps, "warmup": a.warmup, "overrides": overrides})
    cols = ["experiment", "batch_size", "attention", "step_ms", "images_per_s", "max_mem_gib", "eval_s",
            "configured_max_steps", "configured_epochs", "projected_h", "status"]  # fmt: skip
    if a.profile:
        cols[4:4] = ["device_busy_ms", "device_idle_frac"]
    print(markdown_table(rows, cols))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
