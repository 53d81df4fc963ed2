"""The cross-rank check of one sequence-parallel attention call: every rank must pass the same shapes
and options, or the ring waits forever for a transfer that never comes (a different `causal` or
`layout` changes which steps transfer) or the ranks compute with different masks (window, scale,
dropout, documents, block layout) and nothing says so.

`check_same_call` encodes what must agree as a small int64 vector, gathers it from every rank in one
nested all-gather (the call's first collective) and raises the same ValueError on every rank when
they differ. Ring attention, Ulysses and the hybrid call it before anything else.
"""

from __future__ import annotations

import functools
import numbers
import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels._common import check_causal, check_dropout, check_window, resolve_softmax_scale

from .sharding import LAYOUTS, check_layout

_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_NONE, _INVALID = -1, -2  # codes of an option left at None, and of a value its local check refuses


@dataclass(frozen=True)
class _Field:
    """One thing every rank of a call must agree on, as int64 codes. A part is a host list, or (for a
    fingerprint of a tensor on an accelerator) a 1-D tensor reduced where it lives: reading it on the
    host would add a sync."""

    name: str
    parts: tuple  # of list[int] | torch.Tensor
    show: Callable[[tuple], str]  # one rank's codes -> what that rank passed, for the error
    hint: str = "pass the same value on every rank"
    compare: bool = True  # False: carried along (a rank's own dropout draw), not checked

    @property
    def width(self) -> int:
        return sum(len(p) for p in self.parts)


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(code: int) -> float:
    return struct.unpack("<d", struct.pack("<q", code))[0]


def _shape_field(tensors: list[torch.Tensor], names: str) -> _Field:
    code = []
    for t in tensors:
        dims = list(t.shape)[:6]
        code += [
            t.dim(),
            _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1,
            *dims,
            *[-1] * (6 - len(dims)),
        ]

    def show(c: tuple) -> str:
        shown = []
        for name, i in zip(names.split(", "), range(0, len(c), 8), strict=False):
            dtype = str(_DTYPES[c[i + 1]]).removeprefix("torch.") if c[i + 1] >= 0 else "other dtype"
            shown.append(f"{name} {dtype} {tuple(c[i + 2 : i + 2 + min(c[i], 6)])}")
        return "(" + ", ".join(shown) + ")"

    hint = "every rank must hold an equal-length shard of the same sequence, in one dtype"
    return _Field(names, (code,), show, hint)


def _checked(check, value, encode, width: int) -> list[int]:
    """encode(check(value)), or _INVALID codes where the local check refuses the value: a rank with a
    bad option still reaches the all-gather, and the others do not wait for it in the ring."""
    try:
        return encode(check(value))
    except ValueError:
        return [_INVALID] * width


def _shown(decode) -> Callable[[tuple], str]:
    """A rank's codes as the value it passed: decode(codes), unless they mark None or a refused value."""
    return lambda c: {_NONE: "None", _INVALID: "an invalid value"}.get(c[0]) or decode(c)


def _window_codes(window: tuple[int | None, int | None]) -> list[int]:
    return [_NONE if w is None else w for w in window]  # None and (None, None) mean the same


def _show_window(c: tuple) -> str:
    return "an invalid value" if c[0] == _INVALID else str(tuple(None if w == _NONE else w for w in c))


def _seed_codes(dropout_seed) -> list[int]:
    """[_NONE, 0] for None (each rank draws), [1, seed] as `draw_dropout_seed` reads it, else _INVALID."""
    if dropout_seed is None:
        return [_NONE, 0]
    try:
        return [1, int(dropout_seed)]
    except (TypeError, ValueError):
        return [_INVALID, 0]


def _fingerprint(t: torch.Tensor, host: list[int], reduce) -> tuple:
    """(host codes, reduce(t)): the reduction stays where t lives, read on the host only for a CPU t."""
    sums = reduce(t)
    return (host, sums.tolist() if sums.device.type == "cpu" else sums)


