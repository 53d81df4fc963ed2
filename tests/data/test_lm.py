"""LM corpora (sources, eot, cache, split, errors) and the window sampler (determinism, resume, ranks)."""

import json
import os
import random
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import data.lm as lm
from data.lm import LMDataConfig, prepare_lm_data, stdlib_files
from data.sampler import WindowSampler, val_batches
from data.tokenizers import get_tokenizer

WORDS = "the of and model token window attention ring block sparse kernel café naïve 日本語".split()


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "\n" for _ in range(n)]


def _write_txt(root: Path, docs: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (root / f"doc{i:03d}.txt").write_text(d, encoding="utf-8")
    return root


def _cfg(tmp_path: Path, **kw) -> LMDataConfig:
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    kw.setdefault("max_documents", None)
    return LMDataConfig(**kw)


def _split_docs(tokens: np.ndarray, eot: int) -> list[list[int]]:
    """Token array -> documents (each must end with eot)."""
    assert len(tokens) and tokens[-1] == eot
    ends = np.flatnonzero(tokens == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokens[s:e].tolist() for s, e in zip(starts, ends, strict=True)]


# ------------------------------------------------------------------------------------------ corpus


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2"])
def test_txt_documents_end_with_eot_and_split_partitions(tmp_path, tokenizer):
    docs = _docs(12, seed=0)
    d = prepare_lm_data(
        _cfg(tmp_path, source="files", path=str(_write_txt(tmp_path / "txt", docs)), tokenizer=tokenizer)
    )
    tok = get_tokenizer(tokenizer)
    assert (d.vocab_size, d.eot_id, d.tokenizer_name) == (tok.vocab_size, tok.eot_id, tokenizer)
    assert d.train.dtype == np.uint16 and not d.from_cache
    train, val = _split_docs(d.train, d.eot_id), _split_docs(d.val, d.eot_id)
    assert len(val) == round(0.05 * 12) or len(val) == 1
    # Every document appears exactly once across the two splits, decoded back to its text.
    assert sorted(tok.decode(x) for x in train + val) == sorted(docs)
    # Train keeps source order.
    assert [tok.decode(x) for x in train] == [x for x in docs if tok.encode(x) in train]
    assert d.meta["train_tokens"] == len(d.train) and d.meta["val_tokens"] == len(d.val)


def test_jsonl_parquet_hf_give_the_same_tokens_as_txt(tmp_path, monkeypatch):
    import datasets

    # Keep the "hf" source's dataset cache out of the user's ~/.cache/huggingface.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    docs = _docs(10, seed=1)
    ref = prepare_lm_data(_cfg(tmp_path, source="files", path=str(_write_txt(tmp_path / "txt", docs))))
    jdir = tmp_path / "jsonl"
    jdir.mkdir()
    with open(jdir / "part.jsonl", "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, "body": doc}) + "\n")
    pdir = tmp_path / "pq"
    pdir.mkdir()
    pq.write_table(pa.table({"body": docs}), pdir / "part.parquet")
    for cfg in (
        _cfg(tmp_path, source="files", path=str(jdir / "*.jsonl"), text_field="body"),
        _cfg(tmp_path, source="files", path=str(pdir / "part.parquet"), text_field="body"),
        _cfg(tmp_path, source="hf", name=str(jdir), text_field="body"),
    ):
        d = prepare_lm_data(cfg)
        np.testing.assert_array_equal(d.train, ref.train)
        np.testing.assert_array_equal(d.val, ref.val)
    # The hf source is keyed by the dataset fingerprint: loading the same dataset again hits the cache.
    assert prepare_lm_data(_cfg(tmp_path, source="hf", name=str(jdir), text_field="body")).from_cache


def test_cache_hit_does_not_retokenise(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, source="files", path=str(_write_txt(tmp_path / "txt", _docs(6, seed=2))))
    first = prepare_lm_data(cfg)

    def fail(*args, **kwargs):
        raise AssertionError("tokenised again although the cache holds these settings")

    monkeypatch.setattr(lm, "_tokenize_batch", fail)
    second = prepare_lm_data(cfg)
    assert second.from_cache and second.cache_path == first.cache_path
    np.testing.assert_array_equal(second.train, first.train)
    assert isinstance(second.train, np.memmap)
    # A second builder that lost the race to the same key leaves the winner's files in place.
    monkeypatch.undo()
    lm._build(cfg, lm._source(cfg)[1], "race", first.cache_path, np.dtype(np.uint16))
    assert sorted(os.listdir(first.cache_path.parent)) == [first.cache_path.name]


def test_cache_invalidation(tmp_path):
    root = _write_txt(tmp_path / "txt", _docs(6, seed=3))
    base = prepare_lm_data(_cfg(tmp_path, source="files", path=str(root)))
    for change in ({"val_fraction": 0.4}, {"seed": 1}, {"tokenizer": "gpt2"}, {"token_dtype": "uint32"}):
        d = prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), **change))
        assert not d.from_cache and d.cache_path != base.cache_path, change
    assert (
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), token_dtype="uint32")).train.dtype
        == np.uint32
    )
    # Settings that do not change the tokens share the cache.
    assert prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), num_proc=2)).from_cache
    # Editing a source file changes its size/mtime, hence the key.
    with open(root / "doc000.txt", "a", encoding="utf-8") as f:
        f.write("an appended sentence\n")
    edited = prepare_lm_data(_cfg(tmp_path, source="files", path=str(root)))
    assert (
        not edited.from_cache and len(edited.train) + len(edited.val) == len(base.train) + len(base.val) + 21
    )


