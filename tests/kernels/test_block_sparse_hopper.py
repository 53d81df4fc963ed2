"""Block-sparse attention on Hopper (`kernels._block_sparse_hopper`): the tile lists the Gluon kernels
walk (on any machine), which calls take those kernels, and (on an H100/H200) that out, lse and the
gradients match the float64 reference on butterfly, local, global, random per-head and empty-row
layouts, causal and not, odd lengths and GQA, with the tolerance rule of test_block_sparse.py.

The kernels' sm_90 builds with SPARSE=True are checked (for spills too) by
`benchmarks/check_hopper_builds.py`, through test_flash_fwd_hopper.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import _block_sparse_hopper as bs_hopper
from kernels import block_sparse_attention
from kernels.layouts import FULL, PARTIAL, SKIP, BlockLayout, butterfly_layout, local_layout, random_layout
from kernels.reference import block_sparse_reference
from tests.kernels._flash_utils import assert_dependent_dkdv_launches_match
from tests.kernels.test_block_sparse import _err, _inputs, _run, check_against_reference
from tests.kernels.test_flash_bwd_hopper import assert_compiled_launches_match_jit_ones, fwd_bwd_results
from tests.kernels.test_flash_fwd_hopper import needs_hopper, record_calls

BF16, F16 = torch.bfloat16, torch.float16


def _random_layout_cases():
    """(layout, seqlen_q, seqlen_k, causal) with odd lengths, per-head and shared layouts, and a query
    block and a key block that nothing sees."""
    cases = []
    for seed, (sq, sk, heads) in enumerate([(113, 113, 1), (77, 131, 4), (131, 77, 4), (64, 64, 2)]):
        layout = random_layout(max(sq, sk), 16, 0.4, nheads=heads, seed=seed)
        mask = layout.mask.clone()
        mask[:, 1] = False
        mask[:, :, 2] = False
        for causal in (False, True):
            cases.append((BlockLayout(mask, 16), sq, sk, causal))
    return cases


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("tile_n", [16, 8])
def test_row_lists_name_each_query_tiles_key_tiles_partial_first(case, tile_n):
    layout, sq, sk, causal = _random_layout_cases()[case]
    lists = layout.block_lists(sq, sk, causal, 16, 16 if tile_n == 16 else 8)
    kind = lists.tile_kind
    tiles, counts = bs_hopper.row_lists(lists)
    heads, rows, cols = kind.shape
    assert tiles.shape == (heads, rows, cols) and counts.shape == (heads, rows, 2)
    assert tiles.dtype == counts.dtype == torch.int32
    for h in range(heads):
        for r in range(rows):
            partial = [c for c in range(cols) if kind[h, r, c] == PARTIAL]
            full = [c for c in range(cols) if kind[h, r, c] == FULL]
            listed, n_masked = counts[h, r].tolist()
            if partial or full:
                assert tiles[h, r, :listed].tolist() == partial + full
                assert n_masked == max(len(partial), 1)
            else:  # one tile past the sequence: masked away entirely in the kernel
                assert (listed, n_masked, tiles[h, r, 0].item()) == (1, 1, cols)


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("group", [1, 2])
def test_col_lists_name_each_key_tiles_head_and_query_tiles_partial_first(case, group):
    layout, sq, sk, causal = _random_layout_cases()[case]
    lists = layout.block_lists(sq, sk, causal, 16, 16)
    kind = lists.tile_kind  # (H, R, C)
    tiles, counts = bs_hopper.col_lists(lists, group)
    heads, rows, cols = kind.shape
    key_heads = 1 if heads == 1 else heads // group
    assert tiles.shape == (key_heads, cols, group * rows) and counts.shape == (key_heads, cols, 2)
    for hk in range(key_heads):
        for c in range(cols):

            def pairs(want, hk=hk, c=c):
                return [(g, r) for g in range(group) for r in range(rows)
                        if kind[0 if heads == 1 else hk * group + g, r, c] == want]  # fmt: skip

            listed, n_partial = counts[hk, c].tolist()
            got = [(e >> 16, e & 0xFFFF) for e in tiles[hk, c, :listed].tolist()]
            assert got == pairs(PARTIAL) + pairs(FULL)
            assert n_partial == len(pairs(PARTIAL))
            assert listed + len(pairs(SKIP)) == group * rows


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("group", [1, 2])
def test_col_ranks_count_the_lower_key_tiles_that_list_each_item(case, group):
    """The ordered one-kernel backward adds each (query head, query tile) item's dQ in key-tile order:
    an entry's rank is how many lower key tiles of its key head list the same item."""
    layout, sq, sk, causal = _random_layout_cases()[case]
    lists = layout.block_lists(sq, sk, causal, 16, 16)
    tiles, counts = bs_hopper.col_lists(lists, group, down=True)
    ranks = bs_hopper.col_ranks(lists, group)
    up_tiles, up_counts = bs_hopper.col_lists(lists, group)
    for hk in range(tiles.shape[0]):  # the same entries, from the last item down, each one maybe partial
        for c in range(tiles.shape[1]):
            listed = up_counts[hk, c, 0].item()
            assert counts[hk, c].tolist() == [listed, listed]
            entries = tiles[hk, c, :listed].tolist()
            assert entries == sorted(up_tiles[hk, c, :listed].tolist(), reverse=True)
    assert ranks.shape == tiles.shape and ranks.dtype == torch.int32
    for hk in range(tiles.shape[0]):
        seen: dict[int, int] = {}  # item -> key tiles below that listed it
        for c in range(tiles.shape[1]):
            listed = counts[hk, c, 0].item()
            for entry, rank in zip(
                tiles[hk, c, :listed].tolist(), ranks[hk, c, :listed].tolist(), strict=True
            ):
                assert rank == seen.get(entry, 0)
                seen[entry] = seen.get(entry, 0) + 1


