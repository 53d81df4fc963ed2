"""benchmarks/ab_cudnn.py's command line (the timing itself needs a GPU): a K/V head count that does not
divide the query heads, a GQA kernel group under 1, or timings that cannot run are refused before anything
runs; the clock samples are placed in each impl's timed windows."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks import ab_cudnn


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--nheads-kv", "3"], r"--nheads-kv must divide the query heads \(16 at head dim 128\), got 3"),
        (["--nheads", "32", "--nheads-kv", "0"], r"\(32 at head dim 128\), got 0"),
        (["--headdims", "64", "128", "--nheads-kv", "32"], r"\(16 at head dim 128\), got 32"),
        (["--gqa-kernel-group", "0"], r"--gqa-kernel-group must be at least 1, got 0"),
        (["--settle-ms", "-1"], r"--settle-ms must be at least 0 and --rep-ms above 0, got -1.0 and 100.0"),
        (["--rep-ms", "0"], r"--settle-ms must be at least 0 and --rep-ms above 0, got 0.0 and 0.0"),
        (["--deterministic-only", "--torch-deterministic"], r"give one of them"),
    ],
)
def test_a_kv_head_count_that_does_not_divide_the_query_heads_is_refused(argv, match, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ab_cudnn.py", *argv, "--out", "unused.json"])
    with pytest.raises(SystemExit):
        ab_cudnn.main()
    assert re.search(match, capsys.readouterr().err)


def test_clocks_per_impl_takes_the_samples_inside_each_impls_timed_windows():
    # [epoch s, MHz, W, C, slowdown mask] as clock_summary's trace; ours timed in [1, 2) and [5, 6), cuDNN in [3, 4)
    trace = [[0.5, 1980, 400, 50, 0], [1.2, 1900, 690, 60, 4], [1.8, 1700, 700, 61, 4], [3.5, 1800, 650, 60, 0],
             [4.5, 1500, 700, 62, 4], [5.1, 1600, 698, 62, 4]]  # fmt: skip
    windows = {
        ("ours", "fwdbwd"): [(1.0, 2.0), (5.0, 6.0)],
        ("cudnn", "fwdbwd"): [(3.0, 4.0)],
        ("cudnn", "fwd"): [(7, 8)],
    }
    figures = ab_cudnn._clocks_per_impl({"trace": trace}, windows)
    assert figures["ours_fwdbwd"] == {
        "median_mhz_w": [1700, 698],
        "per_round": [[1800.0, 695.0, "0x4"], [1600, 698, "0x4"]],
    }
    assert figures["cudnn_fwdbwd"] == {"median_mhz_w": [1800, 650], "per_round": [[1800, 650, "0x0"]]}
    assert figures["cudnn_fwd"] == {"median_mhz_w": None, "per_round": [None]}
    assert ab_cudnn._clocks_per_impl({"error": "nvidia-smi did not start"}, windows) == {
        "error": "nvidia-smi did not start"
    }
