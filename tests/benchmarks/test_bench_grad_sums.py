"""benchmarks/bench_grad_sums.py's command line (the timing itself needs a GPU): what it refuses before
timing, with one parser error each."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks import bench_grad_sums


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--out", "x.json", "--block-rows", "24"], r"powers of two .* got \[24\]"),
        (["--out", "x.json", "--block-rows", "0"], r"powers of two"),
        (["--out", "x.json", "--reps", "0"], r"--reps at least 1"),
        (["--block-rows", "32"], r"--out"),
    ],
)
def test_refuses_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit):
        bench_grad_sums.main(argv)
    assert re.search(match, capsys.readouterr().err)


def test_refuses_a_machine_without_cuda(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench_grad_sums.main(["--out", str(tmp_path / "x.json")])
    assert "run it on a GPU machine" in capsys.readouterr().err
