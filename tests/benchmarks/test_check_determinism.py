"""`benchmarks.check_determinism`'s repeat comparison, on CPU with stand-in attention functions."""

from __future__ import annotations

import torch

from benchmarks.check_determinism import NAMES, _repeats


def _inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(1, 8, 2, 4, dtype=torch.float64)


def _attention(q, k, v, causal):
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def test_a_function_that_repeats_itself_bit_for_bit_has_no_differing_repeat():
    found = _repeats(_attention, _inputs(), causal=False, repeats=3)
    assert found == {"differing_repeats": dict.fromkeys(NAMES, 0), "max_abs_diff": dict.fromkeys(NAMES, 0.0)}


def test_a_gradient_that_changes_from_run_to_run_is_counted_with_its_largest_difference():
    """v's gradient gets a run-dependent term (as atomics' arrival order would give), out and the
    other gradients not: only dv is counted, every repeat, with the largest difference seen."""
    runs = iter(range(1, 100))

    def attention_with_drifting_dv(q, k, v, causal):
        scale = 1.0 + 1e-6 * next(runs)  # 1 + 1e-6, then 1 + 2e-6, ...
        v_used = v.detach() + scale * (v - v.detach())  # same value, gradient scaled per run
        return _attention(q, k, v_used, causal)

    found = _repeats(attention_with_drifting_dv, _inputs(), causal=False, repeats=4)
    assert found["differing_repeats"] == {"out": 0, "dq": 0, "dk": 0, "dv": 4}
    assert 0 < found["max_abs_diff"]["dv"] < 1e-4
    assert found["max_abs_diff"]["dq"] == found["max_abs_diff"]["dk"] == 0.0
