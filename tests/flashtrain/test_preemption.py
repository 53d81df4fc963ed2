"""The stop decision of flashtrain/preemption.py across ranks: one rank's signal or deadline stops all."""

from __future__ import annotations

import pytest
import torch

from flashtrain.preemption import PreemptionHandler
from tests.distributed.launcher import run_ranks


def _decide(rank: int, world_size: int, limited_rank: int, signalled_rank: int | None) -> tuple:
    handler = PreemptionHandler(time_limit_s=1e-9 if rank == limited_rank else None)
    try:
        if rank == signalled_rank:
            handler._on_signal(None, None)
        return handler.should_stop(torch.device("cpu")), handler.reason
    finally:
        handler.restore()


@pytest.mark.parametrize(
    "signalled_rank, reason",
    [(None, "time limit"), (1, "signal")],  # a signal wins: it also asks Slurm to requeue
)
def test_one_ranks_deadline_or_signal_stops_every_rank_for_the_same_reason(signalled_rank, reason):
    decisions = run_ranks(_decide, 2, 0, signalled_rank, timeout_s=120)
    assert decisions == [(True, reason), (True, reason)]


def test_no_signal_and_no_deadline_does_not_stop():
    handler = PreemptionHandler(time_limit_s=3600)
    try:
        assert not handler.should_stop(torch.device("cpu")) and handler.reason is None
    finally:
        handler.restore()
