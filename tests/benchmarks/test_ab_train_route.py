"""benchmarks/ab_train_route.py's routes and arguments (the training steps need a GPU): each route reaches
the setting the kernels read at every call, and the settings come back as they were."""

from __future__ import annotations

import argparse
import sys

import pytest

from benchmarks import ab_train_route as ab
from kernels import _flash_bwd_fused_hopper as fused
from kernels import _flash_fwd_hopper as fwd_hopper


def test_d64_one_kernel_route_gives_head_dim_64_the_one_kernel_backward_and_takes_it_back():
    state = ab.route_state()
    try:
        ab.ROUTES["d64_one_kernel"](True)
        assert fused.supports(64, True, 8192) and fused.CONFIGS[64].block_m == 64
        ab.ROUTES["d64_one_kernel"](False)
        assert not fused.supports(64, True, 8192)
    finally:
        ab.restore_routes(state)
    assert ab.route_state() == state and 64 not in fused.CONFIGS


def test_ordered_backward_route_switches_the_ordered_kernel_and_restore_puts_it_back():
    state = ab.route_state()
    try:
        ab.ROUTES["ordered_backward"](False)
        assert fused.ORDERED_ENABLED is False
    finally:
        ab.restore_routes(state)
    assert fused.ORDERED_ENABLED is state[1]


def test_forward_turns_route_reaches_the_forwards_config_choice_and_restore_puts_it_back():
    state = ab.route_state()
    try:
        ab.ROUTES["forward_turns"](False)
        assert not fwd_hopper.config_for(128, 16384, False).pingpong
        ab.ROUTES["forward_turns"](True)
        assert fwd_hopper.config_for(128, 16384, False).pingpong
    finally:
        ab.restore_routes(state)
    assert fwd_hopper.PINGPONG is state[2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--route", "d64_one_kernel", "--steps", "1"], "--steps must be >= 2"),
        (["--route", "d64_one_kernel"], "needs a CUDA GPU"),
        (["--route", "no_such_route"], "invalid choice"),
    ],
)
def test_bad_arguments_say_what_to_change(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(ab.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["ab_train_route.py", *argv, "--out", "unused.json"])
    with pytest.raises(SystemExit):
        ab.main()
    assert message in capsys.readouterr().err


def test_compare_times_each_route_in_rotated_rounds_and_reports_off_over_on(monkeypatch):
    """The bookkeeping, with the step's timing replaced: each round times both routes, the first one
    alternating, every block under its own route's setting."""
    setting_now, order = [None], []

    def setting(on):
        setting_now[0] = on

    def fake_block(step, steps):
        order.append(setting_now[0])
        return [2.0 if setting_now[0] else 3.0] * (steps - 1)

    monkeypatch.setattr(ab, "timed_block", fake_block)
    args = argparse.Namespace(warmup=1, rounds=4, steps=3, profile=False)
    row = ab.compare(lambda: None, setting, ("off", "on"), args)
    assert order == [False, True, True, False, False, True, True, False]
    assert row["off_step_ms"] == [3.0] * 8 and row["on_step_ms"] == [2.0] * 8
    assert row["off_over_on"] == 1.5