def test_the_one_kernel_backward_takes_block_sparse_lists_in_one_key_group():
    from kernels import _flash_bwd_fused_hopper as fused

    q = torch.randn(1, 256, 2, 128, dtype=BF16)
    lse = torch.zeros(1, 2, 256)
    lists = (torch.zeros(1, 2, 4, dtype=torch.int32),) * 3
    for kw in (dict(key_groups=2), dict(convoy=True, ordered=True), dict(walk_down=True)):
        with pytest.raises(ValueError, match="key_groups=1, convoy=False"):
            fused.flash_attn_bwd_fused_hopper(
                q, q, q, q, lse, lse, q.float(), q, q, sm_scale=0.1, causal=True, lists=lists, **kw
            )


def test_cpu_calls_and_unfit_calls_take_the_portable_kernels():
    q = torch.randn(1, 1024, 2, 128, dtype=BF16)
    layout = butterfly_layout(1024, 128)
    assert not bs_hopper.usable_forward(q, q, q, layout, 0.0)  # CPU tensors
    assert not bs_hopper.usable_backward(q, q, q, q, q, layout, 0.0, lse_grad=False)


def test_the_backward_reuses_the_forwards_choice(monkeypatch):
    """The backward is told whether its forward took the Hopper kernel (same q, k, v, layout), so it
    checks only what the forward did not see: dO, out, an lse gradient and the switches."""
    q = torch.randn(1, 1024, 2, 128, dtype=BF16)
    layout = butterfly_layout(1024, 128)
    kw = dict(lse_grad=False, forward_hopper=True)
    # (CPU tensors: only the forward's answer says Hopper here)
    assert bs_hopper.usable_backward(q, q, q, q, q, layout, 0.0, **kw)
    assert not bs_hopper.usable_backward(q, q, q, q, q, layout, 0.0, lse_grad=False, forward_hopper=False)
    assert not bs_hopper.usable_backward(q, q, q, q, q, layout, 0.0, lse_grad=True, forward_hopper=True)
    not_tma_ready = q.transpose(-1, -2)
    assert not bs_hopper.usable_backward(q, q, q, not_tma_ready, q, layout, 0.0, **kw)  # (dO)
    assert not bs_hopper.usable_backward(q, q, q, q, not_tma_ready, layout, 0.0, **kw)  # (out)
    for switch in ("ENABLED", "BACKWARD_ENABLED"):
        with monkeypatch.context() as m:
            m.setattr(bs_hopper, switch, False)
            assert not bs_hopper.usable_backward(q, q, q, q, q, layout, 0.0, **kw)


