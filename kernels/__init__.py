"""Triton attention kernels: FlashAttention (dense, varlen) with backward, and Flash-Decoding.

Imports nothing from flashtrain; flashtrain uses these as its `triton` attention backend.
`kernels.reference` holds the pure-torch oracles the tests compare against.
"""

from . import reference
from .decode import flash_decode
from .flash_attention import flash_attention, flash_attention_varlen

__all__ = ["flash_attention", "flash_attention_varlen", "flash_decode", "reference"]
