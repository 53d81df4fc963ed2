"""Shared benchmark helpers: timing with CUDA events, peak memory, and the results-file writer.

Every benchmark writes one JSON file to benchmarks/results/ with the same top level (device, torch,
triton, date, rows), plus optional markdown and PNG renderings of the rows.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable

import torch


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()})"


def gpu_slug() -> str:
    """Short lower-case GPU name for file names, e.g. 'h200' from 'NVIDIA H200'."""
    name = device_name().lower()
    for tag in ("h200", "h100", "a100", "l40s", "a10g", "b200", "gh200"):
        if tag in name:
            return tag
    return name.replace("nvidia", "").strip().replace(" ", "_") or "cpu"


def versions() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # a benchmark of torch-only code still records what it can
        triton_version = None
    return {
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        # (SDPA's cuDNN backend is an anchor, and its behaviour moves with the library's version)
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def time_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median milliseconds of fn on the GPU (triton's do_bench: CUDA events, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def mean_ms(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Mean milliseconds of fn over reps back-to-back calls between two CUDA events, after `warmup` calls
    (which build and tune): for calls long enough that do_bench's L2 flushes and repeats add nothing."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def run_for(step, seconds: float, after_step=None, max_ahead: int | None = None) -> int:
    """Run step until `seconds` of wall time have passed and the device has finished them, calling
    after_step(n) after the n-th (as the timed steps call the gc schedule's); returns how many ran (none
    for seconds <= 0). The host may queue calls far ahead of the device (1076 d128 forwards at 64k keys,
    30 s of device work, in 1.5 s; results/s81/call5): with max_ahead, it waits after each call until at
    most that many are unfinished, so that the wall time is the device's."""
    torch.cuda.synchronize()
    start, ran, pending = time.perf_counter(), 0, collections.deque()
    while time.perf_counter() - start < seconds:
        step()
        ran += 1
        if after_step is not None:
            after_step(ran)
        if max_ahead is not None:
            pending.append(torch.cuda.Event())
            pending[-1].record()
            while len(pending) > max_ahead:
                pending.popleft().synchronize()
    torch.cuda.synchronize()
    return ran


def wall_ms(fn: Callable[[], object]) -> float:
    """Milliseconds of one call of fn by the host's clock, the GPU's queue drained before and after (a
    whole call with its host work: a generation, not a kernel)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def copy_bandwidth(nbytes: int = 1 << 30) -> dict:
    """The device's copy bandwidth: one device-to-device copy of nbytes (`time_ms`'s median), counted as
    read + write: {"bytes_moved", "median_ms", "tb_per_s"}. What a memory-bound kernel can reach at best
    (an H200 gave 4.15 TB/s, results/s60/call1)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    median = time_ms(lambda: dst.copy_(src))
    return {"bytes_moved": 2 * nbytes, "median_ms": median, "tb_per_s": 2 * nbytes / median / 1e9}


