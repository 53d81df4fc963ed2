"""CPU tests of bench_block_sparse's summary: the ideals and the bytes floor it reports per point."""

import pytest

from benchmarks.bench_block_sparse import min_fwdbwd_bytes, summarize


def test_min_fwdbwd_bytes_counts_twelve_tensors_and_two_lse_passes():
    # n4k, 16 heads of 128, bf16: each of q, k, v, o, dO, dq, dk, dv is 16 MiB
    tensor = 4096 * 16 * 128 * 2
    assert min_fwdbwd_bytes(1, 4096, 16, 128) == 12 * tensor + 2 * 16 * 4096 * 4
    assert min_fwdbwd_bytes(2, 4096, 16, 64) == min_fwdbwd_bytes(1, 8192, 16, 64)


def _rows(density: float, ours_graph: float, dense_graph: float) -> list[dict]:
    base = dict(seqlen=4096, headdim=128, nheads=16, batch=1, block=128)
    layout = {"n_factors": 1, "local_blocks": 0}
    return [
        dict(base, impl="ours_dense", density=1.0, layout=None, fwd_ms=0.2, fwdbwd_ms=0.8, fwdbwd_graph_ms=dense_graph),
        dict(base, impl="ours_bs", density=density, layout=layout, fwd_ms=0.1, fwdbwd_ms=0.6,
             fwdbwd_graph_ms=ours_graph),
        dict(base, impl="flex", density=density, layout=layout, fwd_ms=0.1, fwdbwd_ms=0.7, fwdbwd_graph_ms=0.15),
    ]  # fmt: skip


@pytest.mark.parametrize("density", [0.0625, 0.1875, 0.49])
def test_summary_gives_graph_ideal_and_bytes_floor(density):
    ours_graph, dense_graph, tb_per_s = 0.115, 0.834, 4.15
    (row,) = summarize(_rows(density, ours_graph, dense_graph), tb_per_s)
    assert row["ideal_fwdbwd_ms"] == pytest.approx(0.8 * density)
    assert row["ideal_fwdbwd_graph_ms"] == pytest.approx(dense_graph * density)
    assert row["ours_over_ideal_graph"] == pytest.approx(ours_graph / (dense_graph * density))
    floor = min_fwdbwd_bytes(1, 4096, 16, 128) / (tb_per_s * 1e9)  # ms
    assert row["bytes_floor_ms"] == pytest.approx(floor)
    assert row["ours_over_bytes_floor"] == pytest.approx(ours_graph / floor)
    assert row["speedup_vs_flex_fwdbwd_graph"] == pytest.approx(0.15 / ours_graph)


def test_summary_without_bandwidth_or_graphs_leaves_those_columns_out():
    rows = _rows(0.0625, 0.115, 0.834)
    for r in rows:
        r.pop("fwdbwd_graph_ms")
    (row,) = summarize(rows)
    assert "bytes_floor_ms" not in row and "ideal_fwdbwd_graph_ms" not in row
    assert row["ours_over_ideal"] == pytest.approx(0.6 / (0.8 * 0.0625))
