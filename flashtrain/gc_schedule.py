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


@contextlib.contextmanager
def scheduled_gc(every: int) -> Iterator[Callable[[int], None]]:
    """Inside the block, call the yielded function with the step number after each step; it collects
    generations 0-1 every `every` steps. every = 0 leaves Python's automatic collection alone.
    Automatic collection is restored on exit, whatever it was before."""
    if every < 0:
        raise ValueError(f"gc every {every} steps: use a positive step count, or 0 for Python's own schedule")
    if every == 0:
        yield lambda step: None
        return
    was_enabled = gc.isenabled()
    gc.collect()  # start from a clean heap, so the young generations stay small
    gc.disable()

    def after_step(step: int) -> None:
        if step % every == 0:
            gc.collect(1)

    try:
        yield after_step
    finally:
        if was_enabled:
            gc.enable()
