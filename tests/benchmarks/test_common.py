"""`benchmarks.common`'s pure helpers (the GPU-facing ones run on the device machine)."""

from __future__ import annotations

import pytest

from benchmarks.common import idle_gaps, rotated


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
