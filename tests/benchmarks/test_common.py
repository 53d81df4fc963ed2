"""`benchmarks.common`'s pure helpers (the GPU-facing ones run on the device machine)."""

from __future__ import annotations

import datetime

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
    monkeypatch.setattr(common, "time_ms", lambda fn, rep_ms: float(fn()))
    monkeypatch.setattr(common, "run_for", lambda *a, **kw: pytest.fail("settled without settle_ms"))
    calls = {name: (lambda n=name, i=i: order.append(n) or i) for i, name in enumerate("abc")}
    times = alternating_ms(calls, 4)
    assert order == [*"abc", *"bca", *"cab", *"abc"]
    assert times == {"a": [0.0] * 4, "b": [1.0] * 4, "c": [2.0] * 4}


def test_alternating_ms_settles_each_call_right_before_its_timing(monkeypatch):
    events = []
    monkeypatch.setattr(common, "time_ms", lambda fn, rep_ms: events.append(("time", fn(), rep_ms)) or 1.0)
    monkeypatch.setattr(
        common, "run_for", lambda fn, seconds, max_ahead: events.append(("settle", fn(), seconds, max_ahead))
    )
    times = alternating_ms({"a": lambda: "a", "b": lambda: "b"}, 2, settle_ms=1500, rep_ms=500)
    assert events == [
        ("settle", "a", 1.5, 2), ("time", "a", 500),
        ("settle", "b", 1.5, 2), ("time", "b", 500),
        ("settle", "b", 1.5, 2), ("time", "b", 500),
        ("settle", "a", 1.5, 2), ("time", "a", 500),
    ]  # fmt: skip
    assert times == {"a": [1.0, 1.0], "b": [1.0, 1.0]}


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


