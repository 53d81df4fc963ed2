"""Block layouts and their compressed tile lists (kernels/layouts.py): pure torch, no kernels."""

import dataclasses
import math

import pytest
import torch

from kernels.layouts import (
    FULL,
    PARTIAL,
    SKIP,
    BlockLayout,
    BlockLists,
    butterfly_layout,
    local_layout,
    make_layout,
    random_layout,
    strided_layout,
)
from kernels.reference import attention_mask


def _butterfly_brute(n, n_factors, global_blocks, local_blocks, causal):
    levels = max(1, (n - 1).bit_length())
    n_factors = levels if n_factors is None else n_factors
    powers = {1 << k for k in range(n_factors)}
    keep = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            kept = i == j or (i ^ j) in powers or i < global_blocks or j < global_blocks
            kept = kept or abs(i - j) <= local_blocks
            keep[i, j] = kept and (j <= i or not causal)
    return keep


@pytest.mark.parametrize("seqlen", [16 * 8, 16 * 13, 16 * 13 - 5, 16 * 32])
@pytest.mark.parametrize("n_factors", [None, 0, 2])
@pytest.mark.parametrize("global_blocks,local_blocks", [(0, 0), (2, 0), (0, 1), (1, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_butterfly_definition(seqlen, n_factors, global_blocks, local_blocks, causal):
    layout = butterfly_layout(seqlen, 16, n_factors, global_blocks, local_blocks, causal)
    n = math.ceil(seqlen / 16)
    assert layout.shape == (1, n, n) and layout.block_m == layout.block_n == 16
    assert torch.equal(layout.mask[0], _butterfly_brute(n, n_factors, global_blocks, local_blocks, causal))


def test_butterfly_density_matches_paper_counts():
    # all factors over B = 2^L blocks keep 1 + L tiles per row: 16k tokens / 128 -> 8/128, 64k -> 10/512
    assert butterfly_layout(16384, 128).density == pytest.approx(8 / 128)
    assert butterfly_layout(65536, 128).density == pytest.approx(10 / 512)
    # B = 13 is padded to 16 (4 factors) and cropped: row 12's partners 13 and 14 fall off, 8 and 4 stay
    layout = butterfly_layout(13 * 32, 32)
    assert layout.mask[0, 12].nonzero().flatten().tolist() == [4, 8, 12]
    assert layout.density == pytest.approx(layout.mask.float().mean().item())


def test_local_and_strided_layouts():
    n = 11
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert torch.equal(local_layout(n * 32, 32, 2).mask[0], (i - j).abs() <= 2)
    assert torch.equal(local_layout(n * 32, 32, 2, causal=True).mask[0], ((i - j) >= 0) & ((i - j) <= 2))
    strided = strided_layout(n * 32, 32, stride=3, local_blocks=1).mask[0]
    assert torch.equal(strided, ((i - j) % 3 == 0) | ((i - j).abs() <= 1))


def test_random_layout_per_head_and_reproducible():
    a = random_layout(40 * 16, 16, 0.25, nheads=3, seed=7)
    b = random_layout(40 * 16, 16, 0.25, nheads=3, seed=7)
    assert a.shape == (3, 40, 40) and torch.equal(a.mask, b.mask)
    assert not torch.equal(a.mask[0], a.mask[1])
    assert a.mask[:, torch.arange(40), torch.arange(40)].all()  # keep_diagonal
    off_diag = ~torch.eye(40, dtype=torch.bool)
    assert abs(a.mask[:, off_diag].float().mean().item() - 0.25) < 0.05
    c = random_layout(40 * 16, 16, 0.25, nheads=2, seed=7, causal=True, keep_diagonal=False)
    assert not c.mask.triu(1).any()


def _brute_kinds(layout, seqlen_q, seqlen_k, causal, tile_m, tile_n):
    """SKIP/PARTIAL/FULL per kernel tile from the element mask, by definition."""
    elem = layout.expand(seqlen_q, seqlen_k) & attention_mask(seqlen_q, seqlen_k, causal=causal)
    rows, cols = math.ceil(seqlen_q / tile_m), math.ceil(seqlen_k / tile_n)
    kinds = torch.zeros(layout.nheads, rows, cols, dtype=torch.int8)
    for r in range(rows):
        for c in range(cols):
            tile = elem[:, r * tile_m : (r + 1) * tile_m, c * tile_n : (c + 1) * tile_n]
            inside = (r + 1) * tile_m <= seqlen_q and (c + 1) * tile_n <= seqlen_k
            for h in range(layout.nheads):
                if tile[h].all() and inside:
                    kinds[h, r, c] = FULL
                elif tile[h].any():
                    kinds[h, r, c] = PARTIAL
    return kinds


def _from_lists(idx, cnt, shape):
    dense = torch.zeros(shape, dtype=torch.bool)
    for h in range(shape[0]):
        for r in range(shape[1]):
            sel = idx[h, r, : cnt[h, r]].long()
            assert torch.equal(sel, sel.sort().values), "lists must be ascending"
            dense[h, r, sel] = True
    return dense


@pytest.mark.parametrize(
    "seqlen_q,seqlen_k,causal,tiles",
    [(100, 100, False, None), (100, 100, True, None), (70, 130, True, None), (130, 70, True, None),
     (128, 96, True, (16, 32)), (97, 97, True, (16, 16))],
)  # fmt: skip
def test_block_lists_match_element_mask(seqlen_q, seqlen_k, causal, tiles):
    layout = random_layout(max(seqlen_q, seqlen_k), 32, 0.4, nheads=2, seed=3)
    tile_m, tile_n = tiles or (32, 32)
    lists = layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, tile_n)
    kinds = _brute_kinds(layout, seqlen_q, seqlen_k, causal, tile_m, tile_n)
    assert torch.equal(lists.tile_kind, kinds)
    assert (kinds == SKIP).any() and (kinds != SKIP).any()  # a case that can tell lists apart
    shape, shape_t = kinds.shape, (kinds.shape[0], kinds.shape[2], kinds.shape[1])
    assert torch.equal(_from_lists(lists.row_full_idx, lists.row_full_cnt, shape), kinds == FULL)
    assert torch.equal(_from_lists(lists.row_part_idx, lists.row_part_cnt, shape), kinds == PARTIAL)
    assert torch.equal(
        _from_lists(lists.col_full_idx, lists.col_full_cnt, shape_t), (kinds == FULL).transpose(1, 2)
    )
    assert torch.equal(
        _from_lists(lists.col_part_idx, lists.col_part_cnt, shape_t), (kinds == PARTIAL).transpose(1, 2)
    )
    assert layout.block_lists(seqlen_q, seqlen_k, causal, tile_m, tile_n) is lists  # cached


@pytest.mark.parametrize("causal", [False, True])
def test_lists_shared_across_lengths_are_those_each_length_builds(causal):
    """block_lists caches by `lists_key`: without causality one build serves every pair of lengths inside
    the same last tiles (a decode step's query against a cache growing by a key a step); each served
    list equals what those exact lengths build."""
    layout = random_layout(100, 32, 0.4, nheads=2, seed=3)
    fields = [f.name for f in dataclasses.fields(BlockLists)]
    for seqlen_q, seqlen_k in [
        (1, 1),
        (1, 15),
        (1, 16),
        (1, 17),
        (1, 40),
        (3, 47),
        (16, 48),
        (17, 49),
        (40, 100),
    ]:
        served = layout.block_lists(seqlen_q, seqlen_k, causal, 16, 16)
        built = layout._build_lists(seqlen_q, seqlen_k, causal, 16, 16)
        for name in fields:
            a, b = getattr(served, name), getattr(built, name)
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, (seqlen_q, seqlen_k, name)
    # without causality (1, 1) and (1, 15) share a build, as do (1, 40) and (3, 47): 7 builds for 9 calls
    assert len(layout._lists) == (9 if causal else 7)


def test_layout_is_immutable_copy():
    mask = torch.ones(1, 4, 4, dtype=torch.bool)
    layout = BlockLayout(mask, 16)
    mask[0, 0, 0] = False
    assert layout.mask.all()
    assert layout.to("cpu").shape == (1, 4, 4)


def test_make_layout_kinds():
    assert torch.equal(make_layout("butterfly", 512, 32, n_factors=2).mask, butterfly_layout(512, 32, 2).mask)
    assert torch.equal(make_layout("local", 512, 32, local_blocks=1, causal=True).mask,
                       local_layout(512, 32, 1, causal=True).mask)  # fmt: skip
    assert torch.equal(make_layout("strided", 512, 32, stride=4).mask, strided_layout(512, 32, 4).mask)
    assert make_layout("random", 512, 32, nheads=4, density=0.1).shape == (4, 16, 16)


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: BlockLayout(torch.ones(2, 2), 16), "torch.bool"),
        (lambda: BlockLayout(torch.ones(2, 2, 2, 2, dtype=torch.bool), 16), "n_row_blocks"),
        (lambda: BlockLayout(torch.ones(2, 2, dtype=torch.bool), 24), "powers of two"),
        (lambda: BlockLayout(torch.ones(2, 2, dtype=torch.bool), 8), "powers of two"),
        (lambda: butterfly_layout(512, 48), "power of two"),
        (lambda: butterfly_layout(512, 32, n_factors=5), r"n_factors must be an int in \[0, 4\]"),
        (lambda: butterfly_layout(0, 32), "seqlen"),
        (lambda: local_layout(512, 32, local_blocks=-1), "local_blocks"),
        (lambda: strided_layout(512, 32, stride=0), "stride"),
        (lambda: random_layout(512, 32, density=1.5), "density"),
        (lambda: random_layout(512, 32, density="0.5"), r"density must be in \[0, 1\], got .0.5."),
        (lambda: random_layout(512, 32, density=0.5, seed=1.5), "seed must be an int"),
        (lambda: random_layout(512, 32, density=0.5, keep_diagonal=None), "keep_diagonal must be a bool"),
        (lambda: random_layout(512, 32, density=0.5, causal="yes"), "causal must be a bool"),
        # a truthy string would otherwise pass for True and drop every tile above the diagonal
        (lambda: butterfly_layout(512, 32, causal="no"), "causal must be a bool"),
        (lambda: local_layout(512, 32, local_blocks=True), "local_blocks"),
        (lambda: make_layout("dilated", 512, 32), "unknown block layout kind"),
        (lambda: make_layout("butterfly", 512, 32, window=3), "bad parameters"),
        (lambda: butterfly_layout(512, 32).block_lists(513, 512), "covers 512x512"),
        (lambda: butterfly_layout(512, 32).block_lists(512, 512, tile_m=64), "does not divide"),
    ],
)
def test_bad_layout_inputs(build, match):
    with pytest.raises(ValueError, match=match):
        build()
