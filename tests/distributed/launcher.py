"""Run a function on N gloo ranks in fresh processes, with a deadline, and collect what each returns.

Process start costs seconds on a small CPU machine, so tests run many cases inside one job per
world size (see `cases.py`) rather than one job per case. A hung collective cannot hang CI: gloo
ops time out, and the parent kills the job at its deadline.
"""

from __future__ import annotations

import datetime
import gc
import os
import pickle
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Imported here, so in every rank before its process group exists: torch.distributed.nn (which
# torch.distributed.tensor's imports reach) binds the default group as a default argument when first
# imported, and would keep it, and its gloo threads, alive past destroy_process_group.
import flashtrain.distributed  # noqa: F401
from flashtrain.parallelize import clear_dtensor_caches


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo started (Linux names threads in /proc)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except FileNotFoundError:  # the thread ended while we listed them
            continue
        if "gloo" in name:
            names.append(name)
    return sorted(names)


def _release_process_groups() -> list[str]:
    """Destroy the process groups so that their gloo threads end before the interpreter does.

    A gloo thread still running at interpreter shutdown can abort the process ("terminate called
    without an active exception", SIGABRT: benchmarks/NOTES_parallel.md, Teardown), and that cost a CI
    run once. destroy_process_group joins those threads only when nothing else holds the groups: DTensor's
    caches hold FSDP2's meshes, and reference cycles the test function left behind hold models. Returns
    the gloo threads still alive afterwards (empty when the teardown is clean)."""
    clear_dtensor_caches()
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    return gloo_threads()


def _worker(
    rank: int, world_size: int, port: int, fn, args, out_dir: str, op_timeout_s: float, backend: str
) -> None:
    torch.set_num_threads(1)  # N ranks share two cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=op_timeout_s),
        )
        # pickled now, so that the returned objects (DTensors hold meshes) are gone before the teardown
        result = pickle.dumps(("ok", fn(rank, world_size, *args)))
    except BaseException:  # noqa: B036 - report everything to the parent, which fails the test
        result = pickle.dumps(("error", traceback.format_exc()))
    try:
        left = _release_process_groups()
        if left and backend == "gloo":
            result = pickle.dumps(
                (
                    "error",
                    f"gloo threads still alive after destroy_process_group: {left}; something the test "
                    "function built (a model, a mesh, a cache entry) still holds its process group, "
                    "and such a thread can abort the process at interpreter shutdown",
                )
            )
    except BaseException:  # noqa: B036
        result = pickle.dumps(("error", "teardown failed:\n" + traceback.format_exc()))
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        f.write(result)


def _read_result(out_dir: str, rank: int):
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def run_ranks(
    fn, world_size: int, *args, timeout_s: float = 240.0, op_timeout_s: float = 60.0, backend: str = "gloo"
) -> list:
    """fn(rank, world_size, *args) on every rank (fn must be importable: defined at module level);
    backend "nccl" puts rank r on GPU r.

    Returns the per-rank return values; raises RuntimeError with the ranks' tracebacks if any rank
    raised, or if the job passed its deadline (the processes are then killed).
    """
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(world_size, free_port(), fn, args, out_dir, op_timeout_s, backend),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = timeout_s
        step = 0.5
        try:
            while not ctx.join(timeout=step):
                deadline -= step
                if deadline <= 0:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.kill()  # our own children, by handle
                    raise RuntimeError(
                        f"distributed job of {world_size} ranks passed its {timeout_s:.0f} s deadline"
                    )
        except mp.ProcessExitedException as e:
            # a rank died (a signal, or a non-zero exit): say what every rank had reported by then
            reports = {r: _read_result(out_dir, r) for r in range(world_size)}
            raise RuntimeError(
                f"{e}\n" + "\n".join(f"rank {r} had reported: {v}" for r, v in reports.items())
            ) from e
        results = []
        for rank in range(world_size):
            result = _read_result(out_dir, rank)
            if result is None:
                raise RuntimeError(f"rank {rank} exited without a result")
            results.append(result)
    errors = [f"rank {r}:\n{val}" for r, (status, val) in enumerate(results) if status == "error"]
    if errors:
        raise RuntimeError("\n".join(errors))
    return [val for _, val in results]
