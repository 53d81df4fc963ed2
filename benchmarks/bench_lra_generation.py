"""Generation rate of the LRA data generators on this machine's CPU.

Pathfinder images/s per resolution and ListOps expressions/s, in one process and in `--procs` worker
processes (the way data/lra/dataset.py builds splits). Single-process rates are steady-state: each
process first rasterises the dash shapes it meets and caches them, so a warm-up run comes first and is
reported separately; multi-process rates likewise time the workers after one warm-up chunk each.

    python benchmarks/bench_lra_generation.py [--images 200] [--procs N] [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.lra import listops, pathfinder  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _pf_chunk(args):
    res, start, count = args
    pathfinder.generate(count, res, seed=0, split=0, start=start)
    return count


def _lo_chunk(args):
    start, count = args
    listops.generate_raw(count, seed=0, split=0, start=start)
    return count


def _parallel(fn, jobs, procs, warm_jobs=()) -> float:
    with multiprocessing.get_context().Pool(procs) as pool:
        # One warm-up job per worker (not timed), so the rate is the steady state of a long build.
        pool.map(fn, warm_jobs, chunksize=1)
        t0 = time.perf_counter()
        done = sum(pool.imap_unordered(fn, jobs))
        return done / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=200, help="images timed per resolution and mode")
    ap.add_argument("--expressions", type=int, default=1000, help="ListOps expressions timed per mode")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--resolutions", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--out", default="benchmarks/results/lra_generation_cpu.json")
    args = ap.parse_args()
    if args.images < 1 or args.expressions < 1 or args.procs < 1:
        raise ValueError("--images, --expressions and --procs must be >= 1")

    rows = []
    for res in args.resolutions:
        pathfinder.params_for(res)  # fails clearly on an unknown resolution
        warm = max(20, args.images // 4)
        t0 = time.perf_counter()
        pathfinder.generate(warm, res, seed=0, split=9)
        warm_rate = warm / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        pathfinder.generate(args.images, res, seed=0, split=0)
        single = args.images / (time.perf_counter() - t0)
        n = args.images * args.procs
        chunk = max(1, n // (4 * args.procs))
        jobs = [(res, s, min(chunk, n - s)) for s in range(0, n, chunk)]
        warm_jobs = [(res, 10**6 + i * warm, warm) for i in range(args.procs)]
        multi = _parallel(_pf_chunk, jobs, args.procs, warm_jobs)
        row = {
            "generator": "pathfinder",
            "resolution": res,
            "warmup_images_per_s": round(warm_rate, 2),
            "single_process_images_per_s": round(single, 2),
            "processes": args.procs,
            "multi_process_images_per_s": round(multi, 2),
            "images_timed": {"warmup": warm, "single": args.images, "multi": n},
        }
        print(json.dumps(row), flush=True)
        rows.append(row)

    t0 = time.perf_counter()
    listops.generate_raw(args.expressions, seed=0, split=0)
    single = args.expressions / (time.perf_counter() - t0)
    n = args.expressions * args.procs
    chunk = max(1, n // (4 * args.procs))
    multi = _parallel(_lo_chunk, [(s, min(chunk, n - s)) for s in range(0, n, chunk)], args.procs)
    row = {
        "generator": "listops",
        "single_process_expressions_per_s": round(single, 2),
        "processes": args.procs,
        "multi_process_expressions_per_s": round(multi, 2),
        "expressions_timed": {"single": args.expressions, "multi": n},
    }
    print(json.dumps(row), flush=True)
    rows.append(row)

    out = {
        "device": f"CPU: {cpu_name()}",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": __import__("numpy").__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
