"""Run a function on N gloo ranks in fresh processes, with a deadline, and collect what each returns.

Process start costs seconds on a small CPU machine, so tests run many cases inside one job per
world size (see `cases.py`) rather than one job per case. A hung collective cannot hang CI: gloo
ops time out, and the parent kills the job at its deadline.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, world_size: int, port: int, fn, args, out_dir: str, op_timeout_s: float, backend: str
) -> None:
    torch.set_num_threads(1)  # N ranks share two cores
    result = None
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
        result = ("ok", fn(rank, world_size, *args))
    except BaseException:  # noqa: B036 - report everything to the parent, which fails the test
        result = ("error", traceback.format_exc())
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
        if dist.is_initialized():
            dist.destroy_process_group()


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
        while not ctx.join(timeout=step):
            deadline -= step
            if deadline <= 0:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()  # our own children, by handle
                raise RuntimeError(
                    f"distributed job of {world_size} ranks passed its {timeout_s:.0f} s deadline"
                )
        results = []
        for rank in range(world_size):
            path = os.path.join(out_dir, f"rank{rank}.pkl")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} exited without a result")
            with open(path, "rb") as f:
                results.append(pickle.load(f))
    errors = [f"rank {r}:\n{val}" for r, (status, val) in enumerate(results) if status == "error"]
    if errors:
        raise RuntimeError("\n".join(errors))
    return [val for _, val in results]
