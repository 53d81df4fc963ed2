"""Language-modelling corpora: documents -> tokens -> one cached memory-mapped token file.

`prepare_lm_data(LMDataConfig(...))` reads documents from one of three sources, tokenises them with
`datasets.Dataset.map(batched=True)`, appends the end-of-text id to every document, splits documents
into train and validation sets (deterministically from `seed`), and writes both splits, concatenated,
into `tokens.bin` with a `meta.json` beside it. The directory is named by a hash of everything that
changes the tokens, so a second call with the same settings only opens the file (memory-mapped), and
changing any of them (or a source file's size or mtime) builds a new one. Training reads windows of
the arrays with `data.sampler.WindowSampler`.

Sources:
- "stdlib" (default): the `.py` files of the running Python's standard library, one document per file.
  Real, varied English + code text present on every machine with Python, so the default job needs no
  download. Test suites, site-packages and the codec tables in `encodings/` are left out. Files are
  ordered by a hash of their relative path (a spread over the whole library that depends on nothing
  machine-specific), then capped by `max_documents`. The content differs between Python versions and
  slightly between distributions (some split off tkinter/idlelib); the cache key holds the Python
  version and every file's size and mtime, so a cache is never reused for different text.
- "files": local `.txt`/`.text` (one document per file), `.jsonl`/`.json` (one document per record,
  field `text_field`) or `.parquet` (one per row) files; `path` is a file, a directory searched
  recursively, or a glob. All matched files must be of one kind.
- "hf": `datasets.load_dataset(name, config, split=split)`, one document per row; keyed by the dataset's
  fingerprint. `name` may also be a local dataset directory.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import platform
import shutil
import sysconfig
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from data.sampler import WindowSampler, val_batches
from data.tokenizers import TOKENIZER_NAMES, get_tokenizer

__all__ = ["LMData", "LMDataConfig", "WindowSampler", "prepare_lm_data", "val_batches"]

log = logging.getLogger("flashtrain.data")

SOURCES = ("stdlib", "files", "hf")
TOKEN_DTYPES = ("uint8", "uint16", "uint32")
_FORMAT_VERSION = 1  # bump when the token file layout or the document rules change
_KINDS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Left out of the stdlib corpus: test suites and installed third-party packages are not the library,
# and `encodings/` is 120 generated codec tables that would dominate a small corpus with hex literals.
_STDLIB_SKIP_DIRS = frozenset(
    "test tests idle_test site-packages dist-packages encodings __pycache__".split()
)


@dataclass
class LMDataConfig:
    """Where the documents come from and how they become tokens."""

    source: str = "stdlib"  # "stdlib" (Python's library sources, offline), "files" (`path`), "hf" (`name`)
    path: str | None = None  # files: a file, a directory (recursive) or a glob of .txt/.jsonl/.json/.parquet
    name: str | None = None  # hf: dataset name (or local dataset directory) for datasets.load_dataset
    config: str | None = None  # hf: dataset configuration name, if the dataset has several
    split: str = "train"  # hf: split to read; our train/val split is then made from its documents
    text_field: str = "text"  # jsonl/json/parquet/hf: the column that holds each document's text
    tokenizer: str = "byte"  # "byte" (vocab 257) or "gpt2" (GPT-2 BPE, vocab 50257)
    token_dtype: str | None = None  # uint8/uint16/uint32 for the token file; None = smallest that fits
    val_fraction: float = 0.05  # share of (non-empty) documents held out for validation, 0 < f < 1
    max_documents: int | None = 200  # keep the first N documents of the source (None = all); ~3 MB of stdlib
    cache_dir: str = "~/.cache/flashtrain/data"  # token files live in <cache_dir>/<source>-<tokenizer>-<key>/
    num_proc: int = 1  # worker processes for Dataset.map (the gpt2 tokenizer is already multithreaded)
    seed: int = 0  # seed of the document-level train/val split

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"data.source={self.source!r} is unknown; choose one of {', '.join(SOURCES)}")
        if self.source == "files" and not self.path:
            raise ValueError("data.source=files needs data.path (a file, directory or glob)")
        if self.source == "hf" and not self.name:
            raise ValueError("data.source=hf needs data.name (a datasets name or local dataset directory)")
        # A setting the chosen source ignores is almost always a mistake; say so instead of dropping it.
        if self.path is not None and self.source != "files":
            raise ValueError(f"data.path is only read when data.source=files (source is {self.source!r})")
        unused = [k for k in ("name", "config") if getattr(self, k) is not None and self.source != "hf"]
        if unused:
            raise ValueError(f"data.{unused[0]} is only read when data.source=hf (source is {self.source!r})")
        # split and text_field have non-null defaults, so "set" means "differs from the default".
        if self.source != "hf" and self.split != _DEFAULT_SPLIT:
            raise ValueError(
                f"data.split={self.split!r} is only read when data.source=hf (source is {self.source!r}); "
                "our train/val split is made from the documents by data.val_fraction"
            )
        if self.source == "stdlib" and self.text_field != _DEFAULT_TEXT_FIELD:
            raise ValueError(
                f"data.text_field={self.text_field!r} is not read by data.source=stdlib (one document per "
                "file); it names the column of .jsonl/.json/.parquet files or of a data.source=hf dataset"
            )
        if self.tokenizer not in TOKENIZER_NAMES:
            raise ValueError(
                f"data.tokenizer={self.tokenizer!r} is unknown; choose one of {', '.join(TOKENIZER_NAMES)}"
            )
        if self.token_dtype is not None and self.token_dtype not in TOKEN_DTYPES:
            raise ValueError(
                f"data.token_dtype={self.token_dtype!r}; choose one of {', '.join(TOKEN_DTYPES)} or null"
            )
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must be strictly between 0 and 1")
        if self.max_documents is not None and self.max_documents < 2:
            raise ValueError(
                f"data.max_documents={self.max_documents}: need >= 2 (train and val) or null for all"
            )
        if self.num_proc < 1:
            raise ValueError(f"data.num_proc={self.num_proc} must be >= 1")


_DEFAULT_SPLIT = LMDataConfig.split  # the class attributes hold the field defaults
_DEFAULT_TEXT_FIELD = LMDataConfig.text_field


@dataclass
class LMData:
    """Token arrays of one prepared corpus (memory-mapped, read-only)."""

    train: np.memmap  # (num_train_tokens,) documents joined, each followed by eot_id
    val: np.memmap  # (num_val_tokens,) the held-out documents, same layout
    vocab_size: int
    eot_id: int
    tokenizer_name: str
    cache_path: Path  # directory holding tokens.bin and meta.json
    from_cache: bool = False  # True when the files already existed and nothing was tokenised
    meta: dict = field(default_factory=dict)  # contents of meta.json (counts, settings, source summary)


def _token_dtype(cfg: LMDataConfig, vocab_size: int) -> np.dtype:
    if cfg.token_dtype is None:
        return np.dtype(np.uint16 if vocab_size - 1 <= np.iinfo(np.uint16).max else np.uint32)
    dtype = np.dtype(cfg.token_dtype)
    if vocab_size - 1 > np.iinfo(dtype).max:
        raise ValueError(
            f"data.token_dtype={cfg.token_dtype} holds ids up to {np.iinfo(dtype).max}, but tokenizer "
            f"{cfg.tokenizer!r} has vocab_size {vocab_size}; use a wider dtype or leave token_dtype null"
        )
    return dtype


# ----------------------------------------------------------------------------------------- sources


def _file_stamp(path: Path) -> list:
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns]


def stdlib_files(max_documents: int | None) -> list[Path]:
    """The stdlib corpus' files in corpus order (see the module docstring), capped at `max_documents`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # config-3.x-<platform>/ and lib-dynload/ are build artefacts whose presence varies by install.
        dirnames[:] = [
            d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not d.startswith(("config-", "lib-"))
        ]
        found += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    if not found:
        raise ValueError(f"no .py files under the standard library at {root}; use data.source=files or hf")

    def order(p: Path) -> str:
        return hashlib.sha256(p.relative_to(root).as_posix().encode()).hexdigest()

    return sorted(found, key=order)[:max_documents]


