"""Data-parallel scaling: training tokens/s of the real trainer step under DDP, FSDP2 and DeepSpeed ZeRO
on 1, 2 and 4 GPUs, and the largest model each strategy fits at a fixed context.

Weak scaling: every GPU keeps the same micro-batch, so a perfect N-GPU run processes N times the tokens
of the 1-GPU run in the same time; efficiency = tokens/s(N) / (N * tokens/s(1)). The 1-GPU anchor is the
plain single-device trainer (every strategy runs as that on one process), measured in the same run;
`--override parallel.*` options apply to the multi-GPU runs only.
The step timed is `Trainer.train_step` (forward, backward, gradient reduction, clipping, AdamW), with
its once-per-step `loss.item()` as the sync point.

    python benchmarks/bench_scaling.py                       # GPT-2 medium, 4k context, triton, 1/2/4 GPUs
    python benchmarks/bench_scaling.py --device cpu --model gpt_tiny --seq-len 128 --gpus 1 2   # CPU smoke
    torchrun --nproc_per_node=2 benchmarks/bench_scaling.py worker --strategy fsdp --out row.json  # one run
    python benchmarks/bench_scaling.py --gpus 1 2 --strategies fsdp --batch-size 4 --phases \
        --override parallel.blocks_per_unit=4   # + host ms per step in forward / backward / clip / optimizer

Writes benchmarks/results/scaling_<gpu>.json (and .md) unless --out names another path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import gpu_slug, is_oom, markdown_table, profile_table, write_results  # noqa: E402

STRATEGIES = ["ddp", "fsdp", "deepspeed"]
# Ascending size; the fit search walks up until the first failure to run (OOM).
FIT_MODELS = ["gpt2_medium", "gpt2_large", "gpt2_xl", "gpt3_2p7b", "gpt3_6p7b", "gpt3_13b"]
VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64; the benchmark feeds byte tokens, so set it


def _overrides(a) -> list[str]:
    strategy = [f"parallel={a.strategy}"] if a.strategy != "none" else []
    if a.strategy == "deepspeed":
        strategy.append(f"parallel.zero_stage={a.zero_stage}")
    return [
        f"model={a.model}",
        f"model.max_seq_len={max(a.seq_len, 1)}",
        f"model.vocab_size={VOCAB if a.model != 'gpt_tiny' else 'null'}",
        f"model.attention={a.attention}",
        "model.dropout=0.0",
        f"trainer.seq_len={a.seq_len}",
        f"trainer.batch_size={a.batch_size}",
        "trainer.grad_accum=1",
        f"trainer.device={a.device}",
        f"trainer.activation_checkpointing={str(a.activation_checkpointing).lower()}",
        f"trainer.compile={str(a.compile).lower()}",
        f"trainer.out_dir={a.run_root}",
        "trainer.run_name=bench",
        "trainer.checkpoint_interval=0",
        "trainer.progress_bar=false",
        "logger.kind=none",
        f"data.cache_dir={a.run_root}/cache",
        *strategy,
        *a.override,  # last, so they win (e.g. parallel.sp=4 model.pos_embedding=rotary)
    ]


def _phase_times(trainer, steps: int, sync: bool) -> dict:
    """Milliseconds per step that rank 0's host spends in each phase of `Trainer.train_step`: forward
    (the loss), backward (FSDP's and DDP's hooks included), clip (the global gradient norm, and the
    scaling by it) and optimizer, and the rest (mostly the wait for the device at the step's one read of
    the loss and the norm). Without sync
    a phase's time is the host work of launching it; with sync (a device sync before and after every
    phase) it is that phase's host and device time together, with nothing overlapped."""
    phases = [  # (phase, object, method): a phase may time several methods
        ("forward", trainer, "_micro_batch_loss"),
        ("backward", trainer.strategy, "backward"),
        ("clip", trainer.strategy, "grad_norm"),
        ("clip", trainer.strategy, "clip_grads"),
        ("optimizer", trainer.strategy, "step"),
    ]
    spent = {name: 0.0 for name, _, _ in phases}

    def timed(name, fn):
        def run(*args, **kwargs):
            if sync:
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync:
                torch.cuda.synchronize()
            spent[name] += time.perf_counter() - t
            return out

        return run

    for name, obj, attr in phases:  # an instance attribute shadows the class's method
        setattr(obj, attr, timed(name, getattr(obj, attr)))
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        total = time.perf_counter() - t0
    finally:
        for _, obj, attr in phases:
            delattr(obj, attr)
    ms = {name: t / steps * 1e3 for name, t in spent.items()}
    return {**ms, "rest": total / steps * 1e3 - sum(ms.values()), "step": total / steps * 1e3}