def fake_nvidia_smi(tmp_path, monkeypatch, samples: str, refuse: str = "") -> None:
    """An nvidia-smi on PATH that records its arguments (one line a run), refuses a --query-gpu holding
    `refuse` as the real one refuses a field it does not know, prints `samples` and, when asked to loop,
    runs until terminated."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f'case "$*" in *"{refuse or "never"}"*) echo "Field is not a valid field to query."; exit 2;; esac\n'
        f"printf '{samples}'\n"
        'case "$*" in *--loop-ms*) exec sleep 30;; esac\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_gpu_clock_log_samples_the_device_by_uuid_until_the_block_ends(
    monkeypatch, tmp_path, one_fake_cuda_device
):
    import time

    from benchmarks import common

    lines = "2026/12/01 14:00:00.250, 1980, 690.5, 41, 0x0000000000000000\\n"
    lines += "2026/12/01 14:00:00.550, 1800, 700, 43, 0x0000000000000004\\n"
    fake_nvidia_smi(tmp_path, monkeypatch, lines)
    with common.gpu_clock_log() as summary:
        time.sleep(0.5)  # (the fake's output arrives while the block runs)
    probe, loop = (tmp_path / "calls").read_text().splitlines()
    assert probe.startswith(
        "-i GPU-58f8-aa --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_"
    )
    assert loop == f"{probe} --loop-ms=100"
    start = datetime.datetime(2026, 12, 1, 14, 0, 0, 250000).timestamp()
    assert summary == {
        "samples": 2,
        "sm_clock_mhz": [1890.0, 1800.0, 1980.0],
        "power_w": [695.25, 700.0],
        "temperature_c": [42.0, 43.0],
        "slowdown_reasons": {"sw_power_cap": 1},
        "trace": [[round(start, 3), 1980.0, 690.5, 41.0, 0], [round(start + 0.3, 3), 1800.0, 700.0, 43.0, 4]],
    }


def test_gpu_clock_log_figures_leave_out_samples_before_the_window_the_block_marks(
    monkeypatch, tmp_path, one_fake_cuda_device
):
    import time

    from benchmarks import common

    lines = "2026/12/01 14:00:00.250, 1980, 480, 38, 0x0000000000000000\\n"  # (the settle steps')
    lines += "2026/12/01 14:00:01.250, 1755, 698, 50, 0x0000000000000004\\n"
    lines += "2026/12/01 14:00:01.550, 1800, 700, 51, 0x0000000000000004\\n"
    fake_nvidia_smi(tmp_path, monkeypatch, lines)
    with common.gpu_clock_log() as summary:
        time.sleep(0.5)
        summary["window_start_s"] = datetime.datetime(2026, 12, 1, 14, 0, 1).timestamp()
    assert summary["samples"] == 2
    assert summary["sm_clock_mhz"] == [1777.5, 1755.0, 1800.0] and summary["temperature_c"] == [50.5, 51.0]
    assert [sample[1] for sample in summary["trace"]] == [1980.0, 1755.0, 1800.0]  # (the trace keeps all)


def test_gpu_clock_log_falls_back_to_clock_and_power_where_the_driver_refuses_a_field(
    monkeypatch, tmp_path, one_fake_cuda_device
):
    import time

    from benchmarks import common

    fake_nvidia_smi(tmp_path, monkeypatch, "1980, 690.5\\n1800, 700\\n", refuse="clocks_throttle_reasons")
    with common.gpu_clock_log() as summary:
        time.sleep(0.5)
    loop = (tmp_path / "calls").read_text().splitlines()[1]
    assert loop.endswith("--query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits --loop-ms=100")
    assert summary == {"samples": 2, "sm_clock_mhz": [1890.0, 1800.0, 1980.0], "power_w": [695.25, 700.0]}


def test_clocks_per_step_places_samples_in_each_steps_device_window():
    from benchmarks.common import clocks_per_step

    # three steps of 100 / 200 / 100 ms ending at t = 10.4 s: windows [10.0, 10.1), [10.1, 10.3), [10.3, 10.4)
    trace = [
        [9.95, 1980.0, 600.0, 40.0, 0],  # before the first step
        [10.05, 1700.0, 690.0, 41.0, 4],
        [10.15, 1800.0, 680.0, 41.0, 0],
        [10.25, 1900.0, 650.0, 42.0, 0x20],
        [10.45, 1980.0, 300.0, 42.0, 0],  # after the last
    ]
    assert clocks_per_step(trace, 10.4, [100.0, 200.0, 100.0]) == [
        [1700.0, 690.0, "0x4"],
        [1850.0, 665.0, "0x20"],
        None,
    ]


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


def test_run_for_steps_until_the_time_has_passed_and_the_device_has_finished(monkeypatch):
    import time

    import torch

    from benchmarks.common import run_for

    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(len(steps)))
    steps = []
    assert run_for(lambda: steps.append(time.sleep(0.01)), 0.0) == 0 and syncs == [0, 0]
    start = time.perf_counter()
    ran = run_for(lambda: steps.append(time.sleep(0.01)), 0.1)
    assert (
        time.perf_counter() - start >= 0.1 and ran == len(steps) and 1 <= ran <= 11
    )  # (each step sleeps at least 10 ms)
    assert syncs[-1] == ran  # the last wait comes after every step


def test_run_for_calls_after_step_with_each_steps_number(monkeypatch):
    import torch

    from benchmarks.common import run_for

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    after = []
    ran = run_for(lambda: None, 0.02, after_step=after.append)
    assert ran >= 1 and after == list(range(1, ran + 1))


def test_run_for_with_max_ahead_waits_until_at_most_that_many_calls_are_unfinished(monkeypatch):
    import torch

    from benchmarks.common import run_for

    steps, waited = [], []  # waited: (the step whose event was waited on, how many steps had run)

    class Event:  # stands in for torch.cuda.Event: records which step it followed
        def record(self):
            self.step = len(steps)

        def synchronize(self):
            waited.append((self.step, len(steps)))

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    ran = run_for(lambda: steps.append(None), 0.02, max_ahead=2)
    assert ran == len(steps) >= 3
    # after step n (from the third), step n - 2's event: never more than two calls unfinished
    assert waited == [(n - 2, n) for n in range(3, ran + 1)]
    waited.clear()
    run_for(lambda: steps.append(None), 0.01)
    assert waited == []  # (without max_ahead, no event)


def test_clocks_per_call_takes_the_samples_inside_each_calls_timed_windows():
    # [epoch s, MHz, W, C, slowdown mask] as clock_summary's trace; ours timed in [1, 2) and [5, 6), cuDNN in [3, 4)
    trace = [[0.5, 1980, 400, 50, 0], [1.2, 1900, 690, 60, 4], [1.8, 1700, 700, 61, 4], [3.5, 1800, 650, 60, 0],
             [4.5, 1500, 700, 62, 4], [5.1, 1600, 698, 62, 4]]  # fmt: skip
    windows = {
        "ours_fwdbwd": [(1.0, 2.0), (5.0, 6.0)],
        "cudnn_fwdbwd": [(3.0, 4.0)],
        "cudnn_fwd": [(7, 8)],
    }
    figures = common.clocks_per_call({"trace": trace}, windows)
    assert figures["ours_fwdbwd"] == {
        "median_mhz_w": [1700, 698],
        "per_round": [[1800.0, 695.0, "0x4"], [1600, 698, "0x4"]],
    }
    assert figures["cudnn_fwdbwd"] == {"median_mhz_w": [1800, 650], "per_round": [[1800, 650, "0x0"]]}
    assert figures["cudnn_fwd"] == {"median_mhz_w": None, "per_round": [None]}
    assert common.clocks_per_call({"error": "nvidia-smi did not start"}, windows) == {
        "error": "nvidia-smi did not start"
    }


def _callee():
    total = 0
    for i in range(3000):  # (Python work of its own: a builtin's time would be the builtin's entry)
        total += i
    return total


def _caller():
    return _callee() + _callee()


@pytest.mark.parametrize("key", ["own", "cum"])
def test_profile_top_ranks_by_own_or_cumulative_time_per_step(key):
    """profile_top: per step of the profiled calls, each function's calls and times; by cumulative time a
    caller ranks above the function it calls (its time includes the callee's), by own time below it."""
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(4):
        _caller()
    prof.disable()
    top = common.profile_top(prof, steps=4, top=50, key=key)
    names = [entry["function"] for entry in top]
    caller, callee = (
        next(i for i, n in enumerate(names) if n.endswith(f"({name})")) for name in ("_caller", "_callee")
    )
    assert (caller < callee) == (key == "cum")
    assert top[callee]["calls"] == 2 and top[caller]["calls"] == 1
    assert top[caller]["cum_ms"] >= top[callee]["cum_ms"] > top[caller]["own_ms"]
