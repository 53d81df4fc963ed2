"""benchmarks/ab_fused_bwd.py's arguments: what it refuses, before it touches a GPU or the kernels'
settings (the timing itself needs an sm_90 GPU and runs on the device machine)."""

from __future__ import annotations

import sys

import pytest

from benchmarks import ab_fused_bwd
from kernels import _flash_bwd_fused_hopper


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--headdim", "64"], "takes no head dim 64 by default: give --fused-configs"),
        (["--headdim", "64", "--fused-configs", "64"], "takes BLOCK_M:STAGES, got '64'"),
        (["--headdim", "64", "--fused-configs", "64:x"], "takes BLOCK_M:STAGES"),
        (["--headdim", "64", "--fused-configs", "64:2", "64:3"], "give --ordered"),
        (["--nheads", "3", "--group", "2"], "positive multiple of --group"),
        (["--convoy-key-groups", "2"], "give --ordered --causal"),
    ],
)
def test_bad_arguments_stop_with_what_to_change_and_leave_the_configs(monkeypatch, capsys, argv, message):
    configs = dict(_flash_bwd_fused_hopper.CONFIGS)
    monkeypatch.setattr(sys, "argv", ["ab_fused_bwd.py", "--out", "unused.json", *argv])
    with pytest.raises(SystemExit) as stop:
        ab_fused_bwd.main()
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert _flash_bwd_fused_hopper.CONFIGS == configs