def rotated(names: list | tuple, round_index: int) -> list:
    """The order to time names in at a round of alternating timings: each round starts one name later.
    With a fixed order the same kernels timed second came out 5-8% slower than timed first on one H100
    (results/s43/call2)."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def alternating_ms(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    settle_ms: float = 0.0,
    rep_ms: float = 100.0,
    windows: dict[str, list] | None = None,
) -> dict[str, list[float]]:
    """Each call's `time_ms` (timed for rep_ms) once a round for `rounds` rounds, each round in the `rotated`
    order: name -> its milliseconds, round by round. settle_ms > 0 runs each call back to back for that long
    right before its timing, so that the GPU's power and clock have settled at that call's draw (the H200's
    power controller moves over ~1 s; ab_cudnn.py's --settle-ms). windows, if given, gets name -> the
    (start, stop) epoch seconds of each timing, for `clocks_per_call`."""
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name in rotated(list(calls), r):
            spans = None if windows is None else windows.setdefault(name, [])
            times[name].append(settled_time_ms(calls[name], settle_ms, rep_ms, spans))
    return times


def settled_time_ms(
    fn: Callable[[], object], settle_ms: float = 0.0, rep_ms: float = 100.0, windows: list | None = None
) -> float:
    """`time_ms` of fn timed for rep_ms, right after settle_ms of fn back to back where settle_ms > 0 (at
    most 2 calls unfinished: the device kept busy, not flooded); windows, if given, gets the timing's
    (start, stop) epoch seconds appended."""
    if settle_ms > 0:
        run_for(fn, settle_ms / 1000, max_ahead=2)
    start = time.time()
    ms = time_ms(fn, rep_ms=rep_ms)
    if windows is not None:
        windows.append((start, time.time()))
    return ms


def with_settings(fn: Callable[[], object], module, **settings) -> Callable[[], object]:
    """fn run with the module's attributes set to settings, put back afterwards (an A/B's routes in one
    process: each call, a CUDA graph's capture included, sees its own settings)."""

    def run():
        saved = {name: getattr(module, name) for name in settings}
        for name, value in settings.items():
            setattr(module, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(module, name, value)

    return run


def print_summary(row: dict) -> None:
    """A result row on one line, floats rounded, the per-round lists (keys ending in _ms) left out."""
    print({key: (round(val, 3) if isinstance(val, float) else val) for key, val in row.items()
           if not key.endswith("_ms")}, flush=True)  # fmt: skip


def capture_graph(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn captured in a CUDA graph by PyTorch's recipe (three warm-up calls on a side stream, then the
    capture), and what the captured call returned (its tensors are rewritten by each replay). fn must
    be capturable: no host sync, nothing allocated outside torch's caching allocator, and no autograd
    graph of an earlier default-stream call still alive (check_graph_capture.py)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def graph_time_ms(fn: Callable[[], object], warmup_ms: float = 10, rep_ms: float = 50) -> float:
    """Median milliseconds of fn captured once in a CUDA graph (`capture_graph`) and replayed: its device
    time without the host's launch work, which dominates small problems (what a graph-captured training
    step pays)."""
    graph, _ = capture_graph(fn)
    return time_ms(graph.replay, warmup_ms, rep_ms)


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak CUDA memory allocated during one call of fn, above what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()  # host-device sync: the peak is read after the work is done
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def device_profile(
    fn: Callable[[], object],
    steps: int = 3,
    trace: str | None = None,
    top: int = 12,
    ops: int = 0,
    callers_of: str | None = None,
) -> dict:
    """Run fn `steps` times under torch.profiler (after one unprofiled call, so anything lazily built
    stays out): wall and device-busy ms per step (busy: the union of kernel and copy intervals, as
    streams overlap; busy < wall means the device idled, launch- or host-bound), communication (NCCL
    kernels) and all kernels summed per step (their sum > busy means they overlapped), kernels per step,
    the top kernels by device time and torch's operator table. On CPU there is no device work: busy 0.
    trace: a path for the Chrome trace of the profiled steps (the timeline: what overlapped what).
    top: how many kernels `top_kernels_ms` lists.
    ops: list that many operators by their own device time, per input shapes (`top_ops`): which eager
    op (and tensor) launched a kernel whose name alone does not say.
    callers_of: a kernel-name substring: the operators that launched such kernels, with their input
    shapes and the ranges around them (`kernel_callers`)."""
    from torch.profiler import ProfilerActivity

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof, wall_ms = _profiled(fn, steps, activities, record_shapes=ops > 0 or callers_of is not None)
    if trace is not None:
        prof.export_chrome_trace(trace)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in kernels]
    # the union of kernel intervals (streams overlap): their span less every gap between them
    busy = max(k[2] for k in spans) - min(k[1] for k in spans) - idle_gaps(spans, 0.0)[0] if spans else 0.0
    per_kernel: dict[str, float] = {}
    for e in kernels:
        per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us()
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]
    sort_key = "cuda_time_total" if cuda else "cpu_time_total"
    extra = {"top_ops": _top_ops(prof, steps, ops)} if ops else {}
    if callers_of is not None:
        extra["kernel_callers"] = _kernel_callers(prof, steps, callers_of)
    return {
        **extra,
        "wall_ms": wall_ms,
        "busy_ms": busy / 1e3 / steps,
        "comm_ms": sum(us for name, us in per_kernel.items() if "nccl" in name.lower()) / 1e3 / steps,
        "kernels_ms": sum(per_kernel.values()) / 1e3 / steps,
        "kernels_per_step": len(kernels) / steps,
        "top_kernels_ms": {name[:90]: round(us / 1e3 / steps, 3) for name, us in top},
        "table": prof.key_averages().table(sort_by=sort_key, row_limit=30, max_name_column_width=60),
    }


