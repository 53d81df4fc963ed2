"""CPU tests of bench_train's per-step spans (the timing itself needs a GPU)."""

from benchmarks.bench_train import step_spans


class FakeEvent:
    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, later: "FakeEvent") -> float:
        return later.ms - self.ms


def test_step_spans_show_the_step_that_stalled():
    spans = step_spans(10.0, [10.030, 10.060, 10.260, 10.290], [FakeEvent(t) for t in (0, 31, 62, 261, 292)])
    assert spans["step_ms_host"] == [30.0, 30.0, 200.0, 30.0]
    assert spans["step_ms_device"] == [31.0, 31.0, 199.0, 31.0]
