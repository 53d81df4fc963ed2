"""Data for flashtrain: language-modelling corpora (`data.lm`), tokenizers (`data.tokenizers`) and the
window sampler (`data.sampler`). The LRA generators live in `data.lra` and are imported on their own
(`import data.lra`), so importing this package stays light: `datasets` and `tokenizers` load only when
a corpus or GPT-2 tokenizer is first built.
"""

from data.lm import LMData, LMDataConfig, prepare_lm_data
from data.sampler import WindowSampler, val_batches
from data.tokenizers import TOKENIZER_NAMES, get_tokenizer

__all__ = [
    "TOKENIZER_NAMES",
    "LMData",
    "LMDataConfig",
    "WindowSampler",
    "get_tokenizer",
    "prepare_lm_data",
    "val_batches",
]