def test_the_autograd_function_hands_the_forwards_choice_to_the_backward(monkeypatch, device):
    """block_sparse_attention's backward gets the forward's answer (False on CPU) instead of asking again."""
    from kernels import block_sparse

    seen = []
    real = bs_hopper.usable_backward
    monkeypatch.setattr(bs_hopper, "usable_backward", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    q = torch.randn(1, 64, 2, 16, device=device, requires_grad=True)
    out = block_sparse_attention(q, q, q, butterfly_layout(64, 16).to(device))
    out.sum().backward()
    want = block_sparse.takes_hopper_forward(q, q, q, butterfly_layout(64, 16).to(device), 0.0)
    assert [kw["forward_hopper"] for kw in seen] == [want]


@pytest.mark.parametrize(
    "headdim, n_factors, persistent",
    [(128, 0, True), (128, 1, True), (128, 2, False), (128, None, False), (64, 0, True), (64, None, True)],
)
def test_backward_takes_the_persistent_dq_kernel_where_lists_are_short(
    monkeypatch, headdim, n_factors, persistent
):
    """PERSISTENT_DQ: d128 up to two 128-key blocks per row (4 of the dq kernel's 64-key tiles), d64 always,
    while on (the default; FLASHTRAIN_PERSISTENT_DQ=0 turns it off); off, the row-tile kernel."""
    monkeypatch.setattr(bs_hopper, "PERSISTENT_DQ_ENABLED", True)
    configs = []
    monkeypatch.setattr(
        bs_hopper.dq_hopper, "flash_attn_dq_hopper", lambda *a, config, **kw: configs.append(config)
    )
    monkeypatch.setattr(bs_hopper.dkdv_hopper, "flash_attn_dkdv_hopper", lambda *a, **kw: None)
    q = torch.randn(1, 2048, 2, headdim, dtype=BF16)
    layout = butterfly_layout(2048, 128, n_factors=n_factors)  # blocks per row: 1, 2, 3, 5
    bs_hopper.block_sparse_backward_hopper(q, q, q, q, q, torch.zeros(1, 2, 2048), layout, False, 0.1)
    (config,) = configs
    assert config.persistent == persistent
    assert config.block_n == bs_hopper.CONFIGS[headdim][1].block_n  # (the lists are built for it)
    monkeypatch.setattr(bs_hopper, "PERSISTENT_DQ_ENABLED", False)
    bs_hopper.block_sparse_backward_hopper(q, q, q, q, q, torch.zeros(1, 2, 2048), layout, False, 0.1)
    assert configs[1] == bs_hopper.CONFIGS[headdim][1]


@pytest.mark.parametrize("local_blocks, one_kernel", [(0, False), (3, False), (16, True)])
def test_d128_backward_takes_the_ordered_one_kernel_backward_on_long_lists(
    monkeypatch, local_blocks, one_kernel, device
):
    """ONE_KERNEL_BACKWARD: d128 from 30 of the dq kernel's 64-key tiles a program on average (a band of 16
    blocks each side at n2k lists all 16 blocks: 32 tiles; of 3, ~12), ordered, on the lists walked down
    with their ranks; below it the two kernels."""
    calls = []
    for module, name in (
        (bs_hopper.dq_hopper, "flash_attn_dq_hopper"),
        (bs_hopper.dkdv_hopper, "flash_attn_dkdv_hopper"),
    ):
        monkeypatch.setattr(module, name, lambda *a, name=name, **kw: calls.append(name))

    def fused(q, k, v, do, lse, delta, dq_acc, dk, dv, *, ordered, lists, first_stores, **kw):
        calls.append(("one_kernel", ordered, first_stores))  # (a band lists every query tile: first stores)
        tiles, counts, ranks = lists
        lay = layout.block_lists(2048, 2048, False, 64, 128)
        assert torch.equal(tiles, bs_hopper.col_lists(lay, 1, down=True)[0])
        assert torch.equal(ranks, bs_hopper.col_ranks(lay, 1))
        dq_acc.fill_(2.0)

    monkeypatch.setattr(bs_hopper.fused_bwd, "flash_attn_bwd_fused_hopper", fused)
    q = torch.randn(1, 2048, 2, 128, dtype=BF16, device=device)  # (the delta preprocess runs: on the device)
    layout = local_layout(2048, 128, local_blocks).to(device)
    dq, _, _ = bs_hopper.block_sparse_backward_hopper(
        q, q, q, q, q, torch.zeros(1, 2, 2048, device=device), layout, False, 0.1
    )
    if one_kernel:
        assert calls == [("one_kernel", True, True)] and (dq == 2.0).all()  # (dq: the fp32 buffer, rounded)
    else:
        assert calls == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


@pytest.mark.parametrize("empty", [None, "query_block", "per_head"])
@pytest.mark.parametrize("setting", [True, False], ids=["first_stores", "switched_off"])
def test_ordered_one_kernel_backward_stores_first_adds_where_every_query_tile_is_listed(
    monkeypatch, empty, setting, device
):
    """The ordered one-kernel backward's first adder of each item stores instead of adding (FIRST_STORES),
    so its fp32 dq buffer is not zero-filled, where every (query head, query tile) item is listed; a layout
    with a query block no key block is listed for (in every head, or in one head of a per-head layout)
    gets a zero-filled buffer and adds only. Kernel stubbed."""
    monkeypatch.setitem(bs_hopper.ONE_KERNEL_BACKWARD, 128, (True, 0.0))
    monkeypatch.setattr(bs_hopper.fused_bwd, "FIRST_STORES", setting)
    monkeypatch.setattr(bs_hopper.fused_bwd, "UNWRITTEN_FILL", float("nan"))
    seen = []

    def fused(q, k, v, do, lse, delta, dq_acc, dk, dv, *, ordered, lists, first_stores, **kw):
        seen.append((first_stores, bool(dq_acc.isnan().all()), not dq_acc.any()))

    monkeypatch.setattr(bs_hopper.fused_bwd, "flash_attn_bwd_fused_hopper", fused)
    mask = local_layout(1024, 128, 1).mask.expand(2, -1, -1).clone()
    if empty == "query_block":
        mask[:, 3] = False
    elif empty == "per_head":
        mask[1, 5] = False
    q = torch.randn(1, 1024, 2, 128, dtype=BF16, device=device)  # (the delta preprocess runs: on the device)
    bs_hopper.block_sparse_backward_hopper(
        q, q, q, q, q, torch.zeros(1, 2, 1024, device=device), BlockLayout(mask, 128).to(device), False, 0.1
    )
    stores = setting and empty is None
    assert seen == [(stores, stores, not stores)]


@pytest.mark.parametrize(
    "headdim, local_blocks, persistent",
    [(128, 0, True), (128, 1, True), (128, 2, False), (64, 0, True), (64, 7, True), (64, 10, False)],
)
def test_backward_takes_the_persistent_dkdv_kernel_where_lists_are_short(
    monkeypatch, headdim, local_blocks, persistent
):
    """PERSISTENT_DKDV: d128 up to 6 of the dq kernel's 64-key tiles a program on average (one block each
    side at n4k: 5.9 tiles; two: 9.6), d64 up to 16 of its 128-key tiles (a band of 7
    blocks each side: 13.25, of 10: 17.6). d64's persistent variant steps over 128 queries, the grid
    kernel over 64: the query-tile lists are built for the config taken."""
    calls = []
    monkeypatch.setattr(bs_hopper.dq_hopper, "flash_attn_dq_hopper", lambda *a, **kw: None)
    monkeypatch.setattr(
        bs_hopper.dkdv_hopper,
        "flash_attn_dkdv_hopper",
        lambda *a, config, lists, **kw: calls.append((config, lists)),
    )
    q = torch.randn(1, 4096, 2, headdim, dtype=BF16)
    layout = local_layout(4096, 128, local_blocks)
    bs_hopper.block_sparse_backward_hopper(q, q, q, q, q, torch.zeros(1, 2, 4096), layout, False, 0.1)
    ((config, (tiles, counts)),) = calls
    assert config.persistent == persistent
    expected = bs_hopper.PERSISTENT_DKDV if persistent else {d: (c[2],) for d, c in bs_hopper.CONFIGS.items()}
    assert config == expected[headdim][0]
    # one list per 128 keys (the program's), each entry a query tile of config.block_m rows: every kept
    # 128-block of the layout listed as 128 // block_m tiles
    assert tiles.shape[1] == 4096 // 128 and tiles.shape[2] == 4096 // config.block_m
    assert int(counts[..., 0].sum()) == int(layout.mask.sum()) * (128 // config.block_m)


@pytest.mark.parametrize(
    "headdim, seqlen, local_blocks, persistent",
    [
        (128, 4096, 0, True),
        (128, 4096, 4, True),
        (128, 4096, 6, False),
        (128, 4096, 31, False),
        (64, 4096, 0, True),
        (64, 4096, 7, True),
        (64, 4096, 10, False),
    ],
)
def test_forward_takes_the_persistent_kernel_where_lists_are_short(
    monkeypatch, headdim, seqlen, local_blocks, persistent
):
    """PERSISTENT_FORWARD: up to 20 of its 64-key tiles a program on average at d128 (over 32 block rows
    a band of 4 blocks each side lists 16.75 of them, one of 6 23.4), up to 16 of its 128-key tiles at d64
    (a band of 7 blocks each side 13.25 of them, one of 10 17.6)."""
    calls = []
    monkeypatch.setattr(
        bs_hopper.fwd_hopper,
        "flash_attn_forward_hopper",
        lambda *a, config, lists, **kw: calls.append((config, lists)),
    )
    q = torch.randn(1, seqlen, 2, headdim, dtype=BF16)
    bs_hopper.block_sparse_forward_hopper(q, q, q, local_layout(seqlen, 128, local_blocks), False, 0.1)
    ((config, (tiles, counts)),) = calls
    assert config.persistent == persistent
    assert tiles.shape[-1] == seqlen // config.block_n  # the lists are built for its key tiles
    # (d128: the persistent variant's 64-key tiles, the row-tile kernel's 128-key ones)
    expected = bs_hopper.PERSISTENT_FORWARD[headdim][0] if persistent else bs_hopper.CONFIGS[headdim][0]
    assert config == expected


# ----------------------------------------------------------------------------------------------------
# on an H100/H200
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def hopper_calls(monkeypatch) -> list:
    """Records each call of the Hopper block-sparse forward and backward."""
    return record_calls(
        monkeypatch,
        (bs_hopper, "block_sparse_forward_hopper"),
        (bs_hopper, "block_sparse_backward_hopper"),
    )


def _gpu_layout(kind: str, seqlen: int, causal: bool, nheads: int) -> BlockLayout:
    if kind == "butterfly":
        return butterfly_layout(seqlen, 128, causal=causal)
    if kind == "butterfly_global_local":
        return butterfly_layout(seqlen, 128, n_factors=2, global_blocks=1, local_blocks=1, causal=causal)
    if kind == "local":
        return local_layout(seqlen, 256, local_blocks=1)  # 256-blocks: two 128-row programs per block
    if kind == "random_per_head":
        return random_layout(seqlen, 128, 0.3, nheads=nheads, seed=3)
    mask = butterfly_layout(seqlen, 128).mask.clone()  # "empty": a query block and a key block unseen
    mask[:, 1] = False
    mask[:, :, 3] = False
    return BlockLayout(mask, 128)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kind", ["butterfly", "butterfly_global_local", "local", "random_per_head", "empty"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k", [(1000, 1000), (2048 + 77, 2048 + 77), (700, 1500), (1500, 700)]
)
@pytest.mark.parametrize("headdim", sorted(bs_hopper.CONFIGS))
def test_gpu_hopper_path_matches_reference(kind, causal, dtype, seqlen_q, seqlen_k, headdim, hopper_calls):
    torch.manual_seed(seqlen_q + seqlen_k)
    nheads, nheads_kv = 4, 2
    q, k, v = _inputs(2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, "cuda")
    layout = _gpu_layout(kind, max(seqlen_q, seqlen_k), causal, nheads).cuda()
    out, lse, *_ = check_against_reference(q, k, v, layout, causal)
    assert hopper_calls == ["block_sparse_forward_hopper", "block_sparse_backward_hopper"]
    if kind == "empty":  # query block 1 sees no key: out 0, lse -inf
        assert (out[:, 128:256] == 0).all() and (lse[:, :, 128:256] == float("-inf")).all()


@pytest.mark.gpu
@needs_hopper
def test_gpu_compiled_launches_give_the_jit_launches_results(monkeypatch, hopper_calls):
    """kernels/_launch.py's compiled launches walk the same lists as the JIT ones (bit-identical)."""
    torch.manual_seed(5)
    q, k, v = _inputs(1, 2048 + 77, 2048 + 77, 4, 2, 128, BF16, "cuda")
    do = torch.randn_like(q)
    layout = _gpu_layout("butterfly_global_local", 2048 + 77, True, 4).cuda()
    fn = lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True, return_lse=True)  # noqa: E731
    assert_compiled_launches_match_jit_ones(monkeypatch, fn, (q, k, v), do)
    assert hopper_calls[-2:] == ["block_sparse_forward_hopper", "block_sparse_backward_hopper"]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("programs", [None, 3])
