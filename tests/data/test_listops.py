"""ListOps generator and the cached LRA dataset builders (ListOps and Pathfinder splits)."""

import numpy as np
import pytest

from data.lra import dataset as lra_dataset
from data.lra import listops
from data.lra import pathfinder as pf


def _stack_eval(expr: str) -> int:
    """Evaluation with an explicit stack (independent of the generator's recursive evaluator)."""
    stack = []
    for tok in expr.split():
        if tok == "]":
            args = []
            while not isinstance(stack[-1], str):
                args.append(stack.pop())
            op = stack.pop()
            if op == "[MIN":
                stack.append(min(args))
            elif op == "[MAX":
                stack.append(max(args))
            elif op == "[MED":
                stack.append(int(np.median(args)))
            elif op == "[SM":
                stack.append(sum(args) % 10)
            else:
                raise AssertionError(op)
        elif tok.startswith("["):
            stack.append(tok)
        else:
            stack.append(int(tok))
    assert len(stack) == 1
    return stack[0]


def _depth(expr: str) -> int:
    depth = best = 0
    for tok in expr.split():
        if tok.startswith("["):
            depth += 1
        elif tok == "]":
            depth -= 1
        else:
            best = max(best, depth + 1)  # a digit sits one level below its operator
        best = max(best, depth)
    return best


def test_known_expressions():
    assert listops.evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9
    assert listops.evaluate("[MED 2 3 ]") == 2  # int(np.median) rounds 2.5 down
    assert listops.evaluate("[SM 9 8 [MED 1 5 4 9 ] ]") == (9 + 8 + 4) % 10
    assert _stack_eval("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9


def test_generated_expressions():
    items = listops.generate(120, seed=3)
    exprs = [e for e, _ in items]
    assert len(set(exprs)) == len(exprs)
    for expr, label in items:
        n = len(expr.split())
        assert listops.MIN_LENGTH < n < listops.MAX_LENGTH
        assert expr == " ".join(expr.split())  # single spaces, no padding
        assert label == _stack_eval(expr) == listops.evaluate(expr)
        assert _depth(expr) <= listops.MAX_DEPTH
        assert expr.startswith("[") and expr.endswith("]")
    labels = [label for _, label in items]
    assert len(set(labels)) >= 6  # several of the 10 classes occur


def test_determinism_chunking_and_exclusion():
    a = listops.generate(8, seed=1, split=2)
    assert a == listops.generate(8, seed=1, split=2)
    assert a[4:] == listops.generate(4, seed=1, split=2, start=4)
    assert a != listops.generate(8, seed=2, split=2)
    # An excluded expression is replaced by a fresh draw of the same index.
    b = listops.generate(8, seed=1, split=2, exclude=[a[3][0]])
    assert b[3] != a[3] and b[:3] == a[:3] and b[4:] == a[4:]
    assert listops.evaluate(b[3][0]) == b[3][1]


def test_encode_decode_and_vocab():
    assert len(listops.LISTOPS_VOCAB) == 16 and listops.LISTOPS_VOCAB[0] == "<pad>"
    expr = "[SM 1 [MIN 3 0 ] ]"
    ids = listops.encode_listops(expr)
    assert all(1 <= i <= 15 for i in ids)
    assert listops.decode_listops(ids + [0, 0]) == expr
    with pytest.raises(ValueError, match="unknown ListOps token"):
        listops.encode_listops("[SUM 1 2 ]")


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: listops.generate(-1), "n must be"),
        (lambda: listops.generate(2, seed=-1), "seed must be"),
        (lambda: listops.generate(True), "n must be an int >= 0, got True"),  # (generated one expression)
        (lambda: listops.generate(2, seed=2.0), "seed must be an int >= 0, got 2.0"),
        (lambda: listops.evaluate("[MAX 1 2"), "closing"),
        (lambda: listops.evaluate("[MAX 1 2 ] 3"), "trailing"),
        (lambda: lra_dataset.build_listops_dataset(n_train=-2), "n_train"),
        (lambda: lra_dataset.build_pathfinder_dataset(48, 2, 2, 2), "resolution 48"),
        (lambda: lra_dataset.build_pathfinder_dataset(32, 2, 2, 2, num_proc=0), "num_proc"),
        (
            lambda: lra_dataset.build_listops_dataset(2, 2, 2, chunk_size=True),
            "chunk_size must be an int >= 1",
        ),
        (lambda: lra_dataset.build_listops_dataset(2, 2, 2, seed=True), "seed must be an int >= 0, got True"),
    ],
)
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_listops_dataset_splits_cache_and_no_overlap(tmp_path, monkeypatch):
    dd = lra_dataset.build_listops_dataset(30, 6, 6, seed=0, num_proc=2, cache_dir=tmp_path, chunk_size=7)
    assert {k: len(v) for k, v in dd.items()} == {"train": 30, "validation": 6, "test": 6}
    exprs = {}
    for split, ds in dd.items():
        exprs[split] = [lra_dataset.decode_listops(t) for t in ds["tokens"]]
        for expr, label in zip(exprs[split], ds["label"], strict=True):
            assert _stack_eval(expr) == label
    everything = sum(exprs.values(), [])
    assert len(set(everything)) == len(everything)
    # The train split equals the generator's output, whatever the chunking and process count.
    assert exprs["train"] == [e for e, _ in listops.generate(30, seed=0, split=0)]
    # A second call loads the saved splits instead of generating.
    monkeypatch.setattr(listops, "generate_raw", lambda *a, **k: pytest.fail("regenerated a cached split"))
    again = lra_dataset.build_listops_dataset(30, 6, 6, seed=0, num_proc=1, cache_dir=tmp_path)
    assert list(again["test"]["label"]) == list(dd["test"]["label"])


def test_pathfinder_dataset_splits_and_cache(tmp_path, monkeypatch):
    dd = lra_dataset.build_pathfinder_dataset(
        32, 6, 4, 4, seed=2, num_proc=2, cache_dir=tmp_path, chunk_size=2
    )
    assert {k: len(v) for k, v in dd.items()} == {"train": 6, "validation": 4, "test": 4}
    for split_id, split in enumerate(lra_dataset.SPLITS):
        pixels = np.asarray(dd[split]["pixels"], dtype=np.uint8)
        assert pixels.shape == (len(dd[split]), 32 * 32)
        images, labels = pf.generate(len(dd[split]), 32, seed=2, split=split_id)
        np.testing.assert_array_equal(pixels.reshape(-1, 32, 32), images)  # (N, H*H) -> (N, H, W)
        assert list(dd[split]["label"]) == labels.tolist()
        assert sum(dd[split]["label"]) == len(dd[split]) // 2
    monkeypatch.setattr(pf, "generate", lambda *a, **k: pytest.fail("regenerated a cached split"))
    again = lra_dataset.build_pathfinder_dataset(32, 6, 4, 4, seed=2, num_proc=1, cache_dir=tmp_path)
    assert list(again["train"]["label"]) == list(dd["train"]["label"])