def device_gaps(fn: Callable[[], object], steps: int = 3, top: int = 15, min_us: float = 3.0) -> dict:
    """Where the device idles inside fn: run it `steps` times under a CUDA-only profiler (no CPU events,
    so the host runs at nearly its own speed), then walk the kernels in start order. A gap is time
    between the end of all earlier work and the next kernel's start (>= min_us); it is charged to the
    pair (kernel before, kernel after), the place in the step where the host fell behind. Returns the
    wall and idle ms per step and the `top` pairs by idle ms per step."""
    from torch.profiler import ProfilerActivity

    prof, wall_ms = _profiled(fn, steps, [ProfilerActivity.CUDA])
    kernels = [
        (e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    idle, pairs = idle_gaps(kernels, min_us)
    ranked = sorted(pairs.items(), key=lambda kv: -kv[1][0])[:top]
    first, last = min(k[1] for k in kernels), max(k[2] for k in kernels)
    return {
        "wall_ms": wall_ms,
        "span_ms": (last - first) / 1e3 / steps,
        "idle_ms": idle / 1e3 / steps,
        "gaps_top": [
            {"between": key, "idle_ms": round(us / 1e3 / steps, 3), "gaps_per_step": n / steps}
            for key, (us, n) in ranked
        ],
    }


def _profiled(fn: Callable[[], object], steps: int, activities: list, record_shapes: bool = False):
    """(profiler, wall ms per call) of fn run `steps` times under torch.profiler with these activities,
    after one unprofiled call (so anything lazily built stays out)."""
    from torch.profiler import profile

    cuda = torch.cuda.is_available()
    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=record_shapes) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()  # host-device sync: the wall time covers the queued work
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    return prof, wall_ms


def _top_ops(prof, steps: int, n: int) -> list[dict]:
    """The n operators with the most own device time per step, grouped by their input shapes."""
    events = prof.key_averages(group_by_input_shape=True)
    events = sorted(events, key=lambda e: -e.self_device_time_total)[:n]
    return [
        dict(op=e.key, shapes=str(e.input_shapes)[:200], calls=e.count / steps,
             self_device_ms=round(e.self_device_time_total / 1e3 / steps, 3))
        for e in events
    ]  # fmt: skip


def _kernel_callers(prof, steps: int, pattern: str) -> list[dict]:
    """The CPU operators whose launched kernels' names contain pattern: name, input shapes and the chain
    of enclosing operators, with launches and device ms per step, heaviest first."""
    found: dict[tuple, list] = {}
    for e in prof.events():
        hits = [k for k in e.kernels if pattern in k.name]
        if e.device_type != torch.autograd.DeviceType.CPU or not hits:
            continue
        chain, parent = [], e.cpu_parent
        while parent is not None and len(chain) < 6:
            chain.append(parent.name[:80])
            parent = parent.cpu_parent
        key = (e.name, str(e.input_shapes)[:200], " < ".join(chain))
        entry = found.setdefault(key, [0, 0.0])
        entry[0] += len(hits)
        entry[1] += sum(k.duration for k in hits)
    rows = [dict(op=op, shapes=shapes, inside=chain, launches=n / steps, device_ms=round(us / 1e3 / steps, 3))
            for (op, shapes, chain), (n, us) in found.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["device_ms"])


def idle_gaps(kernels: list[tuple[str, float, float]], min_us: float = 3.0) -> tuple[float, dict]:
    """(idle us, {"before -> after": [idle us, gaps]}) of (name, start us, end us) intervals on any
    streams: a gap is time between the end of all earlier work and the next start (>= min_us), charged
    to the kernel that ended last before it and the one that starts it."""
    pairs: dict[str, list[float]] = {}
    idle, end, before = 0.0, None, "(start)"
    for name, start, stop in sorted(kernels, key=lambda k: k[1]):
        if end is not None and start - end >= min_us:
            key = f"{before[:60]} -> {name[:60]}"
            pairs.setdefault(key, [0.0, 0])
            pairs[key][0] += start - end
            pairs[key][1] += 1
            idle += start - end
        if end is None or stop > end:
            end, before = stop, name
    return idle, pairs


def host_profile(fn: Callable[[], object], steps: int = 3, top: int = 25, key: str = "own") -> list[dict]:
    """cProfile of fn over `steps` calls (after one unprofiled call): the `top` Python functions by
    own time (or by cumulative time, key "cum": `profile_top`), per call of fn, with both times. For a step whose device idles (busy < wall
    in `device_profile`): which host code keeps the launches from keeping up. cProfile slows Python
    down, so read the ranking, not the absolute milliseconds."""
    import cProfile

    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    return profile_top(prof, steps, top, key)


def profile_top(prof, steps: int, top: int = 25, key: str = "own") -> list[dict]:
    """The `top` functions of a cProfile.Profile by own time (key "own") or cumulative time ("cum"), per step
    of `steps`, with both times."""
    import pstats

    # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    stats = pstats.Stats(prof).stats
    column = {"own": 2, "cum": 3}[key]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][column])[:top]
    return [
        {
            "function": f"{os.path.basename(file)}:{line}({name})",
            "calls": calls // steps,
            "own_ms": round(own * 1e3 / steps, 4),
            "cum_ms": round(cum * 1e3 / steps, 4),
        }
        for (file, line, name), (_, calls, own, cum, _) in rows
    ]


