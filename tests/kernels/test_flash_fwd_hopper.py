"""The Gluon Hopper forward (`kernels._flash_fwd_hopper`): which calls take it, that it builds (the
Hopper backward kernels' builds are checked here too), and (on an H100/H200) that it matches the float64
reference.

It never runs under Triton's interpreter (Gluon kernels do not), so on CPU its configs are built for
sm_90 with Triton's compiler (`benchmarks/check_hopper_builds.py`) and its dispatch rule is checked;
the GPU-marked tests run it in bf16 and fp16 on shapes that reach every edge of its schedule.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from kernels import _block_sparse_hopper as bs_hopper
from kernels import _flash_dkdv_hopper as dkdv_hopper
from kernels import _flash_dq_hopper as dq_hopper
from kernels import _flash_fwd_hopper as hopper
from kernels import _hopper_pipeline as pipeline
from kernels import flash_attention, flash_attention_qkvpacked
from kernels._common import lse_to_natural
from kernels.reference import attention_qkvpacked_reference, attention_reference
from tests.kernels._flash_utils import assert_close_rule, check_against_reference, check_public_api, randn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "benchmarks", "check_hopper_builds.py")
BF16, F16 = torch.bfloat16, torch.float16


def run_build_tool(tmp_path, *args) -> tuple[int, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiles for the GPU
    out = tmp_path / "builds.json"
    proc = subprocess.run(
        [sys.executable, TOOL, "--out", str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())["results"]


@pytest.mark.slow
def test_every_config_builds_for_sm90_without_spills(tmp_path):
    rc, results = run_build_tool(tmp_path)
    bad = [r for r in results if r["status"] != "ok"]
    assert not bad, "\n".join(f"d{r['headdim']} {r['config']} causal={r['causal']}: {r}" for r in bad)
    assert rc == 0
    modules = {"fwd": hopper, "dq": dq_hopper, "dkdv": dkdv_hopper}
    dense = {(r["kernel"], r["headdim"]) for r in results if not r["sparse"]}
    assert dense == {(name, d) for name, module in modules.items() for d in module.CONFIGS}
    # the block-sparse builds (SPARSE=True: tile lists) of the configs kernels._block_sparse_hopper uses
    sparse = {(r["kernel"], r["headdim"], r["config"]) for r in results if r["sparse"]}
    assert sparse == {
        (name, d, str(cfg))
        for d, cfgs in bs_hopper.CONFIGS.items()
        for name, cfg in zip(("fwd", "dq", "dkdv"), cfgs, strict=True)
    } | {
        (name, d, str(cfg))
        for name, table in (
            ("fwd", bs_hopper.PERSISTENT_FORWARD),
            ("dq", bs_hopper.PERSISTENT_DQ),
            ("dkdv", bs_hopper.PERSISTENT_DKDV),
        )
        for d, (cfg, _) in table.items()
    }
    persistent = {(r["kernel"], r["headdim"]) for r in results if "persistent=True" in r["config"]}
    assert persistent == {("fwd", d) for d in hopper.PERSISTENT_CONFIGS} | {
        ("dq", d) for d in (*dq_hopper.PERSISTENT_CONFIGS, *bs_hopper.PERSISTENT_DQ)
    } | {("dkdv", d) for d in bs_hopper.PERSISTENT_DKDV}
    pingpong = {(r["headdim"], r["config"]) for r in results if "pingpong=True" in r["config"]}
    assert pingpong == {(d, str(cfg)) for d, cfg in hopper.PINGPONG_CONFIGS.items()}
    # the turns' named barriers are in those builds' SASS and in no other forward build
    for r in results:
        if r["kernel"] == "fwd":
            assert (r["turn_barriers"] > 0) is ("pingpong=True" in r["config"]), r
    # the two-kernel backward's dependent launch: the dq builds let the dK/dV kernel launch (PREEXIT), the
    # dK/dV builds of a first pass wait for it (ACQBULK, once: the producer's), a second pass (d256's dK) not
    for r in results:
        if r["kernel"] in ("dq", "dkdv"):
            first_pass = r["kernel"] == "dq" or r["part"] == dkdv_hopper.passes(r["headdim"])[0]
            assert r["pdl"] is (dkdv_hopper.DEPENDENT_AFTER_DQ and first_pass), r
            expected = dict(launch_dependents=0, wait_for_prior_grid=0)
            if r["pdl"]:
                expected["launch_dependents" if r["kernel"] == "dq" else "wait_for_prior_grid"] = 1
            assert r["grid_dependency_controls"] == expected, r
    assert {(r["causal"], r["dtype"]) for r in results} == {
        (c, d) for c in (True, False) for d in ("bfloat16", "float16")
    }
    assert all(0 < r["shared"] <= 232448 and r["spills_in_loops"] == 0 for r in results)


@pytest.mark.slow
def test_build_check_reports_a_config_that_spills(tmp_path):
    """Consumer warpgroups held to 160 registers spill at head dim 128: the check must say so."""
    rc, results = run_build_tool(tmp_path, "--config", "fwd:128:64,128,2,2,160")
    assert rc == 1
    assert {r["status"] for r in results} == {"spills"}
    assert all(r["stack"] > 0 and r["spills_in_loops"] > 0 for r in results)


PLAIN = dict(
    capability=(9, 0), dtype=BF16, headdim=128, seqlen_q=4096, seqlen_k=4096, win_left=None, win_right=None,
    key_padding=False, dropout_p=0.0, varlen=False, merge=False,
)  # fmt: skip


@pytest.mark.parametrize(
    "change, takes",
    [
        ({}, True),
        (dict(win_right=0), True),  # causal
        (dict(dtype=F16), True),
        (dict(seqlen_q=1024, seqlen_k=77), True),
        (dict(seqlen_q=128), True),
        (dict(seqlen_q=127), False),  # shorter than measured faster
        (dict(headdim=64), True),  # d64 from 128 (the persistent variant up to 4k causal)
        (dict(headdim=64, win_right=0), True),
        (dict(headdim=64, win_right=0, seqlen_q=512), True),
        (dict(headdim=64, seqlen_q=127), False),
        (dict(headdim=96), False),  # no config
        (dict(headdim=256), True),
        (dict(headdim=256, win_right=0, seqlen_q=128), True),
        (dict(headdim=256, win_right=0, seqlen_q=127), False),
        (dict(capability=(8, 0)), False),
        (dict(capability=(10, 0)), False),
        (dict(dtype=torch.float32), False),
        (dict(win_right=5), False),  # windows, padding, dropout, varlen and merges: the portable kernel
        (dict(win_left=100, win_right=0), False),
        (dict(key_padding=True), False),
        (dict(dropout_p=0.1), False),
        (dict(varlen=True), False),
        (dict(merge=True), False),
        (dict(seqlen_k=0), False),
    ],
)
def test_which_calls_take_the_hopper_forward(change, takes):
    assert hopper.eligible(**{**PLAIN, **change}) is takes


@pytest.mark.parametrize(
    "headdim, seqlen_q, causal, persistent",
    [
        (64, 1024, True, True),
        (64, 4096, True, True),
        (64, 8192, True, False),  # long causal calls: the row-tile kernel
        (64, 16384, False, True),
        (128, 1024, True, True),
        (128, 4096, True, True),
        (128, 8192, True, False),  # d128: the row-tile kernel from 8k queries causal (PERSISTENT_BELOW_128)
        (128, 1024, False, True),
        (128, 8192, False, True),
        (128, 16384, False, False),  # and from 16k full
        (256, 1024, False, False),  # no persistent config at d256
    ],
)
def test_which_calls_take_the_persistent_variant(headdim, seqlen_q, causal, persistent):
    cfg = hopper.config_for(headdim, seqlen_q, causal)
    assert cfg.persistent is persistent
    assert (
        dataclasses.replace(cfg, pingpong=False)
        == (hopper.PERSISTENT_CONFIGS if persistent else hopper.CONFIGS)[headdim]
    )


@pytest.mark.parametrize(
    "headdim, seqlen_q, causal, pingpong",
    [
        (64, 1024, True, True),  # d64's persistent variant takes turns
        (64, 16384, False, True),
        (64, 8192, True, False),  # its row-tile kernel does not
        (128, 16384, False, True),  # d128's row-tile kernel on full calls
        (128, 32768, False, False),  # from 32k queries it lost a percent
        (128, 16384, True, False),  # not causal ones
        (128, 1024, False, False),  # nor the persistent variant
        (128, 8192, False, False),
        (256, 4096, False, False),
    ],
)
def test_which_calls_take_turns(headdim, seqlen_q, causal, pingpong, monkeypatch):
    assert hopper.config_for(headdim, seqlen_q, causal).pingpong is pingpong
    monkeypatch.setattr(hopper, "PINGPONG", False)  # (FLASHTRAIN_FWD_PINGPONG=0)
    assert not hopper.config_for(headdim, seqlen_q, causal).pingpong


def test_split_kv_rings_are_the_forwards_alone():
    """v_stages (K and V rings of their own) is the forward's, row-tile and persistent alike; the
    backward's configs refuse it (test_flash_bwd_hopper.py)."""
    assert hopper.HopperFwdConfig(64, 128, 2, 2, 240, v_stages=2).v_stages == 2
    assert hopper.HopperFwdConfig(64, 128, 2, 2, 240, persistent=True, v_stages=2).v_stages == 2