def worker(a) -> None:
    """One measurement inside torchrun (or one plain process): rank 0 writes a row to --out."""
    import torch.distributed as dist

    from flashtrain.config import compose_config
    from flashtrain.trainer import Trainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    row = {
        "strategy": a.strategy if world > 1 else "single",
        "gpus": world,
        "model": a.model,
        "seq_len": a.seq_len,
    }
    row.update(batch_size=a.batch_size, zero_stage=a.zero_stage if a.strategy == "deepspeed" else None)
    trainer = None
    try:
        trainer = Trainer(compose_config(_overrides(a)))
        row["n_params"] = trainer.n_params
        for _ in range(a.warmup):
            trainer.train_step()  # compile, autotune, allocator warm-up
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            trainer.train_step()  # ends in loss.item(): a host-device sync, so wall time is step time
        dt = (time.perf_counter() - t0) / a.steps
        tokens = a.batch_size * a.seq_len * trainer.dp
        row.update(
            status="ok", step_ms=dt * 1e3, tokens_per_s=tokens / dt, tokens_per_s_per_gpu=tokens / dt / world
        )
        if a.phases:
            row["phases_ms"] = _phase_times(trainer, a.steps, sync=False)
            if trainer.device.type == "cuda":
                row["phases_synced_ms"] = _phase_times(trainer, a.steps, sync=True)
        if a.profile:  # every rank runs the profiled steps (collectives); rank 0 writes the table
            path = os.path.join(a.profile, f"scaling_profile_{row['strategy']}_{a.model}_x{world}.txt")
            title = f"rank 0 of {world}: {row['strategy']} train_step, {a.model}, {a.batch_size}x{a.seq_len} tokens/GPU"
            profile_table(
                trainer.train_step, path if int(os.environ.get("RANK", "0")) == 0 else None, title=title
            )
        if trainer.device.type == "cuda":
            mem = torch.tensor(torch.cuda.max_memory_allocated() / 2**30, device=trainer.device)
            if world > 1:
                dist.all_reduce(mem, op=dist.ReduceOp.MAX)  # blocks: the busiest rank decides what fits
            row["max_mem_gib"] = mem.item()
    except Exception as e:  # an OOM is a result (the model does not fit), anything else too: recorded
        row.update(status="oom" if is_oom(e) else "error", error=traceback.format_exc(limit=3)[-1500:])
    if int(os.environ.get("RANK", "0")) == 0:
        with open(a.out, "w") as f:
            json.dump(row, f)
    if trainer is not None:
        trainer.close()


