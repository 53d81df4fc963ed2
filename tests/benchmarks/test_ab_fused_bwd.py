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


def test_packed_backward_stores_one_gradient_equal_to_the_separate_ones():
    """`exp_fused_bwd._backward(packed=True)` (ab_fused_bwd.py --packed) gives the same gradients as the
    separate tensors, stored into views of one packed gradient (portable kernels on CPU, fp32, GQA)."""
    import torch

    from benchmarks.exp_fused_bwd import _backward
    from kernels import _flash_fwd
    from kernels.reference import split_qkv

    from ..conftest import DEVICE

    torch.manual_seed(0)
    qkv = torch.randn(1, 40, 4 + 2 * 2, 16, device=DEVICE)
    q, k, v = split_qkv(qkv, 2)
    out, lse2 = _flash_fwd.flash_attn_forward(
        q, k, v, sm_scale=16**-0.5, win_left=None, win_right=0, key_padding_mask=None, dropout_p=0.0, seed=0
    )
    do = torch.randn(q.shape, device=DEVICE)
    separate = _backward(*(t.contiguous() for t in (q, k, v)), do, out, lse2, True, False)
    packed = _backward(q, k, v, do, out, lse2, True, False, packed=True)
    base = packed[0].untyped_storage().data_ptr()
    assert all(g.untyped_storage().data_ptr() == base for g in packed)
    for got, want in zip(packed, separate, strict=True):
        torch.testing.assert_close(got, want)
