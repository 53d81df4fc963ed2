"""ListOps expressions (Nangia & Bowman 2018) as generated for Long Range Arena.

An expression is a tree of operators over digits, written in prefix form with a closing bracket, e.g.
`[MAX 2 9 [MIN 4 7 ] 0 ]` -> 9. Operators: MIN, MAX, MED (median, rounded down as LRA's `int(np.median)`),
SM (sum mod 10). Trees follow LRA's sampler: below the maximum depth a node is a digit with probability
0.75, else an operator with 2..max_args arguments; trees outside min_length < tokens < max_length are
rejected, and a generated set holds no duplicates.

Expression `i` of a split is drawn from its own stream seeded by `(seed, split, i)`, so chunks generated in
different processes agree; duplicates are then replaced in index order (see `dedupe`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

import numpy as np

from data.lra._checks import check_int

__all__ = [
    "LISTOPS_VOCAB",
    "OPERATORS",
    "decode_listops",
    "encode_listops",
    "evaluate",
    "generate",
]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(d) for d in range(10))
# Token id 0 is padding; the 15 symbols follow.
LISTOPS_VOCAB = ("<pad>", *OPERATORS, END, *DIGITS)
_TOKEN_ID = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}

MAX_DEPTH = 10  # digits only at this depth
MAX_ARGS = 10
MIN_LENGTH = 500  # exclusive bounds on the number of tokens, as in LRA
MAX_LENGTH = 2000
_DIGIT_PROB = 0.75


class _TooLongError(Exception):
    pass


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        # LRA's int(np.median(args)); for non-negative ints the mean of the middle pair rounds down.
        mid = sorted(args)
        half = len(mid) // 2
        return mid[half] if len(mid) % 2 else (mid[half - 1] + mid[half]) // 2
    return sum(args) % 10  # [SM


def _tree(rng: random.Random, depth: int, out: list[str], max_length: int) -> int:
    """Append one random subtree's tokens to `out` and return its value."""
    if depth >= MAX_DEPTH or rng.random() < _DIGIT_PROB:
        d = int(rng.random() * 10)
        out.append(DIGITS[d])
        if len(out) >= max_length:
            raise _TooLongError
        return d
    op = OPERATORS[int(rng.random() * len(OPERATORS))]
    n_args = 2 + int(rng.random() * (MAX_ARGS - 1))  # uniform on 2..MAX_ARGS
    out.append(op)
    args = [_tree(rng, depth + 1, out, max_length) for _ in range(n_args)]
    out.append(END)
    if len(out) >= max_length:
        raise _TooLongError  # stop early: the tree is rejected anyway, and it may still be growing
    return _apply(op, args)


def _stream(seed: int, split: int, index: int, attempt: int) -> random.Random:
    # Python's Random draws ~20x faster than numpy Generator one scalar at a time; seeding it from a
    # SeedSequence keeps the per-index streams independent.
    state = np.random.SeedSequence([seed, split, index, attempt]).generate_state(4, np.uint32)
    return random.Random(int.from_bytes(state.tobytes(), "little"))


def sample(seed: int, split: int, index: int, attempt: int = 0) -> tuple[str, int]:
    """One expression of length in (MIN_LENGTH, MAX_LENGTH) tokens with its value."""
    rng = _stream(seed, split, index, attempt)
    while True:
        out: list[str] = []
        try:
            value = _tree(rng, 1, out, MAX_LENGTH)
        except _TooLongError:
            continue
        if len(out) > MIN_LENGTH:
            return " ".join(out), value


def _digest(expr: str) -> bytes:
    return hashlib.blake2b(expr.encode(), digest_size=16).digest()


def dedupe(items: list[tuple[str, int]], seed: int, split: int, start: int, seen: set[bytes]) -> list:
    """Replace, in index order, every expression already in `seen` (which is updated) by a fresh draw.

    The replacement for index i comes from attempts 1, 2, ... of its own stream, so the result depends only
    on (seed, split, the indices) and on what `seen` held before, never on how generation was chunked.
    """
    out = []
    for offset, (expr, value) in enumerate(items):
        attempt = 0
        while _digest(expr) in seen:
            attempt += 1
            expr, value = sample(seed, split, start + offset, attempt)
        seen.add(_digest(expr))
        out.append((expr, value))
    return out


def generate_raw(n: int, seed: int = 0, *, split: int = 0, start: int = 0) -> list[tuple[str, int]]:
    """Expressions `start .. start+n-1` before duplicate removal (the part that runs in worker processes)."""
    for name, v in (("n", n), ("seed", seed), ("split", split), ("start", start)):
        check_int(name, v)
    return [sample(seed, split, start + i) for i in range(n)]


def generate(
    n: int, seed: int = 0, *, split: int = 0, start: int = 0, exclude: Iterable[str] = ()
) -> list[tuple[str, int]]:
    """`n` distinct (expression, label) pairs; none equal to an expression in `exclude`.

    Expressions are written like LRA's source column: tokens separated by single spaces.
    """
    seen = {_digest(e) for e in exclude}
    return dedupe(generate_raw(n, seed, split=split, start=start), seed, split, start, seen)


def evaluate(expr: str) -> int:
    """Value of an expression, by recursion over its tokens."""
    tokens = expr.split()
    value, pos = _evaluate(tokens, 0)
    if pos != len(tokens):
        raise ValueError(f"trailing tokens after a complete expression at token {pos}: {expr[:80]!r}")
    return value


def _evaluate(tokens: list[str], pos: int) -> tuple[int, int]:
    if pos >= len(tokens):
        raise ValueError("expression ends early; every operator needs a closing ']'")
    tok = tokens[pos]
    if tok in DIGITS:
        return int(tok), pos + 1
    if tok not in OPERATORS:
        raise ValueError(f"unexpected token {tok!r} at {pos}; expected a digit or one of {OPERATORS}")
    args = []
    pos += 1
    while pos < len(tokens) and tokens[pos] != END:
        value, pos = _evaluate(tokens, pos)
        args.append(value)
    if pos >= len(tokens) or not args:
        raise ValueError(f"operator {tok} at token {pos} needs arguments and a closing ']'")
    return _apply(tok, args), pos + 1


def encode_listops(expr: str) -> list[int]:
    """Token ids (1..15) of an expression; 0 is left for padding."""
    try:
        return [_TOKEN_ID[t] for t in expr.split()]
    except KeyError as e:
        raise ValueError(
            f"unknown ListOps token {e.args[0]!r}; the vocabulary is {LISTOPS_VOCAB[1:]}"
        ) from None


def decode_listops(ids: Iterable[int]) -> str:
    """Inverse of `encode_listops`; padding ids are dropped."""
    return " ".join(LISTOPS_VOCAB[i] for i in ids if i != 0)
