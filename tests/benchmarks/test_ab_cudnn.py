"""benchmarks/ab_cudnn.py's command line (the timing itself needs a GPU): a K/V head count that does not
divide the query heads, or a GQA kernel group under 1, is refused before anything runs."""

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
    ],
)
def test_a_kv_head_count_that_does_not_divide_the_query_heads_is_refused(argv, match, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ab_cudnn.py", *argv, "--out", "unused.json"])
    with pytest.raises(SystemExit):
        ab_cudnn.main()
    assert re.search(match, capsys.readouterr().err)