def test_cpu_tensors_never_take_it():
    q = torch.randn(1, 4096, 2, 128, dtype=BF16)
    kw = dict(win_left=None, win_right=None, key_padding_mask=None, dropout_p=0.0, varlen=False, merge=False)
    assert not hopper.supports(q, q, q, **kw)


def test_tma_ready_wants_a_unit_last_stride_and_16_byte_base_and_strides():
    """TMA's rules for a descriptor's tensor, on fresh tensors: a contiguous bf16 tensor of 8-element
    rows passes; an offset of one element, a row of 4 elements (8 bytes) or a transposed last dim fails."""
    t = torch.randn(2, 40, 3, 16, dtype=BF16)
    assert pipeline.tma_ready(t) and pipeline.all_tma_ready((t, t.float()))
    flat = torch.randn(2 * 40 * 3 * 16 + 1, dtype=BF16)
    shifted = flat[1:].view(2, 40, 3, 16)  # base 2 bytes past an aligned one
    assert flat.data_ptr() % 16 == 0 and not pipeline.tma_ready(shifted)
    assert not pipeline.all_tma_ready((t, shifted))
    assert not pipeline.tma_ready(torch.randn(2, 40, 3, 4, dtype=BF16))  # head stride 8 bytes
    assert not pipeline.tma_ready(t.transpose(-1, -2))
    assert pipeline.tma_ready(torch.randn(2, 40, 3, 4, dtype=torch.float32))  # 16-byte rows


