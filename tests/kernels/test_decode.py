"""kernels.flash_decode (split-KV Flash-Decoding) against kernels.reference.decode_reference."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import capture_graph
from kernels import decode, flash_decode
from kernels.layouts import BlockLayout, butterfly_layout, local_layout, random_layout, strided_layout
from kernels.reference import attention_reference, decode_reference
from tests.kernels._flash_utils import assert_close_rule

F16, F32 = torch.float16, torch.float32


# (dtype, batch, seqlen_q, nheads, nheads_kv, headdim, max_len, cache lengths, causal, window, num_splits)
CASES = [
    (F32, 3, 1, 4, 4, 64, 200, [200, 1, 77], False, None, None),
    (F16, 3, 2, 8, 2, 40, 200, [200, 2, 77], True, None, 3),  # first query of b=1 sees no key
    (F32, 2, 4, 4, 1, 128, 130, [130, 99], True, (20, None), 5),
    (F16, 1, 1, 2, 2, 80, 300, [257], False, None, 1),
    (F32, 2, 3, 6, 3, 16, 64, [64, 5], False, (2, 0), 64),  # more splits than tiles: empty splits merge to 0
    # several kv heads at small head dims, causal with several queries, a window
    (F16, 1, 1, 6, 6, 64, 257, [257], False, None, 2),
    (F16, 2, 3, 8, 8, 32, 150, [150, 3], True, None, None),  # the first two queries of b=1 see 1 and 2 keys
    (F32, 2, 2, 16, 16, 16, 100, [100, 40], False, (10, 0), 3),
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{str(c[0])[6:]}-b{c[1]}-q{c[2]}-h{c[3]}/{c[4]}-d{c[5]}-s{c[10]}"
)
def test_decode_matches_reference(case, device):
    dtype, b, sq, h, hk, d, max_len, lens, causal, window, splits = case
    torch.manual_seed(max_len + d)
    q = torch.randn(b, sq, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(b, max_len, hk, d, dtype=dtype, device=device) for _ in range(2))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = dict(causal=causal, window=window, return_lse=True)
    out, lse = flash_decode(q, k, v, seqlens, num_splits=splits, **kw)
    ref64, lse64 = decode_reference(q.double(), k.double(), v.double(), seqlens, **kw)
    reflp, lselp = decode_reference(q, k, v, seqlens, **kw)
    assert out.dtype == dtype and lse.shape == (b, h, sq)
    assert_close_rule("out", out, ref64, reflp, dtype)
    assert_close_rule("lse", lse, lse64, lselp, dtype)


def test_decode_split_count_does_not_change_result(device):
    torch.manual_seed(3)
    q = torch.randn(2, 1, 4, 32, dtype=F32, device=device)
    k, v = (torch.randn(2, 256, 2, 32, dtype=F32, device=device) for _ in range(2))
    seqlens = torch.tensor([256, 100], dtype=torch.int32, device=device)
    outs = [flash_decode(q, k, v, seqlens, num_splits=s) for s in (1, 2, 7)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("empty_len", [0, -3], ids=["zero", "negative"])
def test_decode_empty_cache_gives_zero_and_neg_inf(empty_len, device):
    # the reference cannot take a zero-length cache (amax over an empty dim), so check the contract directly
    torch.manual_seed(4)
    q = torch.randn(2, 1, 2, 32, dtype=F16, device=device)
    k, v = (torch.randn(2, 64, 2, 32, dtype=F16, device=device) for _ in range(2))
    seqlens = torch.tensor([empty_len, 64], dtype=torch.int32, device=device)
    out, lse = flash_decode(q, k, v, seqlens, return_lse=True, num_splits=2)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    ref = decode_reference(q[1:].double(), k[1:].double(), v[1:].double(), seqlens[1:])
    assert (out[1:].double() - ref).abs().max() < 2e-3


def test_decode_bad_inputs(device):
    q = torch.randn(2, 1, 4, 32, dtype=F16, device=device)
    k = torch.randn(2, 64, 2, 32, dtype=F16, device=device)
    sl = torch.tensor([64, 3], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="int32"):
        flash_decode(q, k, k, sl.long())
    with pytest.raises(ValueError, match=r"shape \(batch,\)"):
        flash_decode(q, k, k, sl[:1])
    with pytest.raises(ValueError, match="batch, seqlen, nheads, headdim"):
        flash_decode(q[0], k, k, sl)
    with pytest.raises(ValueError, match="multiple of nheads_kv"):
        flash_decode(q[:, :, :3], k, k, sl)
    with pytest.raises(ValueError, match="num_splits"):
        flash_decode(q, k, k, sl, num_splits=0)
    with pytest.raises(ValueError, match="max_len"):
        flash_decode(q, k, k[:, :10], sl)
    for scale in (-1.0, 0.0):
        with pytest.raises(ValueError, match="> 0"):
            flash_decode(q, k, k, sl, softmax_scale=scale)
    with pytest.raises(ValueError, match="causal must be a bool"):
        flash_decode(q, k, k, sl, causal=1)
    with pytest.raises(ValueError, match="return_lse must be a bool"):
        flash_decode(q, k, k, sl, return_lse=1)
    with pytest.raises(ValueError, match="cache_seqlens must be a torch.Tensor"):
        flash_decode(q, k, k, [64, 3])
    with pytest.raises(ValueError, match="k_cache must be a torch.Tensor"):
        flash_decode(q, None, k, sl)


@pytest.mark.gpu
def test_gpu_decode_bf16():
    torch.manual_seed(13)
    dt = torch.bfloat16
    q = torch.randn(4, 1, 32, 128, dtype=dt, device="cuda")
    k, v = (torch.randn(4, 16384, 8, 128, dtype=dt, device="cuda") for _ in range(2))
    seqlens = torch.tensor([16384, 1, 9000, 4097], dtype=torch.int32, device="cuda")
    out, lse = flash_decode(q, k, v, seqlens, return_lse=True)
    ref64, lse64 = decode_reference(q.double(), k.double(), v.double(), seqlens, return_lse=True)
    reflp, lselp = decode_reference(q, k, v, seqlens, return_lse=True)
    assert_close_rule("out", out, ref64, reflp, dt)
    assert_close_rule("lse", lse, lse64, lselp, dt)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim, hk", [(64, 16), (128, 16), (64, 4)])
def test_gpu_dependent_launches_wait_for_their_inputs(headdim, hk, monkeypatch):
    """With programmatic dependent launches the split kernel starts while the kernel before it (here the
    copies that write its query and the caches' newest entries) ends, and the merge kernel while the split
    kernel runs: each must wait for its inputs. Call after call, eagerly and replayed from a CUDA graph, the
    result is bitwise the one of ordinary launches (DECODE_PDL off)."""
    torch.manual_seed(17)
    dt = torch.bfloat16
    batch, h, max_len = 3, 16, 8192  # (GQA launches so at d64 only)
    q = torch.empty(batch, 1, h, headdim, dtype=dt, device="cuda")
    k, v = (torch.randn(batch, max_len, hk, headdim, dtype=dt, device="cuda") for _ in range(2))
    seqlens = torch.tensor([max_len, 1, 3000], dtype=torch.int32, device="cuda")
    fresh = [torch.randn(batch, 1, h + 2 * hk, headdim, dtype=dt, device="cuda") for _ in range(8)]
    slot = torch.zeros(1, dtype=torch.long, device="cuda")

    def step(new, **kw):
        q.copy_(new[:, :, :h])
        k.index_copy_(1, slot, new[:, :, h : h + hk])
        v.index_copy_(1, slot, new[:, :, h + hk :])
        return flash_decode(q, k, v, seqlens, return_lse=True, **kw)

    def ordinary(new, **kw):
        monkeypatch.setattr(decode, "DECODE_PDL", False)
        try:
            return step(new, **kw)
        finally:
            monkeypatch.setattr(decode, "DECODE_PDL", True)

    assert decode._dependent_launches(q.device, h // hk, headdim)
    for splits in (None, 1, 2, 17, 128):
        for i, new in enumerate(fresh):
            slot.fill_(i * 1000)
            got, want = step(new, num_splits=splits), ordinary(new, num_splits=splits)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (splits, i)

    source = fresh[0].clone()  # (the warm-up calls before the capture write it into the caches)
    graph, captured = capture_graph(lambda: step(source))
    for i in range(30):
        new = fresh[i % len(fresh)]
        source.copy_(new)
        slot.fill_(i * 200)
        seqlens.copy_(torch.randint(0, max_len + 1, (batch,), dtype=torch.int32))
        graph.replay()
        want = ordinary(new)
        assert all(torch.equal(g, w) for g, w in zip(captured, want, strict=True)), i


def test_dependent_launches_only_where_the_gpu_has_them(monkeypatch):
    """griddepcontrol needs sm_90: an A100 (sm_80) launches both kernels the ordinary way (its ptxas
    refuses the instruction), as does the CPU's interpreter; GQA calls too from head dim 128 (measured
    slower with PDL there, faster at 64)."""
    monkeypatch.setattr(decode, "DECODE_PDL", True)
    cuda = torch.device("cuda", 0)
    for capability, want in (((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(decode, "compute_capability", lambda device, c=capability: c)
        for block_d in (64, 128):
            assert decode._dependent_launches(cuda, 1, block_d) is want
        assert decode._dependent_launches(cuda, 4, 64) is want  # (GQA at d64: measured faster)
        assert decode._dependent_launches(cuda, 4, 128) is False  # (GQA at d128: measured slower)
    assert decode._dependent_launches(torch.device("cpu"), 1, 64) is False
    monkeypatch.setattr(decode, "DECODE_PDL", False)
    assert decode._dependent_launches(cuda, 1, 64) is False


def test_default_split_count_follows_the_work(monkeypatch):
    """Little work (batch x kv heads x row blocks, times the head dim) gets about 4 programs per SM, 5 at
    head dim 64 (measured faster on an H200): from head dim 64 rounded down, so that no SM runs a program
    more than it holds at once while the others idle, below it rounded up; more work about 2 per SM,
    rounded up; no split shorter than MIN_SPLIT_TILES (2) key tiles, none past 128 splits."""
    sms = 132  # an H200's
    monkeypatch.setattr(decode, "sm_count", lambda device: sms)
    cpu = torch.device("cpu")
    many = decode.SPLITS_PER_SM
    assert decode._default_num_splits(1, 128, 1 << 20, 64, cpu) == 128
    assert decode._default_num_splits(16, 64, 1 << 20, 64, cpu) == 41  # GPT-2 medium, batch 1: 660 // 16
    assert (
        decode._default_num_splits(32, 64, 1 << 20, 64, cpu) == 20
    )  # 16 heads on 4 at batch 8: 640, not 544
    assert (
        decode._default_num_splits(128, 64, 1 << 20, 64, cpu) == 5
    )  # its batch 8: 640 programs (4 was slower)
    assert decode._default_num_splits(64, 128, 1 << 20, 64, cpu) == 8  # 8 kv heads at batch 8: 512, not 576
    assert decode._default_num_splits(32, 128, 1 << 20, 64, cpu) == 16  # 32 heads at batch 1: 512, not 544
    for block_d in (16, 32, 64, 128, 256):
        small = decode.SPLITS_PER_SM_SMALL_WORK_D64 if block_d == 64 else decode.SPLITS_PER_SM_SMALL_WORK
        for items in (*range(1, 300), 1000):
            splits = decode._default_num_splits(items, block_d, 1 << 20, 64, cpu)
            if items * block_d > decode.SMALL_WORK_COLUMNS:
                assert splits == max(1, -(-many * sms // items)), (block_d, items)
            elif block_d >= decode.ROUND_DOWN_HEAD_DIM:
                assert splits == min(128, small * sms // items) and items * splits <= small * sms
            else:
                assert splits == min(128, -(-small * sms // items)), (block_d, items)
    assert decode.MIN_SPLIT_TILES == 2
    assert decode._default_num_splits(1, 128, 512, 64, cpu) == 4  # 512 keys: four splits of two 64-key tiles
    assert decode._default_num_splits(16, 64, 4096, 64, cpu) == 32  # GPT-2 medium at a 4k cache: not 33
    # through a layout the longest list stands for the cache, in splits of one tile (a butterfly row at 64k: 20)
    assert decode.LAYOUT_MIN_SPLIT_TILES == 1
    assert decode._default_num_splits(16, 64, 20 * 64, 64, cpu, decode.LAYOUT_MIN_SPLIT_TILES) == 20
    monkeypatch.setattr(decode, "ROUND_DOWN_HEAD_DIM", None)  # (before session 66)
    assert decode._default_num_splits(64, 128, 1 << 20, 64, cpu) == 9
    monkeypatch.setattr(decode, "ROUND_DOWN_HEAD_DIM", 128)  # (before session 71, with 4 per SM at d64)
    monkeypatch.setattr(decode, "SPLITS_PER_SM_SMALL_WORK_D64", 4)
    assert decode._default_num_splits(32, 64, 1 << 20, 64, cpu) == 17


def _layout_decode_reference(q, k, v, seqlens, layout, dtype=None, window=None):
    """decode_reference with each sequence's one query restricted to the key blocks its layout row keeps
    (the query at position seqlens[b] - 1), and to a window if given."""
    dtype = dtype or q.dtype
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(seqlens[b])
        keep = layout.expand(n, n)[:, n - 1 : n]  # (heads or 1, 1, n)
        out, lse = attention_reference(
            q[b : b + 1].to(dtype), k[b : b + 1, :n].to(dtype), v[b : b + 1, :n].to(dtype),
            attn_mask=keep[None], return_lse=True, causal=True, window=window,
        )  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


# (dtype, batch, nheads, nheads_kv, headdim, max_len, cache lengths, layout kind, block, num_splits[, window])
LAYOUT_CASES = [
    (F32, 3, 4, 4, 64, 200, [200, 1, 77], "butterfly", 32, None),
    (F16, 2, 8, 2, 40, 256, [256, 130], "local", 64, 3),  # GQA, blocks wider than the key tile
    (F32, 2, 4, 4, 32, 150, [150, 47], "random_per_head", 16, 4),  # blocks narrower than the key tile
    (F16, 1, 6, 3, 16, 300, [300], "strided", 32, 1),
    (F16, 3, 8, 2, 64, 256, [256, 100, 1], "random_per_head", 32, None),  # a pattern per head under GQA
    (F32, 2, 6, 1, 32, 96, [96, 80], "random_per_head", 16, 2),  # MQA
    (F32, 2, 4, 2, 32, 200, [200, 90], "butterfly", 32, 3, (50, None)),  # and a window
    (F16, 2, 4, 2, 32, 200, [200, 90], "random_per_head", 32, None, (70, None)),
    # blocks of 2 x 1 tiles, a pattern per head: some heads keep no block of the query's row (out 0, lse -inf)
    (F32, 3, 4, 2, 16, 200, [200, 129, 64], "rect_per_head", 32, 3),
]


@pytest.mark.parametrize(
    "case",
    LAYOUT_CASES,
    ids=lambda c: f"{c[7]}-b{c[8]}-h{c[2]}/{c[3]}-s{c[9]}" + ("-w" if len(c) > 10 else ""),
)
def test_decode_through_a_layout_sees_only_its_rows_blocks(case, device):
    """One new query per sequence, at the cache's last position, attends only to the key blocks its row
    of the layout keeps (the layout over the cache's positions, as a block-sparse model's): against the
    dense reference given that row as a mask, whatever the split count."""
    dtype, b, h, hk, d, max_len, lens, kind, block, splits, *window = case
    window = window[0] if window else None
    torch.manual_seed(max_len + d)
    builders = {
        "butterfly": lambda: butterfly_layout(max_len, block, causal=True),
        "local": lambda: local_layout(max_len, block, 1, causal=True),
        "random_per_head": lambda: random_layout(max_len, block, 0.3, nheads=h, seed=1, causal=True),
        "strided": lambda: strided_layout(max_len, block, 3, causal=True),
        "rect_per_head": lambda: BlockLayout(
            torch.rand(h, -(-max_len // (2 * block)), -(-max_len // block)) < 0.3, 2 * block, block
        ),
    }
    layout = builders[kind]().to(device)
    q = torch.randn(b, 1, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(b, max_len, hk, d, dtype=dtype, device=device) for _ in range(2))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = flash_decode(
        q, k, v, seqlens, causal=True, window=window, layout=layout, num_splits=splits, return_lse=True
    )
    ref64, lse64 = _layout_decode_reference(q, k, v, seqlens, layout, torch.float64, window)
    reflp, lselp = _layout_decode_reference(q, k, v, seqlens, layout, window=window)
    assert_close_rule("out", out, ref64, reflp, dtype)
    assert_close_rule("lse", lse, lse64, lselp, dtype)
    dense = flash_decode(q, k, v, seqlens, causal=True, window=window, num_splits=splits)
    assert not torch.allclose(out[0], dense[0], atol=1e-2)  # the layout hides keys of the longest cache


def test_decode_through_a_layout_refuses_what_it_cannot_take(device):
    q = torch.randn(2, 1, 4, 32, dtype=F16, device=device)
    k = torch.randn(2, 128, 2, 32, dtype=F16, device=device)
    sl = torch.tensor([128, 3], dtype=torch.int32, device=device)
    layout = butterfly_layout(128, 32).to(device)
    with pytest.raises(ValueError, match="one new query per sequence"):
        flash_decode(torch.cat([q, q], 1), k, k, sl, layout=layout)
    with pytest.raises(ValueError, match="layout has 3 heads for 4 query heads"):
        flash_decode(q, k, k, sl, layout=random_layout(128, 32, 0.5, nheads=3).to(device))
    with pytest.raises(ValueError, match="covers 96x96 positions, not the cache's 128"):
        flash_decode(q, k, k, sl, layout=butterfly_layout(96, 32).to(device))
    with pytest.raises(ValueError, match="BlockLayout"):
        flash_decode(q, k, k, sl, layout=layout.mask)
    if device != "cpu":
        with pytest.raises(ValueError, match="layout is on cpu"):
            flash_decode(q, k, k, sl, layout=butterfly_layout(128, 32))


def test_a_layouts_decode_lists_hold_each_rows_kept_tiles_up_to_its_end():
    """`_decode_tiles`: per row the key tiles of its kept blocks that lie before the row's end (ascending), per
    kv head the union of its query heads' patterns, cropped to the longest row's count."""
    layout = random_layout(300, 64, 0.4, nheads=4, seed=3)  # not causal: blocks after the row's own
    tiles, counts, most = decode._decode_tiles(layout, nheads_kv=2, block_n=32)
    assert tiles.dtype == counts.dtype == torch.int32 and tiles.shape == (2, 5, most)
    assert most == int(counts.max())
    for g in range(2):
        union = layout.mask[2 * g : 2 * g + 2].any(0)  # (rows, column blocks)
        for r in range(5):
            want = [t for t in range(10) if union[r, t // 2] and t * 32 < (r + 1) * 64]
            assert counts[g, r] == len(want) and tiles[g, r, : len(want)].tolist() == want, (g, r)
    # a shared pattern: one list for every kv head; row 0 keeps blocks 0, 1, 2 and 4 but reads only its own
    shared, shared_counts, _ = decode._decode_tiles(butterfly_layout(300, 64), nheads_kv=2, block_n=64)
    assert shared.shape[0] == 1 and shared_counts[0].tolist() == [1, 2, 2, 3, 2]
    assert shared[0, 4, :2].tolist() == [0, 4]  # (4 ^ 4 = 0 and the diagonal; 4 ^ 1, 4 ^ 2 lie past the grid)
