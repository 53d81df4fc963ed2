"""`benchmarks.common`'s pure helpers (the GPU-facing ones run on the device machine)."""

from __future__ import annotations

import pytest

from benchmarks import common
from benchmarks.common import alternating_ms, idle_gaps, rotated


def test_overlapping_kernels_leave_no_gap_and_a_late_start_is_charged_to_its_neighbours():
    kernels = [
        ("a", 0.0, 10.0),
        ("b", 5.0, 12.0),  # overlaps a (another stream)
        ("c", 12.5, 20.0),  # 0.5 us after b: launch latency, under min_us
        ("d", 30.0, 40.0),  # 10 us after c
        ("e", 32.0, 35.0),  # inside d
        ("f", 44.0, 50.0),  # 4 us after d (not after e, which ended earlier)
        ("d", 60.0, 61.0),
        ("f", 71.0, 72.0),  # 10 us after d again
    ]
    idle, pairs = idle_gaps(kernels, min_us=3.0)
    assert idle == pytest.approx(10 + 4 + 10 + 10)
    assert pairs == {"c -> d": [10.0, 1], "d -> f": [14.0, 2], "f -> d": [10.0, 1]}


def test_the_order_given_does_not_matter_and_min_us_sets_what_counts():
    kernels = [("x", 20.0, 25.0), ("w", 0.0, 10.0), ("y", 27.0, 30.0)]
    assert idle_gaps(kernels, min_us=3.0) == (10.0, {"w -> x": [10.0, 1]})
    assert idle_gaps(kernels, min_us=1.0) == (12.0, {"w -> x": [10.0, 1], "x -> y": [2.0, 1]})
    assert idle_gaps([], min_us=1.0) == (0.0, {})


@pytest.mark.parametrize("names", [("a", "b", "c"), (False, True), ["x"]])
def test_alternating_rounds_put_every_name_at_every_position_once_per_cycle(names):
    """`rotated`: round r times all names, starting at name r mod n, so n rounds time each name once
    at each position (a position's bias then weighs on every name alike)."""
    orders = [rotated(names, r) for r in range(2 * len(names))]
    assert all(sorted(map(str, order)) == sorted(map(str, names)) for order in orders)
    for pos in range(len(names)):
        assert sorted(map(str, (order[pos] for order in orders[: len(names)]))) == sorted(map(str, names))
    assert orders[0] == list(names) and orders[len(names)] == list(names)


def test_alternating_ms_times_each_call_once_a_round_in_the_rotated_order(monkeypatch):
    order = []
    monkeypatch.setattr(common, "time_ms", lambda fn: float(fn()))
    calls = {name: (lambda n=name, i=i: order.append(n) or i) for i, name in enumerate("abc")}
    times = alternating_ms(calls, 4)
    assert order == [*"abc", *"bca", *"cab", *"abc"]
    assert times == {"a": [0.0] * 4, "b": [1.0] * 4, "c": [2.0] * 4}


def test_clock_summary_reads_nvidia_smi_lines_and_says_when_there_are_none():
    from benchmarks.common import clock_summary

    out = "1980, 690.12\n1755, 699.80\n\n1830, 650.00\n"
    assert clock_summary(out) == {
        "samples": 3,
        "sm_clock_mhz": [1830.0, 1755.0, 1980.0],
        "power_w": [690.12, 699.8],
    }
    assert clock_summary("1980, [N/A]\nNo devices were found\n") == {
        "error": "no clock samples from nvidia-smi: 1980, [N/A]"
    }
    assert clock_summary("") == {"error": "no clock samples from nvidia-smi: no output"}


@pytest.fixture
def one_fake_cuda_device(monkeypatch):
    """torch.cuda answering for device 0 with UUID "58f8-aa" (`gpu_clock_log` asks it which GPU to sample)."""
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="58f8-aa"))


def test_gpu_clock_log_says_when_nvidia_smi_is_missing(monkeypatch, one_fake_cuda_device):
    from benchmarks import common

    monkeypatch.setenv("PATH", "/nonexistent")
    with common.gpu_clock_log() as summary:
        pass
    assert summary["error"].startswith("nvidia-smi did not start")


def test_gpu_clock_log_samples_the_device_by_uuid_until_the_block_ends(
    monkeypatch, tmp_path, one_fake_cuda_device
):
    import time

    from benchmarks import common

    fake = tmp_path / "nvidia-smi"  # prints two samples, then runs until terminated
    fake.write_text(
        f'#!/bin/sh\necho "$2" > {tmp_path}/device\necho "1980, 690.5"\necho "1800, 700"\nexec sleep 30\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with common.gpu_clock_log() as summary:
        time.sleep(0.5)  # (the fake's output arrives while the block runs)
    assert (tmp_path / "device").read_text().strip() == "GPU-58f8-aa"
    assert summary == {"samples": 2, "sm_clock_mhz": [1890.0, 1800.0, 1980.0], "power_w": [695.25, 700.0]}


def test_with_settings_sets_for_the_call_and_puts_back():
    import types

    module = types.SimpleNamespace(A=1, B="x")
    seen = common.with_settings(lambda: (module.A, module.B), module, A=2, B="y")
    assert seen() == (2, "y") and (module.A, module.B) == (1, "x")

    def fails():
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        common.with_settings(fails, module, A=3)()
    assert module.A == 1