@pytest.mark.parametrize("table", ["PERSISTENT_FORWARD", "PERSISTENT_DQ", "PERSISTENT_DKDV"])
@pytest.mark.parametrize("headdim", sorted(bs_hopper.CONFIGS))
def test_gpu_persistent_and_row_tile_kernels_give_the_same_results(
    monkeypatch, headdim, table, programs, hopper_calls
):
    """The forward's, dq or dK/dV kernel's persistent variant, forced off then on: bitwise the same where
    both walk the same tiles; where they do not (d128's forward: the row-tile kernel's 128-key tiles,
    the persistent variant's 64-key ones), each within the tolerance rule of the float64 reference.
    programs: a grid of one program per SM (None), or of 3 (each walks many items: both buffer sets and
    the stage ring carried from item to item)."""
    if programs is not None:
        for module in (bs_hopper.fwd_hopper, bs_hopper.dq_hopper, bs_hopper.dkdv_hopper):
            monkeypatch.setattr(module, "sm_count", lambda device: programs)
    torch.manual_seed(headdim)
    q, k, v = _inputs(2, 2048 + 77, 2048 + 77, 4, 2, headdim, BF16, "cuda")
    do = torch.randn_like(q)
    layout = _gpu_layout("butterfly_global_local", 2048 + 77, True, 4).cuda()
    fn = lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True, return_lse=True)  # noqa: E731
    persistent_cfg, _ = getattr(bs_hopper, table)[headdim]
    row_tile_cfg = bs_hopper.CONFIGS[headdim][
        ("PERSISTENT_FORWARD", "PERSISTENT_DQ", "PERSISTENT_DKDV").index(table)
    ]
    same_tiles = (persistent_cfg.block_m, persistent_cfg.block_n) == (
        row_tile_cfg.block_m,
        row_tile_cfg.block_n,
    )
    monkeypatch.setattr(bs_hopper, "PERSISTENT_DQ_ENABLED", True)
    results = []
    for up_to in (-1, math.inf):  # never, then always
        monkeypatch.setitem(getattr(bs_hopper, table), headdim, (persistent_cfg, up_to))
        if same_tiles:
            results.append(fwd_bwd_results(fn, (q, k, v), do))
        else:
            check_against_reference(q, k, v, layout, causal=True)
    if same_tiles:
        for name, row_tile, persistent in zip(("out", "lse", "dq", "dk", "dv"), *results, strict=True):
            assert torch.equal(row_tile, persistent), name
    assert hopper_calls == ["block_sparse_forward_hopper", "block_sparse_backward_hopper"] * 2


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "grid"])
@pytest.mark.parametrize("headdim", sorted(bs_hopper.CONFIGS))
def test_gpu_dependent_dkdv_launch_gives_the_ordinary_launchs_results(
    monkeypatch, headdim, persistent, hopper_calls
):
    """The two-kernel backward's dK/dV kernel launched dependent on the dq kernel
    (`_flash_dkdv_hopper.DEPENDENT_AFTER_DQ`): bitwise the ordinary launch's results, eagerly and from a
    CUDA graph, with both kernels' persistent variants or both grid kernels; the persistent dq kernel on
    3 programs, so that the dK/dV programs start beside it (and would read delta before it is written
    without their wait)."""
    monkeypatch.setitem(bs_hopper.ONE_KERNEL_BACKWARD, 128, None)  # (the two kernels at any list length)
    monkeypatch.setattr(bs_hopper, "PERSISTENT_DQ_ENABLED", True)
    for table in (bs_hopper.PERSISTENT_DQ, bs_hopper.PERSISTENT_DKDV):
        monkeypatch.setitem(table, headdim, (table[headdim][0], math.inf if persistent else -1))
    torch.manual_seed(headdim + persistent)
    q, k, v = _inputs(2, 2048 + 77, 2048 + 77, 4, 2, headdim, BF16, "cuda")
    do = torch.randn_like(q)
    layout = _gpu_layout("butterfly_global_local", 2048 + 77, True, 4).cuda()
    fn = lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True, return_lse=True)  # noqa: E731
    assert_dependent_dkdv_launches_match(monkeypatch, fn, (q, k, v), do)
    assert hopper_calls[:2] == ["block_sparse_forward_hopper", "block_sparse_backward_hopper"]


