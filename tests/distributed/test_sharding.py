import pytest
import torch

from flashtrain.distributed.sharding import check_seqlen, shard, shard_positions, unshard


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("ring,ulysses", [(1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (1, 4), (3, 2)])
def test_shard_unshard_roundtrip(layout, ring, ulysses):
    seqlen = 2 * ring * ulysses * 3
    x = torch.randn(2, seqlen, 3)
    shards = [
        shard(
            x,
            layout=layout,
            ring_size=ring,
            ring_rank=i // ulysses,
            ulysses_size=ulysses,
            ulysses_rank=i % ulysses,
        )
        for i in range(ring * ulysses)
    ]
    assert all(s.shape == (2, seqlen // (ring * ulysses), 3) for s in shards)
    torch.testing.assert_close(
        unshard(shards, layout=layout, ring_size=ring, ulysses_size=ulysses), x, rtol=0, atol=0
    )


def test_zigzag_positions():
    # 2P = 8 chunks of 2: rank r holds chunks r and 7 - r
    assert shard_positions(16, layout="zigzag", ring_size=4, ring_rank=1).tolist() == [2, 3, 12, 13]
    assert shard_positions(16, layout="contiguous", ring_size=4, ring_rank=1).tolist() == [4, 5, 6, 7]
    # hybrid: ring shard 0 = [0, 1, 14, 15] cut over 2 Ulysses ranks
    assert shard_positions(
        16, layout="zigzag", ring_size=4, ring_rank=0, ulysses_size=2, ulysses_rank=1
    ).tolist() == [
        14,
        15,
    ]


@pytest.mark.parametrize(
    "seqlen,ring,layout,ulysses,msg",
    [
        (6, 2, "zigzag", 1, "divisible by 4"),
        (7, 2, "contiguous", 1, "divisible by 2"),
        (8, 2, "zigzag", 3, "Ulysses"),
    ],
)
def test_indivisible_sequences_raise(seqlen, ring, layout, ulysses, msg):
    with pytest.raises(ValueError, match=msg):
        check_seqlen(seqlen, ring, layout, ulysses)


def test_unknown_layout_raises():
    with pytest.raises(ValueError, match="layout must be one of"):
        check_seqlen(8, 2, "striped")