def _cu_seqlens_field(cu_seqlens) -> _Field:
    """The document boundaries by (count, sum, position-weighted sum): cheap, and tells apart different
    cuts of the same sequence into the same number of documents."""

    def sums(cu: torch.Tensor) -> torch.Tensor:
        x = cu.reshape(-1).to(torch.int64)
        weights = torch.arange(1, x.numel() + 1, device=x.device)
        return torch.stack([x.sum(), (x * weights).sum()])

    if cu_seqlens is None or not isinstance(cu_seqlens, torch.Tensor):
        parts = ([_NONE if cu_seqlens is None else _INVALID] * 3,)
    else:
        parts = _fingerprint(cu_seqlens, [cu_seqlens.numel()], sums)

    show = _shown(lambda c: f"{c[0]} boundaries (sum {c[1]}, position-weighted sum {c[2]})")
    return _Field(
        "cu_seqlens", parts, show, "pass the same cu_seqlens, over the global sequence, on every rank"
    )


def _block_layout_field(block_layout) -> _Field:
    """The layout's dtype and shape, and its kept tiles: per head, row and column counts weighted by
    position (reductions of the bool tensor, no int64 copy of it; cheap beside one attention call)."""

    def sums(layout: torch.Tensor) -> torch.Tensor:
        kept = layout if layout.dtype == torch.bool else layout != 0
        rows = kept.sum(2, dtype=torch.int64).reshape(-1)  # (H * nb,) kept tiles per row block
        cols = kept.sum(1, dtype=torch.int64).reshape(-1)  # (H * nb,) kept tiles per column block
        weights = torch.arange(1, rows.numel() + 1, device=layout.device)
        return torch.stack([rows.sum(), (rows * weights).sum(), (cols * weights).sum()])

    if block_layout is None or not isinstance(block_layout, torch.Tensor):
        parts = ([_NONE if block_layout is None else _INVALID] * 7,)
    elif block_layout.dim() != 3:  # refused by `mask_tensors` on every rank that has it
        parts = ([block_layout.dim(), *[_INVALID] * 6],)
    else:
        host = [3, int(block_layout.dtype == torch.bool), *block_layout.shape]
        parts = _fingerprint(block_layout, host, sums)

    def show(c: tuple) -> str:
        if c[0] != 3:
            return f"a {c[0]}-D tensor"
        dtype = "bool" if c[1] else "not bool"
        return f"{dtype} {tuple(c[2:5])} with {c[5]} tiles kept (fingerprint {c[6]}, {c[7]})"

    return _Field(
        "block_layout",
        parts,
        _shown(show),
        "pass the same block_layout, over the global sequence, on every rank",
    )


def _call_fields(
    tensors, names, *, causal, layout, window, softmax_scale, dropout_p, dropout_seed, cu_seqlens,
    block_layout, block_size,
) -> list[_Field]:  # fmt: skip
    """What every rank must share, in one order on every rank."""
    headdim = tensors[0].shape[-1] if tensors[0].dim() else 1
    seed = _seed_codes(dropout_seed) if dropout_p != 0.0 else [_NONE, 0]  # no dropout: no mask to share
    drawn = draw_dropout_seed(dropout_p, None) if dropout_seed is None else 0  # as every rank did before
    size_ok = isinstance(block_size, numbers.Integral) and not isinstance(block_size, bool)
    show_float = _shown(lambda c: repr(_bits_float(c[1])))
    return [
        _shape_field(tensors, names),
        _Field("causal", (_checked(check_causal, causal, lambda c: [int(c)], 1),), _shown(lambda c: str(bool(c[0])))),
        _Field("layout", (_checked(check_layout, layout, lambda s: [LAYOUTS.index(s)], 1),),
               _shown(lambda c: repr(LAYOUTS[c[0]]))),
        _Field("window", (_checked(check_window, window, _window_codes, 2),), _show_window),
        _Field("softmax_scale",
               (_checked(functools.partial(resolve_softmax_scale, headdim=headdim), softmax_scale,
                         lambda x: [1, _float_bits(x)], 2),),
               show_float, "pass the same softmax_scale on every rank, None meaning 1/sqrt(headdim)"),
        _Field("dropout_p", (_checked(check_dropout, dropout_p, lambda x: [1, _float_bits(x)], 2),), show_float),
        _Field("dropout_seed", (seed,), _shown(lambda c: str(c[1])),
               "pass the same dropout_seed on every rank, or None on every rank to use the first rank's draw"),
        _Field("drawn dropout seed", ([drawn],), str, compare=False),
        _Field("block_size", ([block_size if size_ok else _NONE if block_size is None else _INVALID],),
               _shown(lambda c: str(c[0]))),
        _cu_seqlens_field(cu_seqlens),
        _block_layout_field(block_layout),
    ]  # fmt: skip