@pytest.mark.gpu
@needs_hopper
def test_gpu_dropped_tiles_are_never_read(hopper_calls):
    # NaN in the rows only dropped tiles touch: a kernel that read them would spread it (0 * NaN)
    torch.manual_seed(4)
    mask = local_layout(1024, 128, local_blocks=0).mask.clone()  # block diagonal
    mask[0, 3, 3] = False
    layout = BlockLayout(mask, 128).cuda()
    q, k, v = _inputs(1, 1024, 1024, 2, 2, 128, BF16, "cuda")
    clean = [x.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x[:, 384:512] = float("nan")
    do = torch.randn_like(q)
    got = _run(lambda q, k, v: block_sparse_attention(q, k, v, layout, return_lse=True), q, k, v, do)
    ref = _run(lambda q, k, v: block_sparse_reference(q, k, v, mask.cuda(), 128, 128, return_lse=True),
               *(x.double() for x in clean), do.double())  # fmt: skip
    assert hopper_calls == ["block_sparse_forward_hopper", "block_sparse_backward_hopper"]
    rows = torch.cat([torch.arange(0, 384), torch.arange(512, 1024)])
    for g, t in zip(got, ref, strict=True):
        sel, want = (g[:, :, rows], t[:, :, rows]) if g.dim() == 3 else (g[:, rows], t[:, rows])
        assert torch.isfinite(sel).all()
        assert _err(sel, want) < 0.05


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "headdim, block, dropout_p, lse_grad, takes",
    [
        (128, 128, 0.0, True, ["block_sparse_forward_hopper"]),  # lse's gradient: the portable backward
        (32, 128, 0.0, False, []),  # a head dim without Hopper configs
        (128, 64, 0.0, False, []),  # 64-blocks: a 128-row program would straddle two layout rows
        (128, 128, 0.1, False, []),  # dropout: the portable kernels
    ],
)
def test_gpu_other_calls_take_the_portable_kernels(headdim, block, dropout_p, lse_grad, takes, hopper_calls):
    torch.manual_seed(9)
    q, k, v = _inputs(1, 1024 + 33, 1024 + 33, 4, 2, headdim, BF16, "cuda")
    layout = butterfly_layout(1024 + 33, block, causal=True).cuda()
    check_against_reference(q, k, v, layout, True, dropout_p=dropout_p, lse_grad=lse_grad)
    assert hopper_calls == takes


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("headdim, local_blocks", [(128, 0), (64, 0), (64, 1), (64, 8)])
def test_gpu_backward_takes_the_hopper_kernels_at_any_list_length(headdim, local_blocks, monkeypatch):
    # a block diagonal lists 1 tile of 128 keys per 128-row program, a band of 1 block each side ~3,
    # of 8 blocks ~15 (d64 kept lists under 2 such tiles portable before the persistent dq kernel)
    calls = record_calls(monkeypatch, (bs_hopper, "block_sparse_backward_hopper"))
    q, k, v = (
        torch.randn(1, 4096, 2, headdim, device="cuda", dtype=BF16, requires_grad=True) for _ in range(3)
    )
    block_sparse_attention(
        q, k, v, local_layout(4096, 128, local_blocks=local_blocks).cuda()
    ).sum().backward()
    assert calls == ["block_sparse_backward_hopper"]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
