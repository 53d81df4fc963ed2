"""`kernels._head_sums.sum_head_groups` (the GQA route's dK / dV summed per kv head): equal to torch's sum
in fp32 over each group of heads, into plain and strided (packed QKV) outputs, at odd lengths and head dims;
its refusals; its sm_90 build; bf16 at a realistic size on the GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kernels._head_sums import sum_head_groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _reference(heads: torch.Tensor, nheads_out: int) -> torch.Tensor:
    b, n, h, d = heads.shape
    return heads.view(b, n, nheads_out, h // nheads_out, d).double().sum(-2).to(heads.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "batch, seqlen, nheads_out, repeat, headdim",
    [(1, 1, 1, 2, 16), (2, 17, 2, 4, 40), (1, 33, 3, 3, 64), (2, 9, 1, 8, 128), (1, 5, 2, 2, 80)],
)
@pytest.mark.parametrize("packed", [False, True])
def test_sums_each_group_of_heads(batch, seqlen, nheads_out, repeat, headdim, dtype, packed, device):
    """Each output head is its repeat input heads' sum (fp32, rounded once), into a fresh tensor or a view
    of a packed buffer (strided heads and tokens), leaving the buffer's other heads untouched."""
    torch.manual_seed(batch * 1000 + seqlen + headdim + repeat)
    heads = torch.randn(batch, seqlen, nheads_out * repeat, headdim, dtype=dtype, device=device)
    if packed:
        buffer = torch.full((batch, seqlen, nheads_out + 3, headdim), 7.0, dtype=dtype, device=device)
        out = buffer[:, :, 1 : 1 + nheads_out]
    else:
        out = torch.empty(batch, seqlen, nheads_out, headdim, dtype=dtype, device=device)
    assert sum_head_groups(heads, out) is out
    torch.testing.assert_close(
        out, _reference(heads, nheads_out), rtol=0, atol=1e-3 if dtype == torch.float16 else 1e-6
    )
    if packed:
        assert torch.all(buffer[:, :, 0] == 7) and torch.all(buffer[:, :, 1 + nheads_out :] == 7)


@pytest.mark.parametrize(
    "heads_shape, out_shape, change",
    [((1, 8, 4, 16), (1, 8, 3, 16), None), ((1, 8, 4, 16), (1, 9, 2, 16), None), ((1, 8, 4, 16), (1, 8, 2, 32), None),
     ((1, 8, 4, 16), (1, 8, 2, 16), "dtype"), ((1, 8, 4, 16), (1, 8, 2, 16), "strided heads"),
     ((1, 8, 4, 16), (1, 8, 2, 16), "strided out")],
)  # fmt: skip
def test_refuses_what_it_cannot_sum(heads_shape, out_shape, change, device):
    """Heads not a multiple of out's, other lengths or head dims, another dtype, non-contiguous heads or an
    out without a unit last stride: one ValueError naming what it takes."""
    heads = torch.zeros(heads_shape, device=device)
    out = torch.zeros(out_shape, device=device, dtype=torch.float16 if change == "dtype" else torch.float32)
    if change == "strided heads":
        heads = torch.zeros(*heads_shape[:3], 2 * heads_shape[3], device=device)[..., ::2]
    if change == "strided out":
        out = torch.zeros(*out_shape[:3], 2 * out_shape[3], device=device)[..., ::2]
    with pytest.raises(ValueError, match="sum_head_groups sums a contiguous"):
        sum_head_groups(heads, out)


BUILD = """
import torch
from benchmarks.check_kernel_builds import compile_kernel
from kernels._head_sums import _sum_head_groups
for dtype in (torch.bfloat16, torch.float16):
    heads, out = torch.zeros(2, 100, 8, 128, dtype=dtype), torch.zeros(2, 100, 2, 128, dtype=dtype)
    compiled = compile_kernel(_sum_head_groups, [heads, out, 400, 2, 100, *out.stride()[:3]],
                              dict(REPEAT=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_ROWS=32, num_warps=4))
    print(dtype, compiled.metadata.num_warps)
"""


@pytest.mark.slow
def test_builds_for_sm90():
    """The kernel compiles for sm_90 with Triton's own compiler on CPU (bf16 and fp16), as a GPU launch would."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (this process compiles)
    proc = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch.bfloat16", "4", "torch.float16", "4"]


@pytest.mark.gpu
@pytest.mark.parametrize("repeat", [2, 4])
def test_gpu_bf16_at_a_routes_size(repeat):
    """bf16 at the size of the GQA route's dK at 4k tokens x 4 of 32 heads of 128 (its bf16 path, which the
    interpreter does not run): torch's fp32 sum of each group, rounded once."""
    torch.manual_seed(repeat)
    heads = torch.randn(4, 4096, 8 * repeat, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(4, 4096, 8, 128, dtype=torch.bfloat16, device="cuda")
    sum_head_groups(heads, out)
    torch.testing.assert_close(out.float(), _reference(heads, 8).float(), rtol=2**-7, atol=2**-7)
