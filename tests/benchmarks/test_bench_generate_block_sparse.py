"""bench_generate_block_sparse's measurement on a tiny model on the CPU (the kernels through the interpreter)."""

import pytest
import torch

from benchmarks.bench_generate_block_sparse import measure, models


@pytest.mark.parametrize("layout, kv_heads", [("butterfly", None), ("random", 1)])
def test_a_row_times_both_ways_and_compares_their_tokens(layout, kv_heads, device):
    sparse, dense = models(16, 72, device, torch.float32, n_layer=1, d_model=32, vocab_size=40, block=16,
                           layout=layout, kv_heads=kv_heads)  # fmt: skip
    row = measure(sparse, dense, batch=2, prompt_len=60, new_tokens=3, rounds=1)
    assert row["same_tokens"] and row["first_difference"] is None
    assert row["prompt_logits_max_diff"] <= 1e-4 * row["prompt_logits_max"]
    assert 0 < row["density"] < 1 and row["headdim"] == 16 and row["prompt"] == 60
    assert row["kv_heads"] == (kv_heads or 2) and row["layout"].startswith(layout)
    assert row["graph_same_as_eager"]
    for name in ("cache", "cache_eager", "recompute", "dense"):
        assert len(row[f"{name}_ms"]) == 1 and row[f"{name}_per_token"] == row[name] / 3 > 0
    assert row["speedup"] == row["recompute"] / row["cache"]
    for name in ("cache_step", "dense_step"):  # (ms a token of the steps alone)
        assert len(row[f"{name}_ms"]) == 1 and row[name] > 0
    assert row["dense_step_over_cache_step"] == row["dense_step"] / row["cache_step"]