def _run(a, strategy: str, gpus: int, model: str) -> dict:
    """Launch one worker job (a fresh process group per measurement) and read its row.

    `a` needs the worker's options (see main); a.override is passed through as extra Hydra overrides.
    """
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    args = [
        "worker", "--strategy", strategy, "--model", model, "--seq-len", str(a.seq_len),
        "--batch-size", str(a.batch_size), "--device", a.device, "--attention", a.attention,
        "--zero-stage", str(a.zero_stage), "--steps", str(a.steps), "--warmup", str(a.warmup),
        "--run-root", a.run_root, "--out", out, *(f"--override={o}" for o in a.override),
        *(["--profile", a.profile] if a.profile and model == a.model else []),
        *(["--activation-checkpointing"] if a.activation_checkpointing else []),
        *(["--compile"] if a.compile else []),
        *(["--phases"] if a.phases else []),
    ]  # fmt: skip
    script = os.path.abspath(__file__)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    cmd = [*launch, script, *args] if gpus > 1 else [sys.executable, script, *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        failed = proc.returncode != 0 and not os.path.getsize(out)
        row = {"status": "error", "error": proc.stderr[-1500:]} if failed else json.load(open(out))
    except subprocess.TimeoutExpired:
        row = {"status": "timeout"}
    finally:
        os.remove(out)
    row.update(strategy=row.get("strategy", strategy), gpus=gpus, model=model)
    print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
    return row


def driver(a) -> None:
    gpus = sorted(set(a.gpus))
    out = a.out or os.path.join(ROOT, "benchmarks", "results", f"scaling_{gpu_slug()}.json")
    rows, fit_rows = [], []

    def largest() -> dict:
        return {
            s: max(
                (r["model"] for r in fit_rows if r["strategy"] == s and r["status"] == "ok"),
                key=a.fit_models.index,
                default=None,
            )
            for s in {r["strategy"] for r in fit_rows}
        }

    def save() -> None:  # after every run, so a search cut short keeps what it measured
        extra = {"model": a.model, "seq_len": a.seq_len, "batch_size_per_gpu": a.batch_size,
                 "attention": a.attention, "zero_stage": a.zero_stage,
                 "activation_checkpointing": a.activation_checkpointing, "largest_fitting_model": largest()}  # fmt: skip
        write_results(out, rows + fit_rows, extra)

    if not a.fit_only:
        # the anchor is the plain single-device trainer: the strategies' parallel.* overrides stay out
        plain = argparse.Namespace(
            **{**vars(a), "override": [o for o in a.override if not o.startswith("parallel.")]}
        )
        base = _run(plain, "none", 1, a.model) if 1 in gpus else None
        if base:
            rows.append(
                {**base, "kind": "scaling", "efficiency": 1.0 if base.get("status") == "ok" else None}
            )
            save()
        for strategy in a.strategies:
            for n in (g for g in gpus if g > 1):
                row = {**_run(a, strategy, n, a.model), "kind": "scaling"}
                if row.get("status") == "ok" and base and base.get("status") == "ok":
                    row["efficiency"] = row["tokens_per_s"] / (n * base["tokens_per_s"])
                rows.append(row)
                save()
    if a.fit_models:
        n = max(gpus)
        # whether a model fits needs one step after the warm-up one (which allocates the optimizer
        # state), not a timed series: each search run is mostly process start and model build
        fit_a = argparse.Namespace(**{**vars(a), "steps": a.fit_steps, "warmup": 1, "profile": None})
        for strategy in a.strategies if n > 1 else ["none"]:
            for model in a.fit_models:  # ascending: stop at the first that does not run
                row = _run(fit_a, strategy, n, model)
                fit_rows.append({**row, "kind": "fit"})
                save()
                if row.get("status") != "ok":
                    break
    save()
    cols = [
        "kind",
        "strategy",
        "gpus",
        "model",
        "status",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "efficiency",
        "max_mem_gib",
    ]
    table = markdown_table(rows + fit_rows, cols, floatfmt="{:.3g}")
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"largest model that fits, per strategy at {max(gpus)} GPUs: {largest()}")
    print(f"wrote {out}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=["driver", "worker"], default="driver")
    parser.add_argument(
        "--strategy", default="ddp", choices=["none", *STRATEGIES], help="worker: the strategy"
    )
    parser.add_argument(
        "--strategies", nargs="+", default=STRATEGIES, choices=STRATEGIES, help="driver: strategies"
    )
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4], help="driver: process counts")
    parser.add_argument("--model", default="gpt2_medium", help="configs/model/<name>.yaml")
    parser.add_argument("--fit-models", nargs="*", default=FIT_MODELS, help="driver: ascending sizes to try")
    parser.add_argument("--fit-only", action="store_true", help="driver: only the fit search (at max --gpus)")
    parser.add_argument("--fit-steps", type=int, default=1, help="driver: timed steps per fit-search run")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per GPU per step")
    parser.add_argument(
        "--attention", default=None, help="model.attention (default: triton on cuda, reference on cpu)"
    )
    parser.add_argument("--zero-stage", type=int, default=2, choices=[1, 2, 3])
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="driver: seconds per launched job")
    parser.add_argument("--run-root", default=os.path.join(tempfile.gettempdir(), "flashtrain-bench-scaling"))
    parser.add_argument("--out", default=None, help="worker: row file; driver: results JSON")
    parser.add_argument("--phases", action="store_true", help="also time each phase of the step (phases_ms)")
    parser.add_argument("--profile", default=None, help="folder: a profile table of each scaling run's step")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    a = parser.parse_args(argv)
    a.attention = a.attention or ("triton" if a.device == "cuda" else "reference")
    if a.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --device cpu (with a tiny --model and --seq-len) for a smoke run")
    if a.mode == "worker":
        if a.out is None:
            parser.error("worker mode needs --out")
        worker(a)
    else:
        driver(a)


if __name__ == "__main__":
    main()