def resolve_files(path: str) -> tuple[str, list[Path]]:
    """(kind, sorted files) for a file, a directory (searched recursively) or a glob."""
    expanded = os.path.expanduser(path)
    if glob.has_magic(expanded):
        files = [Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(expanded):
        files = [p for p in Path(expanded).rglob("*") if p.is_file() and p.suffix.lower() in _KINDS]
    elif os.path.isfile(expanded):
        files = [Path(expanded)]
    else:
        raise ValueError(f"data.path={path!r} does not exist; point it at a file, a directory or a glob")
    if not files:
        raise ValueError(f"data.path={path!r} matched no .txt/.text/.jsonl/.json/.parquet files")
    bad = sorted({p.suffix for p in files if p.suffix.lower() not in _KINDS})
    if bad:
        raise ValueError(
            f"data.path={path!r} matched files of unsupported type {bad}; supported: {sorted(_KINDS)}"
        )
    kinds = sorted({_KINDS[p.suffix.lower()] for p in files})
    if len(kinds) > 1:
        raise ValueError(f"data.path={path!r} matched files of several kinds {kinds}; point it at one kind")
    return kinds[0], sorted(files)


def _read_texts(files: list[Path]):
    import datasets

    # Invalid UTF-8 is replaced rather than fatal: one stray byte should not stop a corpus build.
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    return datasets.Dataset.from_dict({"text": texts}), "text"


def _warn_cap(cfg: LMDataConfig, available: int) -> None:
    # The default cap suits the stdlib CPU job; on a user's own corpus it is easy to miss, so say it.
    log.warning(
        "data: using the first %d of %d documents (data.max_documents); set it to null to use them all",
        cfg.max_documents,
        available,
    )


def _load_table(cfg: LMDataConfig, kind: str | None, files: list[Path] | None):
    """(dataset, text column) for the json/parquet/hf sources, checked for `text_field`, capped."""
    import datasets

    if cfg.source == "files":
        if all(p.stat().st_size == 0 for p in files):
            raise ValueError(f"the corpus is empty: every file matched by data.path={cfg.path!r} is empty")
        cache = os.path.join(os.path.expanduser(cfg.cache_dir), "hf")
        try:
            ds = datasets.load_dataset(
                kind, data_files=[str(p) for p in files], split="train", cache_dir=cache
            )
        except Exception as e:  # the json/parquet readers raise Arrow, JSON and builder errors
            raise ValueError(
                f"could not read the {kind} files matched by data.path={cfg.path!r}: {e!r}"
            ) from e
    else:
        try:
            ds = datasets.load_dataset(cfg.name, cfg.config, split=cfg.split)
        except Exception as e:  # datasets raises many types here (not found, offline, bad config)
            raise ValueError(
                f"could not load dataset name={cfg.name!r} config={cfg.config!r} split={cfg.split!r}: {e}"
            ) from e
    if cfg.text_field not in ds.column_names:
        raise ValueError(
            f"data.text_field={cfg.text_field!r} is not a column; the columns are {ds.column_names}"
        )
    if cfg.max_documents is not None and len(ds) > cfg.max_documents:
        _warn_cap(cfg, len(ds))
        ds = ds.select(range(cfg.max_documents))
    return ds, cfg.text_field


def _source(cfg: LMDataConfig) -> tuple[dict, object]:
    """(identity for the cache key, loader returning (dataset, text column)) for the configured source.

    The identity is computed without reading document text where possible (file stamps), so a cache
    hit costs a directory walk; the "hf" source must load the dataset to learn its fingerprint.
    """
    if cfg.source == "stdlib":
        files = stdlib_files(cfg.max_documents)
        ident = {"python": platform.python_version(), "files": [_file_stamp(p) for p in files]}
        return ident, lambda: _read_texts(files)
    if cfg.source == "files":
        kind, files = resolve_files(cfg.path)
        if kind == "text":
            # The config check validate() cannot make: only the matched files tell that there are no columns.
            if cfg.text_field != _DEFAULT_TEXT_FIELD:
                raise ValueError(
                    f"data.text_field={cfg.text_field!r} is not read for .txt/.text files (one document per "
                    f"file), which data.path={cfg.path!r} matched; remove it"
                )
            if cfg.max_documents is not None and len(files) > cfg.max_documents:
                _warn_cap(cfg, len(files))
                files = files[: cfg.max_documents]
            return {"kind": kind, "files": [_file_stamp(p) for p in files]}, lambda: _read_texts(files)
        ident = {"kind": kind, "files": [_file_stamp(p) for p in files], "text_field": cfg.text_field}
        return ident, lambda: _load_table(cfg, kind, files)
    loaded = _load_table(cfg, None, None)
    return {"fingerprint": loaded[0]._fingerprint, "text_field": cfg.text_field}, lambda: loaded


# ------------------------------------------------------------------------------------ tokenisation


def _tokenize_batch(batch: dict, text_field: str, tokenizer: str, dtype: str) -> dict:
    """Dataset.map function: ids of every document followed by eot; an empty document stays empty."""
    tok = get_tokenizer(tokenizer)  # cached per process, so num_proc workers build it once each
    texts = batch[text_field]
    for t in texts:
        if not isinstance(t, str):
            raise ValueError(
                f"a document's {text_field!r} is {type(t).__name__}, not text; fix or drop that record"
            )
    limit = np.iinfo(dtype).max
    out = []
    # numpy arrays, not lists of ints: Arrow ingests them ~80x faster (the default job's whole budget).
    for ids in tok.encode_batch_arrays(texts):
        if len(ids) == 0:
            out.append(np.empty(0, dtype=dtype))
            continue
        top = int(ids.max())
        if top > limit or tok.eot_id > limit:
            raise ValueError(
                f"tokenizer {tokenizer!r} produced id {max(top, tok.eot_id)}, which does not fit the token "
                f"dtype {dtype} (max {limit}); use a wider data.token_dtype or leave it null"
            )
        doc = np.empty(len(ids) + 1, dtype=dtype)
        doc[:-1] = ids
        doc[-1] = tok.eot_id
        out.append(doc)
    return {"ids": out}


def _build(cfg: LMDataConfig, loader, key: str, final: Path, dtype: np.dtype) -> None:
    """Tokenise, split and write `final/` atomically (a temporary directory renamed into place)."""
    import pyarrow.compute as pc

    tok = get_tokenizer(cfg.tokenizer)
    ds, text_column = loader()
    if len(ds) == 0:
        raise ValueError(
            f"the {cfg.source} corpus has no documents; check data.path / data.name / data.split"
        )
    tokenized = ds.map(
        _tokenize_batch,
        batched=True,
        num_proc=cfg.num_proc if len(ds) >= cfg.num_proc > 1 else None,
        remove_columns=ds.column_names,
        fn_kwargs={"text_field": text_column, "tokenizer": cfg.tokenizer, "dtype": dtype.name},
        # The function captures nothing unhashable, but give the fingerprint ourselves: hashing it with
        # dill is slow and the cache key already names the result.
        new_fingerprint=f"flashtrain-lm-{key}",
        desc=f"tokenize ({cfg.tokenizer})",
    )
    ids = tokenized.with_format("arrow")[:].column("ids")  # zero-copy view of the (maybe on-disk) table
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)  # (num_docs,)

    nonempty = np.flatnonzero(lengths > 0)
    if len(nonempty) < 2:
        raise ValueError(
            f"the corpus has {len(nonempty)} non-empty document(s); the train/val split is by document "
            "and needs at least 2 (add documents, or split one big .txt file into several files)"
        )
    num_val = min(max(1, round(cfg.val_fraction * len(nonempty))), len(nonempty) - 1)
    perm = np.random.default_rng(cfg.seed).permutation(len(nonempty))
    is_val = np.zeros(len(lengths), dtype=bool)
    is_val[nonempty[perm[:num_val]]] = True
    num_train_tokens = int(lengths[~is_val].sum())
    total = int(lengths.sum())

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        mm = np.memmap(tmp / "tokens.bin", dtype=dtype, mode="w+", shape=(total,))
        cursor = {False: 0, True: num_train_tokens}  # write positions of the train and val parts
        doc = 0
        # Stream chunk by chunk so a corpus larger than RAM never has to be flattened at once.
        for chunk in ids.chunks:
            n = len(chunk)
            values = chunk.flatten().to_numpy(zero_copy_only=False)  # (tokens in chunk,)
            doc_is_val = np.repeat(is_val[doc : doc + n], lengths[doc : doc + n])  # (tokens in chunk,)
            for part in (False, True):
                sel = values[doc_is_val == part]
                mm[cursor[part] : cursor[part] + len(sel)] = sel
                cursor[part] += len(sel)
            doc += n
        assert cursor[False] == num_train_tokens and cursor[True] == total, "token bookkeeping is off"
        mm.flush()
        del mm
        meta = {
            "format": _FORMAT_VERSION,
            "key": key,
            "dtype": dtype.name,
            "train_tokens": num_train_tokens,
            "val_tokens": total - num_train_tokens,
            "train_documents": int(len(nonempty) - num_val),
            "val_documents": int(num_val),
            "empty_documents": int(len(lengths) - len(nonempty)),
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "tokenizer": cfg.tokenizer,
            "settings": asdict(cfg),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process (e.g. another rank) finished the same key first; theirs is identical.
            if not (final / "meta.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _open(final: Path, from_cache: bool) -> LMData:
    meta = json.loads((final / "meta.json").read_text())
    n_train, n_val = meta["train_tokens"], meta["val_tokens"]
    mm = np.memmap(final / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r", shape=(n_train + n_val,))
    return LMData(
        train=mm[:n_train],
        val=mm[n_train:],
        vocab_size=meta["vocab_size"],
        eot_id=meta["eot_id"],
        tokenizer_name=meta["tokenizer"],
        cache_path=final,
        from_cache=from_cache,
        meta=meta,
    )


def prepare_lm_data(cfg: LMDataConfig) -> LMData:
    """Tokenised train/val token arrays for `cfg`, built once and then reused from the cache.

    Safe to call from every rank at once (each builds in its own temporary directory and the first
    rename wins), but calling it on rank 0 first and then on the others after a barrier avoids the
    duplicate work.
    """
    cfg.validate()
    t0 = time.perf_counter()
    tok = get_tokenizer(cfg.tokenizer)
    dtype = _token_dtype(cfg, tok.vocab_size)
    ident, loader = _source(cfg)
    # Every setting that changes the tokens, and nothing that does not (cache_dir, num_proc).
    keyed = {
        "format": _FORMAT_VERSION,
        "source": cfg.source,
        "ident": ident,
        "tokenizer": cfg.tokenizer,
        "dtype": dtype.name,
        "val_fraction": cfg.val_fraction,
        "max_documents": cfg.max_documents,
        "seed": cfg.seed,
    }
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(os.path.expanduser(cfg.cache_dir)) / f"{cfg.source}-{cfg.tokenizer}-{key}"
    from_cache = (final / "meta.json").exists()
    if not from_cache:
        _build(cfg, loader, key, final, dtype)
    data = _open(final, from_cache)
    log.info(
        "data: %s %s, %d train / %d val tokens (%d / %d documents), %s in %.2fs: %s",
        cfg.source,
        cfg.tokenizer,
        len(data.train),
        len(data.val),
        data.meta["train_documents"],
        data.meta["val_documents"],
        "from cache" if from_cache else "built",
        time.perf_counter() - t0,
        final,
    )
    return data
