"""Preemption: on a signal (Slurm's `--signal=USR1@<seconds>`), checkpoint and requeue.

The handler only records the signal; the trainer checks the flag between optimizer steps, agrees on
it across ranks (a rank that got the signal makes every rank stop), writes a checkpoint, and rank 0
asks Slurm to requeue the job. The requeued job (slurm/launch.sh) starts with `trainer.resume=auto`,
continues from that checkpoint, and appends to the same W&B run (its id derives from the run name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import torch
import torch.distributed as dist

from flashtrain.log import get_logger

log = get_logger()


class PreemptionHandler:
    """Records a preemption signal, or the end of a wall-clock budget (`time_limit_s`, from now)."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGUSR1,), time_limit_s: float | None = None):
        self._requested = False
        self._deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.reason = None  # "signal" or "time limit", once should_stop has said so
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        # Only set a flag: checkpointing inside a signal handler could interrupt a collective.
        self._requested = True

    def should_stop(self, device: torch.device) -> bool:
        """Whether any rank got the signal or ran out of time (collective when distributed: every rank
        must call it). Ranks reach their deadlines a little apart; the reduction makes them stop together."""
        # 2 = signal, 1 = time limit: a signal wins, since it also asks for a Slurm requeue
        code = (
            2.0 if self._requested else 1.0 if self._deadline and time.monotonic() > self._deadline else 0.0
        )
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([code], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # blocks: all ranks agree before anyone checkpoints
            code = flag.item()
        self.reason = {2.0: "signal", 1.0: "time limit"}.get(code)
        return self.reason is not None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def requeue_slurm_job() -> bool:
    """Ask Slurm to requeue this job; False (with a message) when not running under Slurm."""
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = (
        f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        if job_id
        else os.environ.get("SLURM_JOB_ID")
    )
    if not job_id:
        log.warning(
            "preempted outside Slurm: checkpoint written, nothing to requeue; rerun with trainer.resume=true"
        )
        return False
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        log.warning(
            f"scontrol requeue {job_id} failed ({result.stderr.strip()}); the checkpoint is kept, resubmit by hand"
        )
        return False
    log.info(f"requeued Slurm job {job_id}; it resumes from the checkpoint just written")
    return True
