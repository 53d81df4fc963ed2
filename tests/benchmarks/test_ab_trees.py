"""benchmarks/ab_trees.py's command line (the timing itself needs a GPU): what it refuses before any
process starts, and the shape it parses."""

from __future__ import annotations

import re

import pytest

from benchmarks import ab_trees


def test_parses_a_shape():
    assert ab_trees.parse_shape("4,4096,32,8,128,1") == (4, 4096, 32, 8, 128, 1)


@pytest.mark.parametrize(
    "argv, match",
    [
        ([], r"--trees BASE CHANGE"),
        (
            ["--trees", "{tree}", "{tree}", "--shapes", "4,4096,32,8,128"],
            r"six integers\), got '4,4096,32,8,128'",
        ),
        (["--trees", "{tree}", "{tree}", "--shapes", "4,4096,32,x,128,1"], r"six integers"),
        (["--trees", "{tree}", "{tree}", "--shapes", "4,4096,32,5,128,1"], r"kv_heads must divide heads"),
        (["--trees", "{tree}", "{tree}", "--shapes", "4,4096,32,8,128,2"], r"causal 0 or 1"),
        (["--trees", "{tree}", "{tree}", "--shapes", "0,4096,32,8,128,1"], r"must be >= 1"),
        (["--trees", "{tree}", "{missing}"], r"no kernels/ package under .*missing"),
        (["--trees", "{tree}", "{tree}", "--rounds", "0"], r"--rounds and --reps must be >= 1, got 0 and 20"),
    ],
)
def test_refuses_bad_arguments_before_timing(argv, match, tmp_path, capsys):
    """Each bad argument: one parser error naming what to pass, before any timing process runs."""
    tree = tmp_path / "tree"
    (tree / "kernels").mkdir(parents=True)
    argv = [a.format(tree=tree, missing=tmp_path / "missing") for a in argv]
    with pytest.raises(SystemExit):
        ab_trees.main(argv)
    assert re.search(match, capsys.readouterr().err)
