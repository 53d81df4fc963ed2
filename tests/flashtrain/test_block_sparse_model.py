"""The block_sparse backend's one layout per model (`flashtrain.models.block_sparse`)."""

import pytest
import torch

from flashtrain.models.block_sparse import KEPT_CROPS, ModelLayout, build_layout, make_block_sparse_backend
from flashtrain.models.gpt import GPTConfig

KINDS = {
    "butterfly": dict(block_sparse_factors=None, block_sparse_global=1, block_sparse_local=0),
    "local": dict(block_sparse_local=2),
    "strided": dict(block_sparse_stride=3, block_sparse_local=0),
    "random": dict(block_sparse_density=0.3),
}


def _cfg(kind, causal=True, max_seq_len=512, **fields):
    return GPTConfig(n_head=3, d_model=48, vocab_size=32, max_seq_len=max_seq_len, causal=causal,
                     attention="block_sparse", block_sparse_kind=kind,
                     **{"block_sparse_block": 16, **KINDS[kind], **fields})  # fmt: skip


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_sequence_takes_the_leading_blocks_of_the_models_layout(kind, causal):
    """Every length crops the one layout over max_seq_len; for the kinds whose tiles do not depend on the
    block count that is also the layout built for that length (what each length got before)."""
    cfg = _cfg(kind, causal)
    layouts = ModelLayout(cfg)
    for seqlen in (1, 16, 17, 100, 256, 512):
        n = -(-seqlen // 16)
        crop = layouts.for_sequence(seqlen, "cpu")
        assert torch.equal(crop.mask, layouts.whole.mask[:, :n, :n]) and crop.block_m == 16
        if kind != "random":
            assert torch.equal(crop.mask, build_layout(cfg, seqlen, 3, causal).mask)


def test_a_butterfly_with_fewer_factors_than_its_blocks_allow_runs_short_sequences():
    """block_sparse_factors is checked against the model's block count (512 / 16 = 32 blocks: up to 5
    factors), not a short sequence's: a 2-block sequence once refused 3 factors, the model too."""
    layouts = ModelLayout(_cfg("butterfly", block_sparse_factors=3))
    assert layouts.for_sequence(20, "cpu").shape == (1, 2, 2)
    with pytest.raises(
        ValueError, match=r"model.block_sparse_factors must be an int in \[0, 5\] for 32 blocks"
    ):
        make_block_sparse_backend(_cfg("butterfly", block_sparse_factors=6))


@pytest.mark.parametrize(
    "kind, fields, match",
    [
        ("butterfly", dict(block_sparse_block=24), "model.block_sparse_block=24: use a power of two"),
        ("butterfly", dict(block_sparse_global=-2), "model.block_sparse_global must be an int >= 0, got -2"),
        ("local", dict(block_sparse_local=-1), "model.block_sparse_local must be an int >= 0, got -1"),
        ("strided", dict(block_sparse_stride=0), "model.block_sparse_stride must be an int >= 1, got 0"),
        (
            "random",
            dict(block_sparse_density=1.5),
            r"model.block_sparse_density must be in \[0, 1\], got 1.5",
        ),
    ],
)
def test_a_bad_layout_setting_is_refused_by_its_config_key(kind, fields, match):
    with pytest.raises(ValueError, match="the block-sparse layout over 512 tokens: " + match):
        make_block_sparse_backend(_cfg(kind, **fields))


def test_a_sequence_longer_than_max_seq_len_gets_the_layout_of_its_length():
    cfg = _cfg("random", max_seq_len=64)
    layouts = ModelLayout(cfg)
    assert torch.equal(layouts.for_sequence(100, "cpu").mask, build_layout(cfg, 100, 3, True).mask)
    assert torch.equal(layouts.for_sequence(50, "cpu").mask, layouts.whole.mask)


def test_decode_rows_are_kept_a_few_at_a_time():
    layouts = ModelLayout(_cfg("random"))
    for pos in range(0, 512, 5):  # one query at pos against the keys so far, as a decode step asks
        row = layouts.rows(pos // 16, pos // 16 + 1, pos + 1, "cpu")
        assert torch.equal(row.mask, layouts.whole.mask[:, pos // 16 : pos // 16 + 1, : pos // 16 + 1])
    assert len(layouts._crops) == KEPT_CROPS


def test_a_causal_prefix_attends_as_the_first_rows_of_the_whole_sequence(device):
    """A query sees the same keys whatever the sequence's length: the backend's output over a prefix
    is the whole sequence's first rows (a random layout, a pattern per head, on GQA)."""
    attend = make_block_sparse_backend(_cfg("random", max_seq_len=64))
    q = torch.randn(2, 64, 3, 16, device=device)
    k, v = torch.randn(2, 2, 64, 1, 16, device=device).unbind(1)
    whole = attend(q, k, v, causal=True)
    for n in (1, 23, 48):
        torch.testing.assert_close(attend(q[:, :n], k[:, :n], v[:, :n], causal=True), whole[:, :n])
