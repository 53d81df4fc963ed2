"""Each kv head's dK / dV as the sum of its query heads' (the backward's GQA route run as MHA, `_flash_bwd`):
one pass over the per-head gradients at copy bandwidth. torch.sum over the middle dim of a (.., kv heads,
repeat, d) view ran at 2.43 TB/s for a repeat of 4 and 1.45 TB/s for 2, against 4.1 TB/s for a copy of the
same bytes (one H200, results/s77/call8): 28-44 µs a tensor lost at 4k tokens x 4 of 32 heads of 128. This
kernel: 4.05-4.09 TB/s (repeat 4) and 3.80 (repeat 2) at 32 rows a program, bitwise torch.sum's result; the
route's fwd+bwd 0.984 / 0.982x the time at 32 query heads on 8, causal / full 4k (results/s78/call1)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, cdiv, padded_head_dim
from ._launch import CompiledLaunch


@triton.jit
def _sum_head_groups(
    SRC, DST, rows, nheads_out, seqlen, stride_db, stride_dn, stride_dh,
    REPEAT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):  # fmt: skip
    """DST[b, n, h] = SRC[b, n, h * REPEAT] + ... + SRC[b, n, h * REPEAT + REPEAT - 1], added in fp32 in that
    order and rounded once. SRC is contiguous (B, N, nheads_out * REPEAT, HEAD_DIM); DST (B, N, nheads_out,
    HEAD_DIM) has a unit last stride. A program sums BLOCK_ROWS of the B * N * nheads_out output rows."""
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    col = tl.arange(0, BLOCK_D)
    mask = (row < rows)[:, None] & (col < HEAD_DIM)[None, :]
    row = row.to(tl.int64)  # (offsets past 2**31 elements)
    src = SRC + (row * (REPEAT * HEAD_DIM))[:, None] + col[None, :]
    acc = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    for i in tl.static_range(REPEAT):
        acc += tl.load(src + i * HEAD_DIM, mask=mask, other=0.0).to(tl.float32)
    head = row % nheads_out
    token = row // nheads_out
    dst = (
        DST
        + (token // seqlen * stride_db + token % seqlen * stride_dn + head * stride_dh)[:, None]
        + col[None, :]
    )
    tl.store(dst, acc.to(DST.dtype.element_ty), mask=mask)


_launch_sums = CompiledLaunch(_sum_head_groups)
# output rows a program sums on a GPU (the interpreter takes 16): 16-64 ran level, 128 at a twelfth of the
# speed with a repeat of 4 (one H200, benchmarks/bench_head_sums.py, results/s78/call1)
BLOCK_ROWS = 32


def sum_head_groups(heads: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[b, n, h] = the sum of heads[b, n, h * r + i] over i < r, r = heads' head count / out's, added in
    fp32 in a fixed order and rounded once to out's dtype (as `torch.sum(heads.view(.., h, r, d), -2)`).
    heads: contiguous (batch, seqlen, h * r, headdim); out: (batch, seqlen, h, headdim), any strides with a
    unit last one (a packed QKV gradient's view). Returns out."""
    batch, seqlen, nheads_out, headdim = out.shape
    if (
        not heads.is_contiguous()
        or heads.dim() != 4
        or heads.shape[:2] != out.shape[:2]
        or heads.shape[3] != headdim
        or heads.shape[2] % nheads_out
        or out.stride(-1) != 1
        or heads.dtype != out.dtype
        or heads.device != out.device
    ):
        raise ValueError(
            f"sum_head_groups sums a contiguous (batch, seqlen, h * r, d) tensor into (batch, seqlen, h, d) of "
            f"its dtype and device with a unit last stride; got {tuple(heads.shape)} {heads.dtype} "
            f"{heads.device} (contiguous: {heads.is_contiguous()}) into {tuple(out.shape)} {out.dtype} "
            f"{out.device} strides {out.stride()}"
        )
    rows = batch * seqlen * nheads_out
    block_rows = 16 if INTERPRET else BLOCK_ROWS
    _launch_sums(
        (cdiv(rows, block_rows),),
        (),
        (heads, out, rows, nheads_out, seqlen, *out.stride()[:3]),
        dict(REPEAT=heads.shape[2] // nheads_out, HEAD_DIM=headdim, BLOCK_D=padded_head_dim(headdim),
             BLOCK_ROWS=block_rows, num_warps=4),
    )  # fmt: skip
    return out
