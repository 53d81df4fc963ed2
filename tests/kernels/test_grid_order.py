"""The attention kernels' program order (`kernels._common.tile_program_ids`): causal-like calls take
the tiles heaviest first across chunks of heads instead of one head after another. A change of order
only: every (tile, head, batch) is visited once, and results are bit-identical to the plain grid order."""

import pytest
import torch
import triton
import triton.language as tl

from kernels import _common, _flash_bwd, _flash_fwd, flash_attention, flash_attention_varlen
from tests.conftest import DEVICE


@triton.jit
def _record_order(out_ptr, sched_slots):
    tile, n_tiles, head, batch = _common.tile_program_ids(sched_slots)
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    tl.store(out_ptr + pid, tile + n_tiles * (head + tl.num_programs(1) * batch))


def _order(n_tiles, nheads, batch, slots):
    """The (tile, head, batch) each program takes, listed in program (launch) order."""
    out = torch.empty(n_tiles * nheads * batch, dtype=torch.int32, device=DEVICE)
    _record_order[(n_tiles, nheads, batch)](out, slots)
    return [(i % n_tiles, i // n_tiles % nheads, i // (n_tiles * nheads)) for i in out.tolist()]


def test_plain_grid_order_without_slots():
    assert _order(3, 2, 2, 0) == [(t, h, b) for b in range(2) for h in range(2) for t in range(3)]


def test_heads_go_in_chunks_taken_tile_major():
    # 8 slots: chunks of min(cdiv(4 * 8, 5 tiles), 8 // 4) = 2 heads; the last chunk holds one
    expected = [(t, h, 0) for t in range(5) for h in (0, 1)] + [(t, 2, 0) for t in range(5)]
    assert _order(5, 3, 1, 8) == expected


@pytest.mark.parametrize("shape", [(7, 3, 2), (1, 5, 3), (4, 1, 1), (33, 16, 2)])
@pytest.mark.parametrize("slots", [0, 4, 8, 264])
def test_every_tile_of_every_head_runs_once(shape, slots):
    n_tiles, nheads, batch = shape
    order = _order(n_tiles, nheads, batch, slots)
    assert sorted(order) == sorted(
        (t, h, b) for t in range(n_tiles) for h in range(nheads) for b in range(batch)
    )


def test_slots_only_for_calls_whose_tiles_differ_in_work():
    assert _common.sched_slots_for(torch.device("cpu"), heavy_first=False) == 0
    assert _common.sched_slots_for(torch.device("cpu"), heavy_first=True) > 0


def _run(fn, tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(torch.ones_like(out))
    return [out.detach()] + [t.grad for t in leaves]


def _dense_call(seqlen_q, seqlen_k, window):
    q = torch.randn(2, seqlen_q, 4, 16, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(2, seqlen_k, 2, 16, device=DEVICE, dtype=torch.float16) for _ in range(2))
    return (lambda q, k, v: flash_attention(q, k, v, causal=True, window=window)), (q, k, v)


def _varlen_call():
    cu = torch.tensor([0, 17, 60, 61, 100], device=DEVICE, dtype=torch.int32)
    q, k, v = (torch.randn(100, 3, 16, device=DEVICE, dtype=torch.float16) for _ in range(3))
    return (lambda q, k, v: flash_attention_varlen(q, k, v, cu, cu, 43, 43, causal=True)), (q, k, v)


@pytest.mark.parametrize(
    "make_call",
    [
        lambda: _dense_call(70, 70, None),
        lambda: _dense_call(33, 90, None),
        lambda: _dense_call(64, 64, (20, 0)),
        _varlen_call,
    ],
    ids=["square", "bottom_right", "window", "varlen"],
)
def test_chunked_order_gives_the_plain_order_results_bit_for_bit(monkeypatch, make_call):
    torch.manual_seed(0)
    call, tensors = make_call()
    chunked = _run(call, tensors)
    for module in (_flash_fwd, _flash_bwd):
        monkeypatch.setattr(module, "sched_slots_for", lambda device, heavy_first: 0)
    plain = _run(call, tensors)
    for a, b in zip(chunked, plain, strict=True):
        assert torch.equal(a, b)
