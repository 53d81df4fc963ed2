"""ncu_attention.py's profiled call: the attention benchmark's shape for dense impls, the block-sparse
benchmark's for block-sparse ones."""

import pytest

from benchmarks import ncu_attention
from benchmarks.bench_attention import issue_shape


@pytest.mark.parametrize("seqlen, headdim", [(4096, 64), (16384, 128), (1024, 256)])
def test_dense_impls_profile_the_attention_benchmarks_shape(seqlen, headdim):
    for impl in ("triton", "sdpa_cudnn", "flex"):
        assert ncu_attention.batch_and_heads(impl, seqlen, headdim) == issue_shape(seqlen, headdim)


@pytest.mark.parametrize("impl", ["bs:1:0", "bs:5:2", "flexbs:1:0"])
@pytest.mark.parametrize("seqlen", [4096, 16384])
def test_block_sparse_impls_profile_the_block_sparse_benchmarks_shape(impl, seqlen):
    batch, nheads = ncu_attention.batch_and_heads(impl, seqlen, 64)
    assert (batch, nheads) == (1, 16)
    # (bench_block_sparse's own default, which the issue's figures use)
    assert nheads == ncu_attention.BLOCK_SPARSE_HEADS
