"""CPU tests of bench_train's per-step spans (the timing itself needs a GPU)."""

import os

from benchmarks.bench_train import host_sample, step_spans


class FakeEvent:
    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, later: "FakeEvent") -> float:
        return later.ms - self.ms


def test_step_spans_show_the_step_that_stalled_and_who_took_the_cpus():
    # (wall, thread CPU, process CPU, (busy, total jiffies)); step 3 stalled with the machine's CPUs busy
    samples = [
        (10.000, 1.000, 1.000, (0, 0, 16)),
        (10.030, 1.025, 1.026, (10, 100, 16)),
        (10.060, 1.050, 1.052, (20, 200, 16)),
        (10.260, 1.075, 1.080, (120, 300, 16)),
        (10.290, 1.100, 1.106, (130, 400, 16)),
    ]
    spans = step_spans(samples, [FakeEvent(t) for t in (0, 31, 62, 261, 292)])
    assert spans["step_ms_host"] == [30.0, 30.0, 200.0, 30.0]
    assert spans["step_ms_device"] == [31.0, 31.0, 199.0, 31.0]
    assert spans["step_cpu_ms_main"] == [25.0, 25.0, 25.0, 25.0]
    assert spans["step_cpu_ms_other_threads"] == [1.0, 1.0, 3.0, 1.0]
    assert spans["step_busy_cores"] == [1.6, 1.6, 16.0, 1.6]


def test_step_spans_without_proc_stat_give_no_core_count():
    samples = [(0.0, 0.0, 0.0, None), (0.03, 0.02, 0.02, None)]
    assert step_spans(samples, [FakeEvent(0), FakeEvent(30)])["step_busy_cores"] == [None]


def test_host_sample_reads_this_machine():
    wall, thread, process, system = host_sample()
    assert wall > 0 and thread >= 0 and process >= thread
    if os.path.exists("/proc/stat"):
        busy, total, cpus = system
        assert 0 <= busy <= total and cpus >= 1


def launched_kernel_names() -> set[str]:
    """The names our attention kernels run under in a profile: every kernel the kernels package launches
    (autotuned, through CompiledLaunch, or launched directly as name[grid](...)) but the loss's."""
    import importlib
    import pkgutil
    import re

    import triton

    import kernels
    from kernels._launch import CompiledLaunch

    names = set()
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for value in vars(module).values():
            if isinstance(value, triton.runtime.Autotuner):
                names.add(value.fn.__name__)
            elif isinstance(value, CompiledLaunch):
                names.add(value.kernel.__name__)
        source = open(module.__file__).read()
        for name in re.findall(r"^\s*(_\w+)\[[^\]\n]*\]\(", source, flags=re.MULTILINE):
            kernel = getattr(module, name)
            names.add(kernel.fn.__name__ if isinstance(kernel, triton.runtime.Autotuner) else kernel.__name__)
    return names - {"_cross_entropy_rows"}


def test_every_attention_kernel_of_ours_counts_as_attention_in_profiles():
    # the portable dq ("_bwd_dq") once dropped out of ab_train_route's attention tally (results/s60/call1)
    from benchmarks.bench_train import ATTENTION_HINTS

    names = launched_kernel_names()
    assert {"_bwd_dq", "_bwd_dkdv", "_attn_fwd_hopper", "_bs_fwd_kernel", "_decode_split"} <= names
    missed = [n for n in sorted(names) if not any(hint in n.lower() for hint in ATTENTION_HINTS)]
    assert not missed, f"add a hint for {missed} to ATTENTION_HINTS"