# ---------------------------------------------------------------------------------------------------
# GPU (sm_90): the kernel itself on every edge of its schedule, and the public API taking it
# ---------------------------------------------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal): one key; lengths that are no multiple of any
# tile; GQA and MQA; causal with seqlen_q != seqlen_k both ways (rows that see no key: out 0, lse -inf);
# a single query against many keys; the steady-state loop at 4k.
EDGES = [
    (2, 128, 128, 4, 4, False), (2, 128, 128, 4, 4, True), (1, 1, 1, 2, 2, False), (1, 1, 300, 2, 1, True),
    (1, 17, 17, 2, 2, True), (2, 127, 129, 4, 2, False), (2, 129, 127, 4, 2, True), (1, 300, 300, 3, 1, True),
    (1, 129, 1000, 2, 2, True), (1, 1000, 129, 2, 2, True), (2, 1000, 1000, 4, 4, False),
    (1, 4096, 4096, 4, 2, True),
]  # fmt: skip


def _hopper_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# On other GPUs too these skip (the kernel is built for sm_90 only); they run on the H100/H200 of
# `device` (benchmarks/results/hopper_fwd_h200/call9_kernel_gpu_tests_final.log)
needs_hopper = pytest.mark.skipif(
    not _hopper_gpu(), reason="the Gluon kernels are built for sm_90 (H100/H200)"
)


def record_calls(monkeypatch, *targets) -> list:
    """Wraps each (module, function name) so that its calls append the name to the returned list (the
    functions still run)."""
    calls = []
    for module, name in targets:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real, **kw: calls.append(_n) or _r(*a, **kw))
    return calls


@pytest.fixture
def hopper_calls(monkeypatch) -> list:
    """Records each call of the Hopper forward."""
    return record_calls(monkeypatch, (hopper, "flash_attn_forward_hopper"))


def over_edges(configs, cases=EDGES):
    """The GPU tests' grid for a Hopper kernel: every EDGES case (or those of cases), each head dim of
    `configs`, bf16 and fp16; skipped off sm_90."""

    def grid(test):
        for mark in (
            pytest.mark.parametrize("case", cases, ids=lambda c: "-".join(map(str, c))),
            pytest.mark.parametrize("headdim", sorted(configs)),
            pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"]),
            needs_hopper,
            pytest.mark.gpu,
        ):
            test = mark(test)
        return test

    return grid


def edge_inputs(case, headdim, dtype):
    """(q, k, v, do, causal) of one EDGES case on the GPU, seeded by the case."""
    b, sq, sk, h, hk, causal = case
    torch.manual_seed(sq + sk + headdim)
    q = randn(b, sq, h, headdim, dtype=dtype, device="cuda", requires_grad=False)
    k, v = (randn(b, sk, hk, headdim, dtype=dtype, device="cuda", requires_grad=False) for _ in range(2))
    return q, k, v, torch.randn_like(q), causal