def _codes_vector(fields: list[_Field], device) -> torch.Tensor:
    """(1, k) int64 on `device`: every field's codes at the same offsets on every rank. One copy from
    the host, as before the options were checked (a blocking copy); the device parts are copied into
    their slots after it, on the device."""
    host, on_device = [], []
    for part in (p for f in fields for p in f.parts):
        if isinstance(part, torch.Tensor):
            on_device.append((len(host), part))
            host += [0] * len(part)
        else:
            host += part
    vec = torch.tensor(host, dtype=torch.int64, device=device)
    for offset, part in on_device:
        vec[offset : offset + len(part)] = part
    return vec[None]


def _gather_rows(vec: torch.Tensor, groups: list) -> list[tuple]:
    """Every rank's row of `vec` (1, k) across the product of `groups` (nested all-gathers, so a 2-D
    mesh is covered, every rank ending up with the rows in the same order). Blocks: a collective and a
    host-device sync."""
    for group in groups:
        if group is None:
            continue
        parts = [torch.empty_like(vec) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, vec.contiguous(), group=group)
        vec = torch.cat(parts)  # (ranks so far, k)
    return [tuple(r) for r in vec.tolist()]  # host-device sync


def _disagreement(field: _Field, values: list[tuple]) -> str:
    """'name: A on ranks 0, 2 vs B on rank 1 (hint)', ranks numbered in the gathered order."""
    ranks: dict[str, list[int]] = {}
    for r, c in enumerate(values):
        ranks.setdefault(field.show(c), []).append(r)
    seen = " vs ".join(
        f"{v} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}" for v, rs in ranks.items()
    )
    return f"{field.name}: {seen} ({field.hint})"


def check_same_call(
    tensors: list[torch.Tensor], groups: list, *, names: str = "q, k, v", causal, layout, window, softmax_scale,
    dropout_p, dropout_seed, cu_seqlens, block_layout, block_size,
) -> int | None:  # fmt: skip
    """Check that every rank across the product of `groups` passed the same shapes and options, and
    return the dropout seed to use: the one passed, or with None on every rank the first rank's draw
    (so the masks agree without seeding torch alike on every rank).

    One nested all-gather of a small int64 vector, the call's first collective: a rank that differs
    makes every rank raise the same ValueError, instead of some waiting in a P2P that never comes
    (a different causal or layout) or all computing with different masks (window, scale, dropout,
    documents, block layout). Values a local check would refuse are compared as "invalid", so one
    rank's bad option cannot leave the others waiting either. Blocks: a host-device sync.
    """
    fields = _call_fields(
        tensors, names, causal=causal, layout=layout, window=window, softmax_scale=softmax_scale,
        dropout_p=dropout_p, dropout_seed=dropout_seed, cu_seqlens=cu_seqlens, block_layout=block_layout,
        block_size=block_size,
    )  # fmt: skip
    rows = _gather_rows(_codes_vector(fields, tensors[0].device), groups)
    by_name, start = {}, 0
    for f in fields:
        by_name[f.name] = [r[start : start + f.width] for r in rows]  # every rank's codes of f
        start += f.width
    bad = [_disagreement(f, by_name[f.name]) for f in fields if f.compare and len(set(by_name[f.name])) > 1]
    if bad:
        raise ValueError(
            "the sequence-parallel ranks passed different arguments to one attention call, which would hang "
            "the ring or mix different masks: " + "; ".join(bad)
        )
    if dropout_seed is None:
        return by_name["drawn dropout seed"][0][0]
    return dropout_seed


def draw_dropout_seed(dropout_p: float, dropout_seed: int | None) -> int:
    """The seed passed, or this rank's own draw. Ranks must agree on it: `check_same_call` (validate=True)
    gives every rank the first rank's draw; without it, pass a seed or seed torch alike on every rank."""
    if dropout_p == 0.0:
        return 0
    if dropout_seed is not None:
        return int(dropout_seed)
    return int(torch.randint(0, 2**31 - 1, (1,)).item())  # CPU generator: no device sync
