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

    monkeypatch.setattr(ab, "timings", fake_timings)
    row = ab.ab_point(variant, None, None)
    assert len(seen) == 4 and seen[0] == seen[2] and seen[1] == seen[3] and seen[0] != seen[1]
    assert row["on_speedup_graph"] == 2.0 and row["on_speedup_eager"] == 2.0
    assert ab.routes() == before


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
