"""Causal launches put the tile index on the grid's last axis (heaviest tiles of every head first,
`kernels._common.tile_grid`): a change of program order only, so results are bit-identical to the
tiles-first grid, and the kernels map program ids back to (tile, head, batch) the same way."""

import pytest
import torch

from kernels import _common, _flash_bwd, _flash_fwd, flash_attention, flash_attention_varlen
from tests.conftest import DEVICE


def test_only_causal_like_calls_within_the_axis_limit_put_tiles_last():
    assert _common.tiles_last(True, 8192)
    assert not _common.tiles_last(False, 8192)
    # CUDA caps a grid's y and z extents at 65535; more (16-row) tiles than that stay on x
    assert _common.tiles_last(True, 16 * _common.MAX_GRID_YZ)
    assert not _common.tiles_last(True, 16 * _common.MAX_GRID_YZ + 1)
    assert _common.tile_grid(5, 3, 2, last=True) == (3, 2, 5)
    assert _common.tile_grid(5, 3, 2, last=False) == (5, 3, 2)


def _run(fn, tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(torch.ones_like(out))
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("seqlen_q, seqlen_k, window", [(70, 70, None), (33, 90, None), (64, 64, (20, 0))])
def test_tiles_last_grid_gives_the_tiles_first_results_bit_for_bit(monkeypatch, seqlen_q, seqlen_k, window):
    torch.manual_seed(0)
    q = torch.randn(2, seqlen_q, 4, 16, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(2, seqlen_k, 2, 16, device=DEVICE, dtype=torch.float16) for _ in range(2))

    def call(q, k, v):
        return flash_attention(q, k, v, causal=True, window=window)

    tiles_last = _run(call, (q, k, v))
    for module in (_flash_fwd, _flash_bwd):
        monkeypatch.setattr(module, "tiles_last", lambda heavy_first, seqlen, min_tile=16: False)
    tiles_first = _run(call, (q, k, v))
    for a, b in zip(tiles_last, tiles_first, strict=True):
        assert torch.equal(a, b)


def test_varlen_tiles_last_grid_gives_the_tiles_first_results_bit_for_bit(monkeypatch):
    torch.manual_seed(1)
    cu = torch.tensor([0, 17, 60, 61, 100], device=DEVICE, dtype=torch.int32)
    q, k, v = (torch.randn(100, 3, 16, device=DEVICE, dtype=torch.float16) for _ in range(3))

    def call(q, k, v):
        return flash_attention_varlen(q, k, v, cu, cu, 43, 43, causal=True)

    tiles_last = _run(call, (q, k, v))
    for module in (_flash_fwd, _flash_bwd):
        monkeypatch.setattr(module, "tiles_last", lambda heavy_first, seqlen, min_tile=16: False)
    tiles_first = _run(call, (q, k, v))
    for a, b in zip(tiles_last, tiles_first, strict=True):
        assert torch.equal(a, b)
