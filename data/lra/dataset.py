"""Cached `datasets` splits of the LRA generators, built in parallel processes.

Pathfinder: columns `pixels` (resolution * resolution uint8, row-major; the model's tokens 0..255) and
`label` (0/1). ListOps: columns `tokens` (ids into `LISTOPS_VOCAB`, 0 = padding, unpadded) and `label`
(0..9). Splits are "train", "validation", "test" (split ids 0, 1, 2 of the generators).

Every split is saved on its own under `cache_dir/<name>-<hash of the settings>/<split>` once it is complete
(written to a temporary folder, then renamed), so an interrupted build keeps its finished splits and a
rebuild with the same settings only loads them. Example i of a split depends only on (seed, split, i), so
the number of processes never changes the data.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import datasets
import numpy as np

from data.lra import listops, pathfinder
from data.lra._checks import check_int
from data.lra.listops import LISTOPS_VOCAB, decode_listops, encode_listops

__all__ = [
    "LISTOPS_VOCAB",
    "SPLITS",
    "build_listops_dataset",
    "build_pathfinder_dataset",
    "decode_listops",
    "default_cache_dir",
    "encode_listops",
]

SPLITS = ("train", "validation", "test")
# Bump when a generator changes its output, so stale caches are not reused.
GENERATOR_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("FLASHTRAIN_DATA_CACHE", Path.home() / ".cache" / "flashtrain")) / "lra"


def _check_sizes(sizes: dict[str, int], num_proc, chunk_size: int):
    for name, n in sizes.items():
        check_int(name, n)
    if num_proc is not None:  # (None: all cores)
        check_int("num_proc", num_proc, minimum=1)
    check_int("chunk_size", chunk_size, minimum=1)


def _key(name: str, settings: dict) -> str:
    blob = json.dumps({**settings, "version": GENERATOR_VERSION}, sort_keys=True)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _chunks(n: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(s, min(chunk_size, n - s)) for s in range(0, n, chunk_size)]


def _cached_splits(root: Path, sizes: dict[str, int], build_split) -> datasets.DatasetDict:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for split_id, (split, n) in enumerate(zip(SPLITS, sizes.values(), strict=True)):
        final = root / split
        if not final.exists():
            with tempfile.TemporaryDirectory(dir=root, prefix=f".{split}-") as tmp:
                ds = build_split(split_id, n, Path(tmp) / "work")
                ds.save_to_disk(str(Path(tmp) / split))
                del ds
                os.replace(Path(tmp) / split, final)  # atomic: a split folder is always complete
        out[split] = datasets.load_from_disk(str(final))
    return datasets.DatasetDict(out)


# ---------------------------------------------------------------------------------------------------------
# Pathfinder


def _pathfinder_rows(chunks, params_dict, seed, split):
    params = pathfinder.PathfinderParams(**{**params_dict, "margins": tuple(params_dict["margins"])})
    for start, count in chunks:
        images, labels = pathfinder.generate(
            count, params.resolution, seed, params=params, split=split, start=start
        )
        for image, label in zip(images, labels, strict=True):
            yield {"pixels": image.reshape(-1), "label": int(label)}  # (H, H) -> (H*H,) row-major


def build_pathfinder_dataset(
    resolution: int,
    n_train: int = 160_000,
    n_val: int = 20_000,
    n_test: int = 20_000,
    seed: int = 0,
    num_proc: int | None = None,
    cache_dir: str | Path | None = None,
    params: pathfinder.PathfinderParams | None = None,
    chunk_size: int = 256,
) -> datasets.DatasetDict:
    """Pathfinder splits at `resolution` (LRA's settings unless `params` is given); built once, then loaded."""
    sizes = {"n_train": n_train, "n_val": n_val, "n_test": n_test}
    _check_sizes(sizes, num_proc, chunk_size)
    if params is None:
        params = pathfinder.params_for(resolution)
    elif params.resolution != resolution:
        raise ValueError(f"params.resolution={params.resolution} does not match resolution={resolution}")
    pathfinder._check_index_args(seed, 0, 0)
    params_dict = asdict(params)
    root = Path(cache_dir or default_cache_dir()) / _key(
        f"pathfinder{resolution}", {"params": params_dict, "seed": seed, **sizes}
    )
    features = datasets.Features(
        {
            "pixels": datasets.Sequence(datasets.Value("uint8"), length=resolution * resolution),
            "label": datasets.Value("int64"),
        }
    )
    procs = num_proc or os.cpu_count() or 1

    def build_split(split_id, n, work):
        chunks = _chunks(n, chunk_size)
        if not chunks:
            return datasets.Dataset.from_dict({"pixels": [], "label": []}, features=features)
        # datasets hands each process a contiguous run of `chunks` and concatenates them in order.
        return datasets.Dataset.from_generator(
            _pathfinder_rows,
            features=features,
            gen_kwargs={"chunks": chunks, "params_dict": params_dict, "seed": seed, "split": split_id},
            num_proc=min(procs, len(chunks)) if procs > 1 else None,
            cache_dir=str(work),
        )

    return _cached_splits(root, sizes, build_split)


# ---------------------------------------------------------------------------------------------------------
# ListOps


def _listops_chunk(args):
    seed, split, start, count = args
    return listops.generate_raw(count, seed, split=split, start=start)


def build_listops_dataset(
    n_train: int = 96_000,
    n_val: int = 2_000,
    n_test: int = 2_000,
    seed: int = 0,
    num_proc: int | None = None,
    cache_dir: str | Path | None = None,
    chunk_size: int = 500,
) -> datasets.DatasetDict:
    """ListOps splits with no expression repeated within or across splits; built once, then loaded."""
    sizes = {"n_train": n_train, "n_val": n_val, "n_test": n_test}
    _check_sizes(sizes, num_proc, chunk_size)
    check_int("seed", seed)
    root = Path(cache_dir or default_cache_dir()) / _key("listops", {"seed": seed, **sizes})
    features = datasets.Features(
        {"tokens": datasets.Sequence(datasets.Value("uint8")), "label": datasets.Value("int64")}
    )
    procs = num_proc or os.cpu_count() or 1
    # Expressions of earlier splits, so later splits never repeat them. Splits loaded from an interrupted
    # build are read back first, which keeps a resumed build identical to an uninterrupted one.
    seen: set[bytes] = set()
    remembered: set[int] = set()

    def build_split(split_id, n, work):
        for earlier in range(split_id):
            if earlier not in remembered:
                for ids in datasets.load_from_disk(str(root / SPLITS[earlier]))["tokens"]:
                    seen.add(listops._digest(decode_listops(ids)))
                remembered.add(earlier)
        jobs = [(seed, split_id, s, c) for s, c in _chunks(n, chunk_size)]
        if procs > 1 and len(jobs) > 1:
            with multiprocessing.get_context().Pool(min(procs, len(jobs))) as pool:
                raw = [item for chunk in pool.imap(_listops_chunk, jobs) for item in chunk]
        else:
            raw = [item for job in jobs for item in _listops_chunk(job)]
        items = listops.dedupe(raw, seed, split_id, 0, seen)
        remembered.add(split_id)
        tokens = [np.asarray(encode_listops(expr), dtype=np.uint8) for expr, _ in items]
        return datasets.Dataset.from_dict(
            {"tokens": tokens, "label": [v for _, v in items]}, features=features
        )

    return _cached_splits(root, sizes, build_split)