def test_split_is_deterministic_in_seed(tmp_path):
    root = _write_txt(tmp_path / "txt", _docs(40, seed=4))
    a = prepare_lm_data(
        _cfg(tmp_path, source="files", path=str(root), val_fraction=0.2, cache_dir=str(tmp_path / "a"))
    )
    # Two map workers must give the same tokens as one.
    b = prepare_lm_data(
        _cfg(
            tmp_path,
            source="files",
            path=str(root),
            val_fraction=0.2,
            cache_dir=str(tmp_path / "b"),
            num_proc=2,
        )
    )
    c = prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), val_fraction=0.2, seed=7))
    assert a.cache_path.name == b.cache_path.name  # the key holds no machine-local setting
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.val, b.val)
    assert a.meta["val_documents"] == c.meta["val_documents"] == 8
    assert _split_docs(a.val, a.eot_id) != _split_docs(c.val, c.eot_id)


def test_stdlib_corpus(tmp_path):
    files = stdlib_files(8)
    assert files == stdlib_files(8) == stdlib_files(None)[:8]
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in stdlib_files(None):
        parts = p.relative_to(root).parts
        assert p.suffix == ".py" and not {"test", "tests", "site-packages", "encodings"} & set(parts)
    d = prepare_lm_data(LMDataConfig(max_documents=8, cache_dir=str(tmp_path)))
    tok = get_tokenizer("byte")
    texts = {p.read_text(encoding="utf-8", errors="replace") for p in files}
    got = [tok.decode(x) for x in _split_docs(d.train, d.eot_id) + _split_docs(d.val, d.eot_id)]
    assert set(got) <= texts and len(got) == sum(1 for t in texts if t)
    assert d.meta["settings"]["source"] == "stdlib" and len(d.train) > 10_000


def test_empty_documents_are_dropped(tmp_path):
    docs = _docs(5, seed=5)
    root = _write_txt(tmp_path / "txt", docs + [""])
    d = prepare_lm_data(_cfg(tmp_path, source="files", path=str(root)))
    assert d.meta["empty_documents"] == 1
    assert int((d.train == d.eot_id).sum() + (d.val == d.eot_id).sum()) == 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"source": "files", "path": "/nonexistent/flashtrain/corpus"}, "does not exist"),
        ({"source": "files"}, "needs data.path"),
        ({"source": "hf"}, "needs data.name"),
        ({"source": "web"}, "data.source='web' is unknown"),
        ({"path": "x.txt"}, "only read when data.source=files"),
        ({"name": "wikitext"}, "only read when data.source=hf"),
        # split and text_field used to be dropped silently by the sources that do not read them
        ({"split": "validation"}, "data.split='validation' is only read when data.source=hf"),
        ({"source": "files", "path": "x.jsonl", "split": "test"}, "data.split='test' is only read when"),
        ({"text_field": "body"}, "data.text_field='body' is not read by data.source=stdlib"),
        ({"tokenizer": "gpt4"}, "choose one of byte, gpt2"),
        ({"token_dtype": "int8"}, "choose one of uint8, uint16, uint32"),
        ({"val_fraction": 0.0}, "strictly between 0 and 1"),
        ({"max_documents": 1}, "need >= 2"),
    ],
)
def test_config_errors(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        prepare_lm_data(_cfg(tmp_path, **kwargs))


def test_text_field_is_refused_for_txt_files(tmp_path):
    """.txt files have no columns: a text_field used to be ignored; the same setting works for .jsonl."""
    root = _write_txt(tmp_path / "txt", _docs(3, seed=8))
    with pytest.raises(ValueError, match="data.text_field='body' is not read for .txt/.text files"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), text_field="body"))
    assert len(prepare_lm_data(_cfg(tmp_path, source="files", path=str(root))).train) > 0


