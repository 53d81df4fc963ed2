"""check_large_offsets.py's cases run small (on CPU tensors through the interpreter, fp16): each compares the last rows of
a call with a reference (a slice near the end, float32 over every key, or a sequence alone), so its slicing
and reference math are checked here before a GPU call spends minutes on 2**31-element tensors. (wide_cost
times CUDA events: GPU only.)"""

from __future__ import annotations

import pytest
import torch

import benchmarks.check_large_offsets as clo


@pytest.fixture
def small(monkeypatch, device):
    monkeypatch.setattr(clo, "DEVICE", device)
    monkeypatch.setattr(clo, "DTYPE", torch.float16)
    monkeypatch.setattr(clo, "TAIL", 16)
    monkeypatch.setattr(clo, "WINDOW", 32)


CASES = {
    "window_bwd": lambda: clo.case_window(96, 2, 16, backward=True),
    "varlen_window": lambda: clo.case_varlen_window(72, 2, 16, short=8),
    "causal": lambda: clo.case_causal(64, 2, 16),
    "causal_bwd_one_head": lambda: clo.case_causal_bwd(64, 3, 16),
    "causal_bwd_all_heads": lambda: clo.case_causal_bwd(64, 2, 16, used=2),
    "block_sparse": lambda: clo.case_block_sparse(96, 2, 16, block=16),
    "block_sparse_bwd": lambda: clo.case_block_sparse_bwd(96, 2, 16, block=16),
    "decode": lambda: clo.case_decode(100, 2, 16),
    "anchors": lambda: clo.case_anchors(64, 2, 16, impls=("ours", "sdpa_math"), batch=2),
    "batch_window": lambda: clo.case_batch("window", batch=3, n=64, h=2, d=16),
    "batch_decode": lambda: clo.case_batch("decode", batch=3, n=64, h=2, d=16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_agrees_with_its_reference_on_small_tensors(small, name):
    torch.manual_seed(0)
    row = CASES[name]()
    if name == "anchors":
        assert row["out_scale"] > 0 and row["dq_scale"] > 0
        rows = [row[impl] for impl in ("ours", "sdpa_math")]
    else:
        rows = [row]
    diffs = [[value for key, value in row.items() if key in ("out", "dq", "dk", "dv")] for row in rows]
    assert all(diffs) and all(value < 5e-3 for values in diffs for value in values), rows


def test_a_call_reading_the_wrong_rows_is_caught(small, monkeypatch):
    """The comparison can fail: outputs one row off (as a wrapped offset would give) differ by far more."""
    torch.manual_seed(0)
    real = clo.flash_attention
    monkeypatch.setattr(clo, "flash_attention", lambda *args, **kw: real(*args, **kw).roll(1, dims=1))
    assert clo.case_causal(64, 2, 16)["out"] > 0.05
