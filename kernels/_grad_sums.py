"""Gradients summed over groups in one pass, in fp32 in a fixed order, rounded once:

- each kv head's dK / dV as the sum of its query heads' (the backward's GQA route run as MHA, `_flash_bwd`):
  torch.sum over the middle dim of a (.., kv heads, repeat, d) view ran at 2.43 TB/s for a repeat of 4 and
  1.45 TB/s for 2, against 4.1 TB/s for a copy of the same bytes (one H200, results/s77/call8): 28-44 µs a
  tensor lost at 4k tokens x 4 of 32 heads of 128. This kernel: 4.05-4.09 TB/s (repeat 4) and 3.80 (repeat
  2) at 32 rows a program, bitwise torch.sum's result; the route's fwd+bwd 0.984 / 0.982x the time at 32
  query heads on 8, causal / full 4k (results/s78/call1, then `bench_grad_sums.py`);
- dq as the sum of the ordered one-kernel backward's key groups' fp32 buffers
  (`_flash_bwd_fused_hopper.sum_dq_buffers`): torch's elementwise adds of whole buffers read every row of
  every buffer, also the rows no program of a key group writes (zeros that had to be stored first); this
  pass skips them (causal: the queries before a group's first key), and adds a term's rows only where
  they were written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, cdiv, padded_head_dim
from ._launch import CompiledLaunch


@triton.jit
def _sum_grad_groups(
    SRC, DST, rows, nheads_out, seqlen, stride_db, stride_dn, stride_dh, row_stride, term_stride, first_row_step,
    TERMS: tl.constexpr, SKIPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):  # fmt: skip
    """DST row r (of the B * N * nheads_out rows of (B, N, nheads_out, HEAD_DIM), unit last stride) = the
    TERMS rows SRC[r * row_stride + i * term_stride], i < TERMS (each HEAD_DIM contiguous elements), added in
    fp32 in that order from term 0 on and rounded once. With SKIPS, term i > 0 counts as zeros (is not read)
    at sequence positions n < i * first_row_step. A program sums BLOCK_ROWS output rows."""
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    col = tl.arange(0, BLOCK_D)
    mask = (row < rows)[:, None] & (col < HEAD_DIM)[None, :]
    row = row.to(tl.int64)  # (offsets past 2**31 elements)
    token = row // nheads_out
    position = token % seqlen
    term = SRC + (row * row_stride)[:, None] + col[None, :]
    # (from term 0 on, as torch adds: -0.0 terms give its sign of zero too)
    acc = tl.load(term, mask=mask, other=0.0).to(tl.float32)
    for i in tl.static_range(1, TERMS):
        term += term_stride  # (a step at a time: i * term_stride may pass 2**31)
        term_mask = mask
        if SKIPS:
            term_mask = mask & (position >= i * first_row_step)[:, None]
        acc += tl.load(term, mask=term_mask, other=0.0).to(tl.float32)
    head = row % nheads_out
    dst = (
        DST + (token // seqlen * stride_db + position * stride_dn + head * stride_dh)[:, None] + col[None, :]
    )
    tl.store(dst, acc.to(DST.dtype.element_ty), mask=mask)


_launch_sums = CompiledLaunch(_sum_grad_groups)
# output rows a program sums on a GPU (the interpreter takes 16): 16-64 ran level, 128 at a twelfth of the
# speed with a repeat of 4 (one H200, benchmarks/bench_grad_sums.py, results/s78/call1)
BLOCK_ROWS = 32


def _launch(src: torch.Tensor, out: torch.Tensor, row_stride: int, term_stride: int, terms: int,
            first_row_step: int = 0) -> torch.Tensor:  # fmt: skip
    batch, seqlen, nheads_out, headdim = out.shape
    rows = batch * seqlen * nheads_out
    block_rows = 16 if INTERPRET else BLOCK_ROWS
    _launch_sums(
        (cdiv(rows, block_rows),),
        (),
        (src, out, rows, nheads_out, seqlen, *out.stride()[:3], row_stride, term_stride, first_row_step),
        dict(TERMS=terms, SKIPS=first_row_step > 0, HEAD_DIM=headdim, BLOCK_D=padded_head_dim(headdim),
             BLOCK_ROWS=block_rows, num_warps=4),
    )  # fmt: skip
    return out


def _check_out(name: str, what: str, src: torch.Tensor, out: torch.Tensor, ok: bool, also: str = "") -> None:
    if not (
        ok and src.is_contiguous() and out.dim() == 4 and out.stride(-1) == 1 and src.device == out.device
    ):
        raise ValueError(
            f"{name} sums a contiguous {what} tensor into (batch, seqlen, h, d) on its device with a unit last "
            f"stride{also}; got {tuple(src.shape)} {src.dtype} {src.device} (contiguous: {src.is_contiguous()}) "
            f"into {tuple(out.shape)} {out.dtype} {out.device} strides {out.stride()}"
        )


def sum_head_groups(heads: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[b, n, h] = the sum of heads[b, n, h * r + i] over i < r, r = heads' head count / out's, added in
    fp32 in a fixed order and rounded once to out's dtype (as `torch.sum(heads.view(.., h, r, d), -2)`).
    heads: contiguous (batch, seqlen, h * r, headdim); out: (batch, seqlen, h, headdim), any strides with a
    unit last one (a packed QKV gradient's view). Returns out."""
    ok = (
        heads.dim() == 4
        and out.dim() == 4
        and heads.shape[:2] == out.shape[:2]
        and heads.shape[3] == out.shape[3]
        and heads.shape[2] % out.shape[2] == 0
        and heads.dtype == out.dtype
    )
    _check_out("sum_head_groups", "(batch, seqlen, h * r, d)", heads, out, ok, ", of the same dtype")
    repeat, headdim = heads.shape[2] // out.shape[2], out.shape[3]
    return _launch(heads, out, repeat * headdim, headdim, repeat)


def sum_key_groups(buffers: torch.Tensor, out: torch.Tensor, groups_written: int, first_row_step: int = 0):
    """out = buffers.view(groups, *out.shape)[0] + [1] + ... + [groups_written - 1], added in fp32 in that
    order and rounded once to out's dtype, where group g's rows at sequence positions under g *
    first_row_step (0: none) count as zeros and are not read, nor are groups from groups_written on (their
    contents may be anything). buffers: contiguous fp32 (groups x batch, seqlen, h, d); out: (batch,
    seqlen, h, d) with a unit last stride. Returns out."""
    groups = buffers.shape[0] // max(out.shape[0], 1) if buffers.dim() == 4 else 0
    ok = (
        buffers.dim() == 4
        and out.dim() == 4
        and buffers.shape[0] == groups * out.shape[0]
        and buffers.shape[1:] == out.shape[1:]
        and buffers.dtype == torch.float32
        and 1 <= groups_written <= groups
        and first_row_step >= 0
    )
    _check_out(
        "sum_key_groups", "fp32 (groups x batch, seqlen, h, d)", buffers, out, ok,
        f", groups_written from 1 to groups and first_row_step at least 0 (got {groups_written}, {first_row_step})",
    )  # fmt: skip
    return _launch(buffers, out, out.shape[3], out.numel(), groups_written, first_row_step)