def test_corpus_errors(tmp_path):
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match="matched no"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(empty_dir)))
    with pytest.raises(ValueError, match="matched no"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(tmp_path / "*.parquet")))
    blank = _write_txt(tmp_path / "blank", ["", ""])
    with pytest.raises(ValueError, match="0 non-empty document"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(blank)))
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "a.jsonl").write_text("")
    with pytest.raises(ValueError, match="corpus is empty"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(tmp_path / "j")))
    (tmp_path / "j" / "a.jsonl").write_text('{"text": "a"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match="not text"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(tmp_path / "j")))
    with pytest.raises(ValueError, match="'body' is not a column"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(tmp_path / "j"), text_field="body"))
    (tmp_path / "j" / "b.txt").write_text("x")
    with pytest.raises(ValueError, match="several kinds"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(tmp_path / "j")))
    one = _write_txt(tmp_path / "one", _docs(1, seed=6))
    with pytest.raises(ValueError, match="1 non-empty document"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(one)))


def test_token_dtype_too_small(tmp_path):
    root = _write_txt(tmp_path / "txt", _docs(3, seed=7))
    with pytest.raises(ValueError, match="token_dtype=uint8 holds ids up to 255.*vocab_size 257"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), token_dtype="uint8"))
    with pytest.raises(ValueError, match="vocab_size 50257"):
        prepare_lm_data(_cfg(tmp_path, source="files", path=str(root), token_dtype="uint8", tokenizer="gpt2"))
    # The per-batch check catches a tokenizer whose ids exceed the dtype despite the vocabulary check.
    with pytest.raises(ValueError, match="does not fit the token dtype uint8"):
        lm._tokenize_batch({"text": ["abc"]}, "text", "byte", "uint8")


# ----------------------------------------------------------------------------------------- sampler


def _tokens(n: int) -> np.ndarray:
    # Distinct values, so every window identifies its start position.
    return np.random.default_rng(n).permutation(n).astype(np.int64)


def _starts(tokens: np.ndarray, x: torch.Tensor) -> list[int]:
    where = np.argsort(tokens)
    return [int(where[v]) for v in x[:, 0].tolist()]


def test_sampler_windows_shift_and_cover_an_epoch():
    n, seq_len, bsz = 1000, 16, 4
    tokens = _tokens(n)
    s = WindowSampler(tokens, seq_len, bsz, seed=3)
    x, y = s.next_batch()
    assert x.shape == y.shape == (bsz, seq_len) and x.dtype == y.dtype == torch.int64
    starts = _starts(tokens, x)
    for row, st in enumerate(starts):
        assert x[row].tolist() == tokens[st : st + seq_len].tolist()
        assert y[row].tolist() == tokens[st + 1 : st + seq_len + 1].tolist()
    # One epoch: starts are offset + i * seq_len, each window exactly once.
    s = WindowSampler(tokens, seq_len, 1, seed=3)
    offset, perm = s._epoch_windows(0)
    epoch = [_starts(tokens, s.next_batch()[0])[0] for _ in range(len(perm))]
    assert sorted(epoch) == [offset + i * seq_len for i in range(len(perm))]
    assert len(perm) == (n - offset - 1) // seq_len and s.epoch == 1 and s.pos == 0


def test_sampler_offsets_change_between_epochs():
    s = WindowSampler(_tokens(5000), 64, 2, seed=0)
    offsets = {s._epoch_windows(e)[0] for e in range(20)}
    assert len(offsets) > 5 and all(0 <= o < 64 for o in offsets)


def test_sampler_determinism_and_seed():
    tokens = _tokens(3000)
    a, b, c = (WindowSampler(tokens, 32, 3, seed=s) for s in (5, 5, 6))
    batches_a = [a.next_batch() for _ in range(60)]  # 60 * 3 windows span two epochs
    batches_b = [b.next_batch() for _ in range(60)]
    assert a.epoch >= 1
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(batches_a[0][0], c.next_batch()[0])


