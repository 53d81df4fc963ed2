"""benchmarks/ab_block_sparse.py's A/B bookkeeping (the timing itself needs a GPU): each variant's off and
on settings reach the routes the block-sparse kernels read, and the routes are restored after each point,
so one variant's measurement never runs in another's state."""

from __future__ import annotations

import pytest
import torch

from benchmarks import ab_block_sparse as ab
from kernels import _block_sparse_hopper as bs
from kernels.layouts import local_layout


@pytest.mark.parametrize("variant", sorted(ab.VARIANTS))
def test_ab_point_alternates_the_settings_and_restores_the_routes(monkeypatch, variant):
    before = ab.routes()
    seen = []

    def fake_timings(fn, args):
        # off and on must reach different routes; time "on" as twice as fast
        seen.append(ab.routes())
        return (1.0, 2.0) if len(seen) % 2 else (0.5, 1.0)

    def fake_outputs(fn, args):
        # off's and on's outputs are compared: on's differ by 0.25 here
        outputs = [torch.zeros(3)] if len(outputs_seen) == 0 else [torch.full((3,), 0.25)]
        outputs_seen.append(ab.routes())
        return outputs

    outputs_seen = []
    monkeypatch.setattr(ab, "timings", fake_timings)
    monkeypatch.setattr(ab, "_outputs", fake_outputs)
    row = ab.ab_point(variant, None, None)
    assert len(seen) == 4 and seen[0] == seen[2] and seen[1] == seen[3] and seen[0] != seen[1]
    assert outputs_seen == seen[:2]
    assert row["on_speedup_graph"] == 2.0 and row["on_speedup_eager"] == 2.0
    assert row["max_diff_off_on"] == 0.25
    assert ab.routes() == before


@pytest.mark.parametrize("variant", ["row_tile_forward_turns", "persistent_forward_turns"])
def test_turn_variants_reach_the_forwards_config(monkeypatch, variant):
    """On: the chosen forward config with its consumers taking turns; off: without. The row-tile variant
    reaches long lists, the persistent one short lists (d128: past / within PERSISTENT_FORWARD's 20 tiles)."""
    configs = []
    monkeypatch.setattr(
        bs.fwd_hopper, "flash_attn_forward_hopper", lambda *a, config, **kw: configs.append(config)
    )
    state = ab.routes()
    q = torch.randn(1, 4096, 2, 128, dtype=torch.bfloat16)
    band = 16 if variant == "row_tile_forward_turns" else 1  # (~24 or ~2.9 64-key tiles a program)
    try:
        for on in (True, False):
            ab.VARIANTS[variant](on)
            bs.block_sparse_forward_hopper(q, q, q, local_layout(4096, 128, band), False, 0.1)
    finally:
        ab.restore_routes(state)
    assert [c.pingpong for c in configs] == [True, False]
    assert {c.persistent for c in configs} == {variant == "persistent_forward_turns"}


def test_d64_persistent_forward_variant_reaches_the_forwards_choice(monkeypatch):
    """On: the persistent forward even for lists past PERSISTENT_FORWARD's limit; off: never."""
    configs = []
    monkeypatch.setattr(
        bs.fwd_hopper, "flash_attn_forward_hopper", lambda *a, config, **kw: configs.append(config)
    )
    monkeypatch.setitem(bs.PERSISTENT_FORWARD, 64, bs.PERSISTENT_FORWARD[64])  # (restored afterwards)
    q = torch.randn(1, 4096, 2, 64, dtype=torch.bfloat16)
    for on in (True, False):
        ab.VARIANTS["d64_persistent_forward"](on)
        bs.block_sparse_forward_hopper(q, q, q, local_layout(4096, 128, 10), False, 0.1)  # ~17.6 tiles
    assert [c.persistent for c in configs] == [True, False]


@pytest.mark.parametrize("seqlen", [4096, 16384])
@pytest.mark.parametrize("low, high", [(0.0, 0.11), (0.09, 0.11), (0.2, 0.3), (0.5, 0.4)])
def test_selected_points_keep_the_densities_asked_for(seqlen, low, high):
    from benchmarks.bench_block_sparse import butterfly_points

    every = butterfly_points(seqlen)
    picked = ab.selected_points(seqlen, low, high)
    assert [cfg for cfg, _ in picked] == [cfg for cfg, lay in every if low <= lay.density <= high]
    assert all(low <= lay.density <= high for _, lay in picked)
    if low <= high:  # the sweep has a point in each of these ranges
        assert picked
