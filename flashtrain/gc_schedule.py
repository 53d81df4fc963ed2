"""Python's cyclic garbage collector on a fixed step schedule instead of its allocation threshold.

After torch.compile a training process holds millions of Python objects, and a full collection that
the allocation threshold happens to trigger inside a step stalls the host while the GPU waits. As in
torchtitan (`gc_freq`), automatic collection is off while training and the young generations are
collected every N steps. Measured on an H200 (GPT-2 small, 1k context, 10 timed steps, our attention):
466-478k tokens/s in four runs with it, 473-478k in three without; the one slow run seen without it
(376k) is the kind of stall this guards against, its cause not confirmed (benchmarks/NOTES_attention.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


class GCSchedule:
    """From construction until `close()`: automatic collection off (after one full collection, so the
    young generations start small) and generations 0-1 collected by `after_step(step)` every `every`
    steps. every = 0 leaves Python's automatic collection alone. `close()` restores automatic
    collection if it was on before."""

    def __init__(self, every: int):
        if every < 0:
            raise ValueError(
                f"gc every {every} steps: use a positive step count, or 0 for Python's own schedule"
            )
        self.every = every
        self._restore = every > 0 and gc.isenabled()
        if every > 0:
            gc.collect()
            gc.disable()

    def after_step(self, step: int) -> None:
        if self.every > 0 and step % self.every == 0:
            gc.collect(1)

    def close(self) -> None:
        if self._restore:
            gc.enable()


@contextlib.contextmanager
def scheduled_gc(every: int) -> Iterator[Callable[[int], None]]:
    """`GCSchedule` as a block: yields its `after_step`, closes it on exit (also on an exception)."""
    schedule = GCSchedule(every)
    try:
        yield schedule.after_step
    finally:
        schedule.close()
