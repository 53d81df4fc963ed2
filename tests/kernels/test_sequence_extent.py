"""One sequence past the 2**31 elements the kernels address within it (32-bit row offsets) is refused
with what to do, at every entry point, before a kernel reads out of bounds (the windowed forward faulted
at 1.11M tokens x 16 heads of 128 on an H200, results/s71/call8/). The limit is lowered here so that small
tensors stand for those sizes."""

from __future__ import annotations

import pytest
import torch

import kernels._common as common
from kernels import (
    block_sparse_attention,
    flash_attention,
    flash_attention_qkvpacked,
    flash_attention_varlen,
    flash_decode,
)
from kernels.layouts import local_layout

F16 = torch.float16
LIMIT = 32 * 2 * 16  # elements: 32 rows of 2 heads of 16


@pytest.fixture
def low_limit(monkeypatch):
    monkeypatch.setattr(common, "SEQUENCE_EXTENT_LIMIT", LIMIT)


def _x(*shape, device):
    return torch.randn(*shape, dtype=F16, device=device)


def test_the_extent_counts_one_sequence_with_its_strides(low_limit, device):
    """32 rows of 2 x 16 span exactly the limit; a 33rd row, or the same rows in a packed qkv's wider row
    stride, passes it; the batch does not count (its offset is 64-bit)."""
    q = _x(4, 32, 2, 16, device=device)
    flash_attention(q, q, q)  # 4 sequences of exactly LIMIT elements each
    longer = _x(1, 33, 2, 16, device=device)
    with pytest.raises(
        ValueError, match=r"q: one sequence of 33 rows spans 1056 elements .* split it over GPUs"
    ):
        flash_attention(longer, longer, longer)
    qkv = _x(
        1, 12, 6, 16, device=device
    )  # 12 rows, row stride 96: 11 x 96 + 5 x 16 + 16 = 1152, though q alone has 12 x 2 x 16
    with pytest.raises(
        ValueError, match=r"qkv: one sequence of 12 rows spans 1152 elements \(row stride 96\)"
    ):
        flash_attention_qkvpacked(qkv)
    with pytest.raises(
        ValueError, match=r"q: one sequence of 12 rows spans"
    ):  # its views, as flash_attention takes them
        flash_attention(qkv[:, :, :2], qkv[:, :, 2:4], qkv[:, :, 4:])


def test_decode_walks_a_cache_past_the_limit_with_64_bit_tile_offsets(low_limit, device):
    """flash_decode takes such a cache in a build whose key tiles start at 64-bit offsets (the usual build
    unchanged): the same result as the usual build on it (whose offsets fit here, the limit being lowered),
    through a layout too; its few new queries are still checked."""
    from kernels.layouts import butterfly_layout

    torch.manual_seed(0)
    k, v = _x(2, 200, 2, 16, device=device), _x(2, 200, 2, 16, device=device)
    q = _x(2, 1, 4, 16, device=device)
    lens = torch.tensor([200, 77], dtype=torch.int32, device=device)
    layout = butterfly_layout(200, 16).to(device)

    def calls():
        return [
            flash_decode(q, k, v, lens, causal=True),
            flash_decode(q[:1], k[:1], v[:1], lens[:1], layout=layout),
        ]

    wide = calls()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(common, "SEQUENCE_EXTENT_LIMIT", 2**31)
        usual = calls()
    for a, b in zip(wide, usual, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="q: one sequence of 40 rows"):
        flash_decode(_x(1, 40, 2, 16, device=device), k[:1], v[:1], lens[:1])


def test_every_entry_point_refuses_a_sequence_past_the_limit(low_limit, device):
    long = _x(1, 40, 2, 16, device=device)
    with pytest.raises(ValueError, match="q: one sequence of 40 rows"):
        block_sparse_attention(long, long, long, local_layout(40, 16).to(device))
    packed = _x(50, 2, 16, device=device)  # two sequences of 10 and 40 rows: only the longest counts
    cu = torch.tensor([0, 10, 50], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="q: one sequence of 40 rows"):
        flash_attention_varlen(packed, packed, packed, cu, cu, 40, 40)
    short = torch.tensor([0, 25, 50], dtype=torch.int32, device=device)
    flash_attention_varlen(packed, packed, packed, short, short, 25, 25)  # 50 rows packed, 25 a sequence


def test_an_inference_call_through_hoppers_forward_is_not_refused(low_limit, monkeypatch, device):
    """Hopper's forward reads through TMA descriptors (64-bit) and read a 2.28e9-element sequence right
    (results/s71/call9/), so a call no gradient flows from that takes it (a long prompt's prefill) passes;
    one that needs the backward (32-bit inside a sequence) is refused up front."""
    from kernels import _flash_fwd_hopper
    from kernels.flash_attention import _check_extents

    monkeypatch.setattr(_flash_fwd_hopper, "supports", lambda *a, **kw: True)
    long = _x(1, 40, 2, 16, device=device)
    _check_extents((long, long, long), None, None, 0, None, 0.0)
    _check_extents((_x(1, 40, 6, 16, device=device),), 2, None, 0, None, 0.0)  # packed
    with pytest.raises(ValueError, match="q: one sequence of 40 rows"):
        _check_extents((long.requires_grad_(), long, long), None, None, 0, None, 0.0)
    monkeypatch.setattr(_flash_fwd_hopper, "supports", lambda *a, **kw: False)  # the portable forward
    with pytest.raises(ValueError, match="q: one sequence of 40 rows"):
        with torch.no_grad():
            _check_extents((long, long, long), None, None, 0, None, 0.0)