@pytest.mark.parametrize("kind", ["butterfly", "butterfly_global_local", "local", "random_per_head", "empty"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k", [(1000, 1000), (2048 + 77, 2048 + 77), (700, 1500), (1500, 700)]
)
def test_gpu_one_kernel_backward_matches_reference(
    ordered, kind, causal, dtype, seqlen_q, seqlen_k, monkeypatch
):  # fmt: skip
    """The one-kernel backward over the dK/dV kernel's lists (`ONE_KERNEL_BACKWARD`), its dQ adds in
    key-tile order or as they land: the tolerance rule of the float64 reference, GQA, odd lengths. Ordered,
    each item's first adder stores where every item is listed, into a buffer left NaN."""
    calls = record_calls(monkeypatch, (bs_hopper, "_one_kernel_backward"))
    monkeypatch.setitem(bs_hopper.ONE_KERNEL_BACKWARD, 128, (ordered, 0.0))
    monkeypatch.setattr(bs_hopper.fused_bwd, "UNWRITTEN_FILL", float("nan"))
    torch.manual_seed(seqlen_q + seqlen_k)
    q, k, v = _inputs(2, seqlen_q, seqlen_k, 4, 2, 128, dtype, "cuda")
    layout = _gpu_layout(kind, max(seqlen_q, seqlen_k), causal, 4).cuda()
    check_against_reference(q, k, v, layout, causal)
    assert calls == ["_one_kernel_backward"]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ordered_one_kernel_backward_repeats_bit_for_bit(causal, monkeypatch):
    """Ordered, each dq tile's adds come in key-tile order whatever the programs' pace: five runs give
    the same bits (GQA, a per-head layout and butterfly's many adders a tile), each item's first adder
    storing into a buffer left NaN; and the same values as adds into a zero-filled buffer."""
    monkeypatch.setitem(bs_hopper.ONE_KERNEL_BACKWARD, 128, (True, 0.0))
    monkeypatch.setattr(bs_hopper.fused_bwd, "UNWRITTEN_FILL", float("nan"))
    torch.manual_seed(11)
    q, k, v = _inputs(1, 8192, 8192, 8, 4, 128, BF16, "cuda")
    do = torch.randn_like(q)
    for kind in ("butterfly", "random_per_head"):
        layout = _gpu_layout(kind, 8192, causal, 8).cuda()

        def fn(q, k, v, layout=layout):
            return block_sparse_attention(q, k, v, layout, causal=causal, return_lse=True)

        first = fwd_bwd_results(fn, (q, k, v), do)
        for run in range(5):
            monkeypatch.setattr(bs_hopper.fused_bwd, "FIRST_STORES", run < 4)
            again = fwd_bwd_results(fn, (q, k, v), do)
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), first, again, strict=True):
                assert torch.equal(a, b), (kind, name, run)