@pytest.mark.parametrize("stop", [7, 31, 40])  # mid-epoch, at the epoch boundary, in epoch 2
def test_sampler_resume_is_exact(stop):
    tokens = _tokens(2000)  # 2000 // 20 ~ 99 windows per epoch, 3 per batch -> epoch ends near step 33
    ref = WindowSampler(tokens, 20, 3, seed=11)
    expected = [ref.next_batch()[0] for _ in range(stop + 10)]
    run = WindowSampler(tokens, 20, 3, seed=11)
    for _ in range(stop):
        run.next_batch()
    state = json.loads(json.dumps(run.state_dict()))  # checkpoints store it as JSON-able ints
    resumed = WindowSampler(tokens, 20, 3, seed=11)
    resumed.load_state_dict(state)
    for i in range(10):
        assert torch.equal(resumed.next_batch()[0], expected[stop + i])
    assert resumed.step == stop + 10


def test_sampler_rank_slices_equal_the_global_batch():
    tokens = _tokens(1500)
    world, bsz = 2, 3
    single = WindowSampler(tokens, 24, bsz * world, seed=2)
    ranks = [WindowSampler(tokens, 24, bsz, seed=2, rank=r, world_size=world) for r in range(world)]
    for _ in range(25):  # 25 * 6 windows cross epoch boundaries
        xg, yg = single.next_batch()
        parts = [r.next_batch() for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), xg)
        assert torch.equal(torch.cat([p[1] for p in parts]), yg)
    assert ranks[0].state_dict() == ranks[1].state_dict() == {**single.state_dict()}
    # A checkpoint from the single-rank run resumes the two-rank run at the same stream position.
    more = WindowSampler(tokens, 24, bsz, seed=2, rank=1, world_size=world)
    more.load_state_dict(single.state_dict())
    assert torch.equal(more.next_batch()[0], single.next_batch()[0][bsz:])


def test_sampler_errors():
    tokens = _tokens(100)
    with pytest.raises(ValueError, match="corpus has 100 tokens, need at least seq_len\\+1 = 101"):
        WindowSampler(tokens, 100, 1)
    with pytest.raises(ValueError, match="rank < world_size"):
        WindowSampler(tokens, 10, 1, rank=2, world_size=2)
    s = WindowSampler(tokens, 10, 1, seed=1)
    with pytest.raises(ValueError, match="seed: checkpoint 1 vs now 2"):
        WindowSampler(tokens, 10, 1, seed=2).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="num_tokens"):
        WindowSampler(_tokens(99), 10, 1, seed=1).load_state_dict(s.state_dict())
    # The largest legal seq_len gives one window per epoch.
    x, y = WindowSampler(tokens, 99, 1).next_batch()
    assert x[0].tolist() == tokens[:99].tolist() and y[0].tolist() == tokens[1:].tolist()


def test_val_batches():
    tokens = _tokens(2000)
    seq_len, bsz = 16, 4
    first = [x for x, _ in val_batches(tokens, seq_len, bsz, 5)]
    again = [x for x, _ in val_batches(tokens, seq_len, bsz, 5)]
    assert len(first) == 5 and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    starts = [s for x in first for s in _starts(tokens, x)]
    assert all(s % seq_len == 0 for s in starts) and starts == sorted(set(starts))  # no overlaps
    assert starts[-1] > len(tokens) // 2  # spread over the split, not only its beginning
    for r in range(2):
        part = [x for x, _ in val_batches(tokens, seq_len, bsz // 2, 5, rank=r, world_size=2)]
        assert all(torch.equal(p, f[r * 2 : (r + 1) * 2]) for p, f in zip(part, first, strict=True))
    windows = (len(tokens) - 1) // seq_len  # 124 -> 31 global batches of 4
    assert len(list(val_batches(tokens, seq_len, bsz, 1000))) == windows // bsz
    with pytest.raises(ValueError, match="fewer than one global batch"):
        next(val_batches(tokens[:40], seq_len, bsz, 1))


def test_max_documents_caps_and_warns(tmp_path, flashtrain_logs):
    docs = _docs(6, seed=8)
    root = _write_txt(tmp_path / "txt", docs)
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = get_tokenizer("byte")
    for path in (root, tmp_path / "j"):
        flashtrain_logs.clear()
        d = prepare_lm_data(_cfg(tmp_path, source="files", path=str(path), max_documents=4))
        assert "first 4 of 6 documents" in flashtrain_logs.text
        got = [tok.decode(x) for x in _split_docs(d.train, d.eot_id) + _split_docs(d.val, d.eot_id)]
        assert sorted(got) == sorted(docs[:4])
