"""Triton attention kernels: FlashAttention (dense, varlen) with backward, Flash-Decoding, and
block-sparse FlashAttention over a block layout (`kernels.layouts`: butterfly, local, strided, ...),
and the language-model loss fused with its vocabulary projection (`linear_cross_entropy`).

Imports nothing from flashtrain; flashtrain uses these as its `triton` attention backend.
`kernels.reference` holds the pure-torch oracles the tests compare against.
"""

from . import layouts, reference
from .block_sparse import block_sparse_attention
from .cross_entropy import linear_cross_entropy
from .decode import flash_decode
from .flash_attention import flash_attention, flash_attention_qkvpacked, flash_attention_varlen

__all__ = [
    "block_sparse_attention",
    "flash_attention",
    "flash_attention_qkvpacked",
    "flash_attention_varlen",
    "flash_decode",
    "layouts",
    "linear_cross_entropy",
    "reference",
]
