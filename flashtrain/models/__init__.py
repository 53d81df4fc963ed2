"""GPT models built on the attention backends of `flashtrain.models.attention`."""

from flashtrain.models.gpt import GPT, GPTConfig
from flashtrain.models.hf import from_hf_gpt2, to_hf_gpt2

__all__ = ["GPT", "GPTConfig", "from_hf_gpt2", "to_hf_gpt2"]
