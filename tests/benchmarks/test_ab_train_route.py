"""benchmarks/ab_train_route.py's routes and arguments (the training steps need a GPU): each route reaches
the setting the kernels read at every call, and the settings come back as they were."""

from __future__ import annotations

import argparse
import contextlib
import gc
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
    args = argparse.Namespace(warmup=1, rounds=4, steps=3, profile=False, gc_every=50, compile_mode="default")
    ways = {
        route: (lambda: None, lambda on=route == "on": ab.route_set(setting, on)) for route in ("off", "on")
    }
    row = ab.compare(ways, args)
    assert order == [False, True, True, False, False, True, True, False]
    assert row["off_step_ms"] == [3.0] * 8 and row["on_step_ms"] == [2.0] * 8
    assert row["off_over_on"] == 1.5


def test_compare_runs_each_ways_blocks_inside_its_own_context_and_names_the_ratio_after_them(monkeypatch):
    """Two backends (--impls): each block of a way's steps runs its own step inside a fresh context of its
    own (a backend's SDPA pin), entered before and left after the block, and the ratio is the first way's
    median over the second's."""
    log = []

    @contextlib.contextmanager
    def pinned(name):
        log.append(("enter", name))
        yield
        log.append(("exit", name))

    def step_of(name):
        return lambda: log.append(("step", name))

    def fake_block(step, steps):
        for _ in range(steps):
            step()
        return [5.0 if log[-1][1] == "sdpa_cudnn" else 4.0] * (steps - 1)

    monkeypatch.setattr(ab, "timed_block", fake_block)
    args = argparse.Namespace(warmup=2, rounds=2, steps=2, profile=False, gc_every=1, compile_mode="default")
    ways = {name: (step_of(name), lambda name=name: pinned(name)) for name in ("sdpa_cudnn", "triton")}
    row = ab.compare(ways, args)
    blocks, current = [], None
    for kind, name in log:
        if kind == "enter":
            current = [name]
        elif kind == "step":
            assert current is not None and name == current[0], "a step ran outside its own way's context"
            current.append(name)
        else:
            blocks.append((name, len(current) - 1))
            current = None
    # warm-up blocks (2 steps each), then round 0 in order and round 1 rotated (2 steps each)
    assert blocks == [("sdpa_cudnn", 2), ("triton", 2), ("sdpa_cudnn", 2), ("triton", 2), ("triton", 2),
                      ("sdpa_cudnn", 2)]  # fmt: skip
    assert row["sdpa_cudnn_step_ms"] == [5.0, 5.0] and row["triton_step_ms"] == [4.0, 4.0]
    assert row["sdpa_cudnn_over_triton"] == 1.25


def test_timed_steps_run_on_the_trainers_collection_schedule(monkeypatch):
    """Automatic collection is off while the rounds run and the young generations are collected every
    gc_every steps counted across both ways (as bench_train.py and the trainer run), and it is back on
    afterwards."""
    collected, enabled_during = [], []

    def fake_block(step, steps):
        for _ in range(steps):
            step()
            enabled_during.append(gc.isenabled())
        return [1.0] * (steps - 1)

    real_collect = gc.collect
    monkeypatch.setattr(
        gc, "collect", lambda generation=2: collected.append(generation) or real_collect(generation)
    )
    monkeypatch.setattr(ab, "timed_block", fake_block)
    args = argparse.Namespace(warmup=0, rounds=3, steps=2, profile=False, gc_every=4, compile_mode="default")
    assert gc.isenabled()
    ab.compare({name: (lambda: None, contextlib.nullcontext) for name in ("off", "on")}, args)
    assert gc.isenabled() and not any(enabled_during)
    # one full collection as the schedule starts, then generation 1 after steps 4, 8 and 12 of 12
    assert collected == [2, 1, 1, 1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--impls", "triton", "triton"], "needs two different backends"),
        (["--impls", "triton"], "expected 2 arguments"),
        (["--impls", "triton", "no_such_impl"], "invalid choice"),
        (["--route", "d64_one_kernel", "--impls", "triton", "sdpa_cudnn"], "not allowed with argument"),
        ([], "one of the arguments --route --impls is required"),
    ],
)
def test_bad_impls_say_what_to_change(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(ab.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["ab_train_route.py", *argv, "--out", "unused.json"])
    with pytest.raises(SystemExit):
        ab.main()
    assert message in capsys.readouterr().err