def assert_forward_matches(q, k, v, causal, config=None):
    """The Hopper forward with config (None: `config_for`'s) against the float64 reference, out and lse,
    by the tolerance rule."""
    out, lse2 = hopper.flash_attn_forward_hopper(
        q, k, v, sm_scale=q.shape[-1] ** -0.5, causal=causal, config=config
    )
    ref64, lse64 = attention_reference(q.double(), k.double(), v.double(), causal=causal, return_lse=True)
    ref_lp, lse_lp = attention_reference(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref64, ref_lp, q.dtype)
    assert_close_rule("lse", lse_to_natural(lse2), lse64, lse_lp.float(), q.dtype)


@over_edges(hopper.CONFIGS)
def test_gpu_kernel_matches_reference(case, headdim, dtype):
    q, k, v, _, causal = edge_inputs(case, headdim, dtype)
    assert_forward_matches(q, k, v, causal, hopper.CONFIGS[headdim])


@over_edges(hopper.PERSISTENT_CONFIGS)
def test_gpu_persistent_variant_matches_reference(case, headdim, dtype):
    """Each program walks several work items here whenever the grid has more than one program per SM
    (the 4k case), and fewer items than SMs elsewhere."""
    q, k, v, _, causal = edge_inputs(case, headdim, dtype)
    assert_forward_matches(q, k, v, causal, hopper.PERSISTENT_CONFIGS[headdim])


@over_edges(hopper.PINGPONG_CONFIGS)
def test_gpu_pingpong_variant_matches_reference(case, headdim, dtype):
    """The consumers taking turns (`wait_turn`), in the row-tile kernel (d128) and the persistent one
    (d64), causal too though the rule sends only full d128 calls there."""
    q, k, v, _, causal = edge_inputs(case, headdim, dtype)
    assert_forward_matches(q, k, v, causal, hopper.PINGPONG_CONFIGS[headdim])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "headdim, config",
    [
        (64, hopper.PERSISTENT_CONFIGS[64]),
        (64, dataclasses.replace(hopper.PERSISTENT_CONFIGS[64], pingpong=True)),
        (128, hopper.PERSISTENT_CONFIGS[128]),
    ],
    ids=["d64", "d64_pingpong", "d128"],
)
def test_gpu_persistent_variant_walks_many_items_per_program(headdim, config):
    """Two sequences of 1k queries in 128 heads of 64 (64 of 128): 2048 (1024) row tiles for ~132 programs,
    causal (snake order) and full; the turns, and split K/V rings' phases, go on from item to item."""
    torch.manual_seed(11)
    heads = 128 * 64 // headdim
    for causal in (True, False):
        q, k, v = (
            randn(2, 1024, heads, headdim, dtype=BF16, device="cuda", requires_grad=False) for _ in range(3)
        )
        assert_forward_matches(q, k, v, causal, config)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, h, hk, d, causal",
    [
        (1, 4096, 4, 2, 64, True),
        (2, 1024, 4, 4, 128, False),
        (1, 2048, 8, 1, 128, True),
        (1, 2048, 4, 2, 256, True),
    ],
)
def test_gpu_public_api_takes_it_and_matches(hopper_calls, b, sq, h, hk, d, causal):
    """flash_attention sends these calls to the Hopper forward (the backward stays the portable one)
    and its outputs, lse and gradients pass the tolerance rule."""
    torch.manual_seed(sq + d)
    q = randn(b, sq, h, d, dtype=BF16, device="cuda")
    k, v = (randn(b, sq, hk, d, dtype=BF16, device="cuda") for _ in range(2))
    check_public_api([q, k, v], BF16, causal=causal)
    assert hopper_calls


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_qkv_takes_it(hopper_calls):
    """GPT-2's layout (q, k, v views of one projection output) at GPT-2 medium's head dim."""
    torch.manual_seed(3)
    qkv = randn(1, 4096, 3 * 4, 64, dtype=BF16, device="cuda")
    check_against_reference(
        lambda qkv: flash_attention_qkvpacked(qkv, causal=True, return_lse=True),
        lambda qkv: attention_qkvpacked_reference(qkv, causal=True, return_lse=True),
        [qkv],
        BF16,
        names=("qkv",),
    )
    assert hopper_calls


@pytest.mark.gpu
@needs_hopper
def test_gpu_other_calls_keep_the_portable_kernel(monkeypatch):
    monkeypatch.setattr(
        hopper, "flash_attn_forward_hopper", lambda *a, **kw: pytest.fail("took the Hopper path")
    )
    q = torch.randn(1, 4096, 2, 64, device="cuda", dtype=BF16)
    flash_attention(q, q, q, causal=True, window=(256, 0))
    flash_attention(q, q, q, causal=True, dropout_p=0.1)
    short = q[:, : hopper.MIN_SEQLEN_Q - 1]
    flash_attention(short, short, short, causal=True)  # shorter than measured
