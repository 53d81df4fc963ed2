"""`kernels._dq_tail` (the ordered one-kernel backward's dq, written in the kernel's tail): the key groups'
buffers summed in order and rounded once, bitwise the pass it replaces, waiting on each item's semaphores
for exactly the adds the backward's programs make; its refusals; its sm_90 build. On the GPU the kernel
runs behind the backward itself (`tests/kernels/test_flash_bwd_fused_hopper.py`)."""

from __future__ import annotations

import pytest
import torch

from kernels import _dq_tail as dq_tail
from kernels import _flash_bwd_fused_hopper as fused_hopper


def _program_tiles(seqlen_q: int, seqlen_k: int, keys: int, block_m: int, causal: bool) -> list[range]:
    """The query tiles each program of a head walks: `_flash_dkdv_hopper.dense_program`'s lo .. hi - 1."""
    hi = -(-seqlen_q // block_m)
    tiles = []
    for j in range(-(-seqlen_k // keys)):
        lo = min(max(j * keys - (seqlen_k - seqlen_q), 0) // block_m, hi) if causal else 0
        tiles.append(range(lo, hi))
    return tiles


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, key_groups, keys, block_m",
    [(1000, 1000, 1, 128, 64), (16384, 16384, 2, 128, 64), (16640, 16640, 2, 128, 64), (1000, 1000, 3, 128, 64),
     (640, 640, 3, 128, 64), (300, 300, 2, 128, 64), (4100, 6000, 1, 128, 64), (6000, 4100, 2, 128, 64),
     (17, 17, 1, 64, 32)],
)  # fmt: skip
def test_item_adds_counts_the_programs_that_walk_each_tile(
    seqlen_q, seqlen_k, key_groups, keys, block_m, causal
):
    """Per key group and query tile, `item_adds` is the number of that group's programs whose walk
    (`dense_program`'s lo .. hi) holds the tile: every program with full attention, causal those whose first
    key's diagonal is at or before the tile's last row. Where it is 0 (causal, a key group past the first),
    `dq_buffer` zeroes the rows, since no first store comes."""
    programs = _program_tiles(seqlen_q, seqlen_k, keys, block_m, causal)
    per_group = -(-len(programs) // key_groups)
    for g in range(key_groups):
        group = programs[g * per_group : (g + 1) * per_group]
        for t in range(-(-seqlen_q // block_m)):
            want = sum(t in walk for walk in group)
            got = dq_tail.item_adds(
                t, g, per_group, len(programs), seqlen_k - seqlen_q, causal, block_m, keys
            )
            assert got == want, (g, t)
    if keys == 128 and block_m == 64 and seqlen_q == seqlen_k:  # (`dq_buffer`'s own program shape)
        buffer = fused_hopper.dq_buffer(torch.empty(1, seqlen_q, 1, 1), seqlen_k, causal, key_groups, True)
        for g in range(1, key_groups):
            for t in range(-(-seqlen_q // block_m)):
                rows = buffer[g, t * block_m : (t + 1) * block_m]
                if dq_tail.item_adds(t, g, per_group, len(programs), 0, causal, block_m, keys) == 0:
                    assert not rows.any(), (g, t)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "batch, seqlen, nheads, headdim, key_groups, causal, seqlen_k",
    [(1, 1, 1, 16, 1, False, 1), (2, 97, 3, 40, 2, True, 97), (1, 130, 2, 128, 3, True, 130),
     (2, 65, 1, 80, 2, False, 200), (1, 64, 2, 64, 1, True, 64)],
)  # fmt: skip
@pytest.mark.parametrize("packed", [False, True])
def test_sums_key_groups_in_order_once_each_item_is_counted(
    batch, seqlen, nheads, headdim, key_groups, causal, seqlen_k, dtype, packed, device
):
    """dq is the key groups' fp32 buffers added in group order and rounded once (the pass it replaces: bit
    for bit), into a fresh tensor or a view of a packed QKV gradient (strided heads and tokens, its other
    heads untouched), with each item's two semaphores already counting `item_adds` (so every wait ends)."""
    torch.manual_seed(seqlen * 7 + headdim + key_groups)
    keys, block_m = 64, 32
    acc = torch.randn(key_groups * batch, seqlen, nheads, headdim, device=device) * 1e3
    acc[0, 0, 0, :3] = -0.0  # (a negative zero plus later groups' zeros: the same sign as the pass's)
    if packed:
        buffer = torch.full((batch, seqlen, nheads + 2, headdim), 7.0, dtype=dtype, device=device)
        dq = buffer[:, :, 1 : 1 + nheads]
    else:
        dq = torch.full((batch, seqlen, nheads, headdim), float("nan"), dtype=dtype, device=device)
    n_tiles = -(-seqlen // block_m)
    programs = -(-seqlen_k // keys)
    per_group = -(-programs // key_groups)
    sems = torch.zeros(key_groups * batch, nheads, n_tiles, 2, dtype=torch.int32, device=device)
    for g in range(key_groups):
        for t in range(n_tiles):
            adds = dq_tail.item_adds(t, g, per_group, programs, seqlen_k - seqlen, causal, block_m, keys)
            sems[g * batch : (g + 1) * batch, :, t] = adds
    out = dq_tail.dq_from_key_groups(
        acc, dq, key_groups, sems=sems, causal=causal, seqlen_k=seqlen_k, keys=keys, block_m=block_m
    )
    assert out is dq
    per_group_acc = acc.view(key_groups, batch, seqlen, nheads, headdim)
    total = per_group_acc[0]
    for g in range(1, key_groups):
        total = total + per_group_acc[g]
    assert torch.equal(dq, total.to(dtype))
    if packed:
        assert torch.all(buffer[:, :, 0] == 7) and torch.all(buffer[:, :, 1 + nheads :] == 7)


@pytest.mark.parametrize(
    "change, match",
    [("half buffer", "contiguous fp32"), ("strided buffer", "contiguous fp32"), ("groups", "contiguous fp32"),
     ("strided dq", "unit last stride"), ("sems", "sems must be"), ("pdl", "sm_90 only")],
)  # fmt: skip
def test_refuses_what_it_cannot_convert(change, match, device):
    """A buffer not contiguous fp32 of key_groups x batch rows, a dq without a unit last stride, semaphores
    of another shape, or a dependent launch off a Hopper GPU: one ValueError naming what it takes."""
    acc = torch.zeros(2, 8, 2, 16, device=device)
    dq = torch.zeros(1, 8, 2, 16, dtype=torch.float16, device=device)
    sems, pdl, key_groups = None, False, 2
    if change == "half buffer":
        acc = acc.half()
    elif change == "strided buffer":
        acc = torch.zeros(2, 8, 2, 32, device=device)[..., ::2]
    elif change == "groups":
        key_groups = 3
    elif change == "strided dq":
        dq = torch.zeros(1, 8, 2, 32, dtype=torch.float16, device=device)[..., ::2]
    elif change == "sems":
        sems = torch.zeros(2, 2, 2, 2, dtype=torch.int32, device=device)
    else:
        pdl = not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9
        if not pdl:
            pytest.skip("a Hopper GPU takes pdl=True")
    with pytest.raises(ValueError, match=match):
        dq_tail.dq_from_key_groups(acc, dq, key_groups, sems=sems, block_m=64, pdl=pdl)


@pytest.mark.parametrize("ordered, sparse", [(False, False), (True, True)])
def test_the_backward_writes_dq_in_its_tail_only_when_ordered_and_dense(ordered, sparse):
    """dq_out asked of an unordered call (no semaphores to wait on) or a block-sparse one (its items' add
    counts are its lists'): a ValueError before any launch."""
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    lists = (q, q, q) if sparse else None
    with pytest.raises(ValueError, match="dq_out converts each dq item"):
        fused_hopper.flash_attn_bwd_fused_hopper(
            q,
            q,
            q,
            q,
            None,
            None,
            None,
            q,
            q,
            sm_scale=1.0,
            causal=False,
            ordered=ordered,
            lists=lists,
            dq_out=q,
        )


BUILD = """
import torch
from benchmarks.check_kernel_builds import compile_kernel
from kernels._dq_tail import _dq_tail
for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        acc, dq = torch.zeros(4, 1000, 4, 128), torch.zeros(2, 1000, 4, 128, dtype=dtype)
        sems = torch.zeros(4, 4, 16, 2, dtype=torch.int32)
        compiled = compile_kernel(_dq_tail, [acc, sems, dq, 2, 4, 1000, 16, 128, 4, 8, 0, *acc.stride()[:3],
                                  *dq.stride()[:3]],
                                  dict(KEY_GROUPS=2, CAUSAL=causal, KEYS=128, BLOCK_M=64, HEAD_DIM=128, BLOCK_D=128,
                                       WAIT=True, PDL=True, num_warps=4, launch_pdl=True))
        ptx = compiled.asm["ptx"]
        # (Triton lowers an atomic add of 0 to a load with the same acquire semantics)
        acquires = ptx.count("ld.global.gpu.acquire") + ptx.count("atom.acquire.gpu")
        assert "griddepcontrol.wait" in ptx and acquires >= 4, ptx[:2000]
        print(dtype, causal, compiled.metadata.shared)
"""


@pytest.mark.slow
def test_builds_for_sm90():
    """The kernel compiles for sm_90 with Triton's own compiler on CPU (bf16 and fp16, causal and full), with
    its semaphore reads (two key groups' two halves) as GPU-scope acquires and its closing
    `griddepcontrol.wait`."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", BUILD], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("torch.") == 4
