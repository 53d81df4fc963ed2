"""`kernels._grad_sums`: `sum_head_groups` (the GQA route's dK / dV summed per kv head) equal to torch's sum
in fp32 over each group of heads, into plain and strided (packed QKV) outputs, at odd lengths and head dims;
`sum_key_groups` (the ordered backward's dq buffers) equal to torch's sum of the groups in order with the
rows it skips zeroed, never reading them; their refusals; the kernel's sm_90 build; bf16 at realistic sizes
on the GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kernels._grad_sums import sum_head_groups, sum_key_groups

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


def _key_groups_reference(buffers, out_shape, groups_written, first_row_step, dtype):
    """torch's sum of the groups in order, the rows sum_key_groups skips zeroed first (as the ordered
    backward stored zeros there until session 86)."""
    per_group = buffers.clone().view(-1, *out_shape)
    per_group[groups_written:] = 0
    for g in range(1, groups_written):
        per_group[g, :, : g * first_row_step] = 0
    total = per_group[0]
    for g in range(1, per_group.shape[0]):
        total = total + per_group[g]
    return total.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "batch, seqlen, heads, headdim, groups, written, step",
    [(1, 40, 2, 16, 1, 1, 0), (2, 40, 2, 16, 1, 1, 32), (2, 33, 3, 64, 2, 2, 0), (1, 50, 2, 128, 2, 2, 16),
     (2, 30, 1, 40, 3, 3, 8), (1, 30, 2, 32, 3, 2, 16), (1, 30, 2, 32, 3, 1, 0), (1, 20, 1, 16, 2, 2, 20),
     (1, 20, 1, 16, 4, 3, 9)],
)  # fmt: skip
@pytest.mark.parametrize("packed", [False, True])
def test_sums_key_groups_in_order_skipping_unwritten_rows(
    batch, seqlen, heads, headdim, groups, written, step, dtype, packed, device
):
    """dq is the key groups' buffers added in order in fp32 and rounded once, where group g's rows before
    position g * step and groups from `written` on count as zeros: they hold NaN here and none shows. Into a
    fresh tensor or a packed gradient's view (strided heads and tokens), the buffer's other heads untouched;
    one group (a copy), full attention (step 0), the last group partial or empty (step past the length)."""
    torch.manual_seed(seqlen * groups + written + step + headdim)
    buffers = torch.randn(groups * batch, seqlen, heads, headdim, device=device) * 100
    expected = _key_groups_reference(buffers, (batch, seqlen, heads, headdim), written, step, dtype)
    per_group = buffers.view(groups, batch, seqlen, heads, headdim)
    per_group[written:] = float("nan")
    for g in range(1, written):
        per_group[g, :, : g * step] = float("nan")
    if packed:
        buffer = torch.full((batch, seqlen, heads + 3, headdim), 7.0, dtype=dtype, device=device)
        out = buffer[:, :, 2 : 2 + heads]
    else:
        out = torch.empty(batch, seqlen, heads, headdim, dtype=dtype, device=device)
    assert sum_key_groups(buffers, out, written, step) is out
    assert torch.equal(out, expected)
    if packed:
        assert torch.all(buffer[:, :, :2] == 7) and torch.all(buffer[:, :, 2 + heads :] == 7)


@pytest.mark.parametrize(
    "buffers_shape, out_shape, written, step, change",
    [((2, 8, 2, 16), (1, 8, 2, 16), 3, 0, None), ((2, 8, 2, 16), (1, 8, 2, 16), 0, 0, None),
     ((2, 8, 2, 16), (1, 8, 2, 16), 1, -1, None), ((3, 8, 2, 16), (2, 8, 2, 16), 1, 0, None),
     ((2, 8, 2, 16), (1, 9, 2, 16), 1, 0, None), ((2, 8, 2, 16), (1, 8, 2, 32), 1, 0, None),
     ((2, 8, 2, 16), (1, 8, 2, 16), 1, 0, "half buffers"), ((2, 8, 2, 16), (1, 8, 2, 16), 1, 0, "strided out"),
     ((2, 8, 2, 16), (1, 8, 2, 16), 1, 0, "strided buffers"), ((2, 8, 32), (1, 8, 2, 16), 1, 0, None)],
)  # fmt: skip
def test_key_groups_refuses_what_it_cannot_sum(buffers_shape, out_shape, written, step, change, device):
    """More groups written than there are, none, a negative step, a batch the buffers do not repeat, other
    lengths or head dims, buffers not fp32 or not contiguous, an out without a unit last stride, a 3-D
    buffer: one ValueError naming what it takes."""
    dtype = torch.float16 if change == "half buffers" else torch.float32
    buffers = torch.zeros(buffers_shape, device=device, dtype=dtype)
    out = torch.zeros(out_shape, device=device)
    if change == "strided out":
        out = torch.zeros(*out_shape[:3], 2 * out_shape[3], device=device)[..., ::2]
    if change == "strided buffers":
        buffers = torch.zeros(*buffers_shape[:3], 2 * buffers_shape[3], device=device)[..., ::2]
    with pytest.raises(ValueError, match="sum_key_groups sums a contiguous fp32"):
        sum_key_groups(buffers, out, written, step)


BUILD = """
import torch
from benchmarks.check_kernel_builds import compile_kernel
from kernels._grad_sums import _sum_grad_groups
for dtype in (torch.bfloat16, torch.float16):
    heads, out = torch.zeros(2, 100, 8, 128, dtype=dtype), torch.zeros(2, 100, 2, 128, dtype=dtype)
    compiled = compile_kernel(_sum_grad_groups, [heads, out, 400, 2, 100, *out.stride()[:3], 512, 128, 0],
                              dict(TERMS=4, SKIPS=False, HEAD_DIM=128, BLOCK_D=128, BLOCK_ROWS=32, num_warps=4))
    print(dtype, compiled.metadata.num_warps)
    buffers = torch.zeros(3, 100, 2, 128)
    compiled = compile_kernel(_sum_grad_groups,
                              [buffers, out, 200, 2, 100, *out.stride()[:3], 128, out.numel(), 48],
                              dict(TERMS=3, SKIPS=True, HEAD_DIM=128, BLOCK_D=128, BLOCK_ROWS=32, num_warps=4))
    print(dtype, compiled.metadata.num_warps)
"""


@pytest.mark.slow
def test_builds_for_sm90():
    """The kernel compiles for sm_90 with Triton's own compiler on CPU (bf16 and fp16, summing heads and
    summing key groups with rows skipped), as a GPU launch would."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (this process compiles)
    proc = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch.bfloat16", "4"] * 2 + ["torch.float16", "4"] * 2


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


@pytest.mark.gpu
@pytest.mark.parametrize("groups, written, step", [(1, 1, 0), (2, 2, 8192), (2, 2, 0), (3, 2, 4096)])
def test_gpu_key_groups_bf16_at_the_ordered_backwards_size(groups, written, step):
    """bf16 at the ordered backward's dq of 16k tokens x 16 heads of 128 (its bf16 path, which the interpreter
    does not run): bitwise torch's sum of the zeroed buffers in order, the skipped rows NaN."""
    torch.manual_seed(groups * 10 + written)
    buffers = torch.randn(groups, 16384, 16, 128, device="cuda") * 1e3
    expected = _key_groups_reference(buffers, (1, 16384, 16, 128), written, step, torch.bfloat16)
    buffers[written:] = float("nan")
    for g in range(1, written):
        buffers[g, : g * step] = float("nan")
    out = torch.empty(1, 16384, 16, 128, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(sum_key_groups(buffers, out, written, step), expected)
