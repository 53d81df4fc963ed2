"""benchmarks/ab_dkdv_configs.py's variants and arguments (the timing itself needs a GPU): the dK/dV
kernel's config in use comes first, each other candidate once, and a two-pass head dim is refused."""

from __future__ import annotations

import sys

import pytest

from benchmarks import ab_dkdv_configs as ab
from benchmarks.check_hopper_dkdv import CANDIDATES
from kernels import _flash_dkdv_hopper


@pytest.mark.parametrize("headdim", [64, 128])
def test_the_config_in_use_comes_first_then_each_other_candidate(headdim):
    variants = ab.variants(headdim)
    configs = list(variants.values())
    assert list(variants)[0] == "in_use" and configs[0] == _flash_dkdv_hopper.CONFIGS[headdim]
    assert sorted(map(str, configs)) == sorted({str(c) for c in CANDIDATES[headdim]} | {str(configs[0])})


def test_a_two_pass_head_dim_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ab_dkdv_configs.py", "--headdim", "256", "--out", "unused.json"])
    with pytest.raises(SystemExit):
        ab.main()
    assert "two passes" in capsys.readouterr().err
