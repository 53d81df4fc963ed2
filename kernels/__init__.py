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


# Names of Hugging Face's `kernels` package (the hub's compute kernels), which shares this package's import name.
# transformers imports them from `kernels` whenever that distribution is installed (a requirement of transformers
# 5.25 and later), and then finds this package: say what to change instead of "cannot import name".
_HUB_KERNELS_NAMES = frozenset({
    "CUDAProperties", "Device", "KernelizeFallback", "LayerRepository", "LocalLayerRepository", "Mode",
    "ROCMProperties", "get_kernel", "get_local_kernel", "has_kernel", "kernelize", "load_kernel",
    "register_kernel_mapping", "replace_kernel_forward_from_hub", "use_kernel_forward_from_hub", "use_kernel_mapping",
})  # fmt: skip


def __getattr__(name: str):
    if name in _HUB_KERNELS_NAMES:
        raise ImportError(
            f"`from kernels import {name}` asks for Hugging Face's `kernels` package, but `kernels` is flashtrain's "
            "attention kernels here: both use that import name. transformers 5.25 and later import it whenever it "
            "is installed; beside flashtrain use transformers<5.25 and `pip uninstall kernels` (Hugging Face's)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
