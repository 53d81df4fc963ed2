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
        (
            ["--also-convoy-key-groups", "2", "0"],
            r"--also-convoy-key-groups takes counts of at least 1, got \[2, 0\]",
        ),
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