def profile_table(
    fn: Callable[[], object], path: str | None, steps: int = 3, title: str = "", trace: bool = False
) -> None:
    """`device_profile` of fn written to `path` (None: profile without writing, for ranks that must
    join the collectives of the profiled call): wall and device-busy time per step, kernels split into
    communication and everything else, and the top operators by device time. trace: also write the
    Chrome trace beside it (`path` with .trace.json for .txt)."""
    trace_path = path.removesuffix(".txt") + ".trace.json" if trace and path is not None else None
    p = device_profile(fn, steps, trace_path)
    lines = [
        title,
        f"wall {p['wall_ms']:.2f} ms/step; device busy {p['busy_ms']:.2f} ms/step; kernels: "
        f"communication {p['comm_ms']:.2f} ms/step, other {p['kernels_ms'] - p['comm_ms']:.2f} ms/step",
        p["table"],
    ]
    if path is not None:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


# What `gpu_clock_log` asks nvidia-smi for: a timestamp (to place each sample against the timed steps), the SM
# clock, the power draw, the temperature and the driver's reasons for holding the clock down (a bit mask:
# power cap, thermal slowdown, ...). Drivers that refuse a field get the first three's older pair.
CLOCK_FIELDS = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
CLOCK_FIELDS_FALLBACK = ("clocks.sm", "power.draw")
# nvidia-smi's names for the bits of clocks_throttle_reasons.active (NVML's nvmlClocksEventReason*)
SLOWDOWN_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}  # fmt: skip


@contextlib.contextmanager
def gpu_clock_log(interval_ms: int = 100):
    """Sample the current CUDA device's SM clock (MHz), power draw (W), temperature and slowdown reasons with
    nvidia-smi every interval_ms while the block runs. Yields a dict that is filled on exit with
    `clock_summary`'s figures, or with "error" saying why there are none (no nvidia-smi, or it failed): a
    training step that runs at the power cap shows as SM clocks under the GPU's boost clock, and as
    "sw_power_cap" among the reasons. (nvidia-smi is a separate process: it costs the host a little CPU
    every interval, and it samples less often than asked, ~3 times a second on the lent H200s.)

    Starting it takes nvidia-smi ~1 s, in which the host launches nothing and the GPU idles and cools: start
    it before the steps that warm the GPU, then set summary["window_start_s"] (epoch seconds) where the
    steps to describe begin: the figures leave out samples taken before it, the trace keeps them."""
    summary: dict = {}
    # (the device by UUID: CUDA_VISIBLE_DEVICES renumbers devices for torch, not for nvidia-smi; torch
    # versions differ in whether the UUID's string has nvidia-smi's "GPU-" prefix)
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"

    def query(fields):
        return ["nvidia-smi", "-i", uuid, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]

    try:  # one sample first: does this driver know every field?
        probe = subprocess.run(query(CLOCK_FIELDS), capture_output=True, text=True, timeout=20)
        fields = CLOCK_FIELDS if "error" not in clock_summary(probe.stdout) else CLOCK_FIELDS_FALLBACK
        sampler = subprocess.Popen(
            [*query(fields), f"--loop-ms={interval_ms}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        summary["error"] = f"nvidia-smi did not start: {e}"
        yield summary
        return
    try:
        yield summary
    finally:
        sampler.terminate()
        output, _ = sampler.communicate()
        summary.update(clock_summary(output, since_s=summary.get("window_start_s")))


def _clock_sample(line: str) -> tuple | None:
    """(epoch seconds or None, SM MHz, W, degrees C or None, slowdown bit mask or None) from one line of
    CLOCK_FIELDS (or CLOCK_FIELDS_FALLBACK's pair); None for a line that is not a sample."""
    parts = [p.strip() for p in line.split(",")]
    try:
        if len(parts) == 2:
            return None, float(parts[0]), float(parts[1]), None, None
        if len(parts) == 5:
            # (nvidia-smi prints the machine's local time, which .timestamp() reads the same way)
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            return stamp, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)
    except ValueError:
        pass
    return None


def clock_summary(output: str, since_s: float | None = None) -> dict:
    """The figures of nvidia-smi's CLOCK_FIELDS lines (no header, no units): sample count, SM clock MHz
    median / min / max, power W median / max, and where the driver gave them the temperature's median /
    max, how many samples named each slowdown reason (SLOWDOWN_REASONS) and every sample as [epoch s, MHz,
    W, C, mask] ("trace", for `clocks_per_step`). Lines that are not samples are skipped; with since_s
    (epoch seconds) the figures leave out samples stamped before it, the trace keeps them. With no sample
    (in the window), "error" holds the output's first line."""
    every_sample = [s for s in map(_clock_sample, output.splitlines()) if s is not None]
    # (samples without a stamp, CLOCK_FIELDS_FALLBACK's, cannot be placed: kept)
    samples = [s for s in every_sample if since_s is None or s[0] is None or s[0] >= since_s]
    if not samples:
        first = output.strip().splitlines()[0] if output.strip() else "no output"
        return {"error": f"no clock samples from nvidia-smi: {first[:200]}"}
    stamps, clocks, powers, temps, masks = zip(*samples, strict=True)
    summary = {
        "samples": len(samples),
        "sm_clock_mhz": [statistics.median(clocks), min(clocks), max(clocks)],
        "power_w": [statistics.median(powers), max(powers)],
    }
    if None not in stamps:
        reasons = {
            name: sum(bool(m & bit) for m in masks) for bit, name in SLOWDOWN_REASONS.items() if any(m & bit for m in masks)
        }  # fmt: skip
        summary.update(
            temperature_c=[statistics.median(temps), max(temps)],
            slowdown_reasons=reasons,
            trace=[[round(t, 3), c, w, d, m] for t, c, w, d, m in every_sample],
        )
    return summary


def clocks_per_step(trace: list, end_s: float, step_ms: list[float]) -> list:
    """Each step's SM clock and power from a `clock_summary` trace: [median MHz, median W, slowdown bit
    masks or-ed] of the samples inside the step's device window, or None where none fell in it. The
    windows are laid back to back, ending at end_s (epoch seconds, taken when the last step had
    finished on the device), each as long as the step's device time; the first steps' windows are only
    as good as that (host stalls between steps shift them)."""
    windows, end = [], end_s
    for ms in reversed(step_ms):
        windows.append((end - ms / 1000, end))
        end -= ms / 1000
    return [clocks_in_window(trace, start, stop) for start, stop in reversed(windows)]


def clocks_per_call(summary: dict, windows: dict[str, list]) -> dict:
    """Per call name: [median MHz, median W] over the samples of a `gpu_clock_log` summary's trace stamped
    inside its timed windows ((start, stop) epoch seconds, one a round), and each round's `clocks_in_window`
    (None where nvidia-smi took no sample in it); or the sampler's error."""
    if "trace" not in summary:
        return {"error": summary.get("error", "no clock trace")}
    figures = {}
    for name, spans in windows.items():
        inside = [s for s in summary["trace"] if any(start <= s[0] < stop for start, stop in spans)]
        figures[name] = {
            "median_mhz_w": [statistics.median(s[1] for s in inside), statistics.median(s[2] for s in inside)]
            if inside
            else None,
            "per_round": [clocks_in_window(summary["trace"], start, stop) for start, stop in spans],
        }
    return figures


def clocks_in_window(trace: list, start_s: float, stop_s: float) -> list | None:
    """[median MHz, median W, slowdown bit masks or-ed (hex)] of a `clock_summary` trace's samples stamped in
    [start_s, stop_s) (epoch seconds), or None where none fell in it."""
    inside = [s for s in trace if start_s <= s[0] < stop_s]
    if not inside:
        return None
    mask = 0
    for s in inside:
        mask |= s[4]
    return [statistics.median(s[1] for s in inside), statistics.median(s[2] for s in inside), hex(mask)]


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def error_note(exc: BaseException) -> str:
    """One line for a result row whose run failed ("OOM: ..." for out of memory); prints the traceback
    of any other failure, which is a bug to look at rather than a result."""
    if not is_oom(exc):
        traceback.print_exc()
    return ("OOM: " if is_oom(exc) else "") + f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


def write_results(path: str, rows: list[dict], extra: dict | None = None) -> dict:
    """Write {device, torch, triton, date, ..., rows} as JSON; returns the written record."""
    record = {**versions(), **(extra or {}), "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return record


def markdown_table(rows: list[dict], columns: list[str], floatfmt: str = "{:.1f}") -> str:
    """A GitHub markdown table of the given columns; missing values print as '-'."""

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return floatfmt.format(v)
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)
