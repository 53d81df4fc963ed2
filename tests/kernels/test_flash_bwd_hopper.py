"""The Gluon Hopper backward kernels (`kernels._flash_dq_hopper`, `kernels._flash_dkdv_hopper`): which
backward calls take them, and (on an H100/H200) that dq and delta, dK and dV match the float64 reference
on every edge of their schedules.

Their sm_90 builds (and the spill check) are in test_flash_fwd_hopper.py with the forward's, through
`benchmarks/check_hopper_builds.py`, which builds every Hopper kernel.
"""

from __future__ import annotations

import pytest
import torch

from kernels import _flash_bwd_fused_hopper as fused_hopper
from kernels import _flash_dkdv_hopper as dkdv_hopper
from kernels import _flash_dq_hopper as dq_hopper
from kernels import _flash_fwd_hopper as fwd_hopper
from kernels import _launch, flash_attention, flash_attention_qkvpacked
from kernels._common import lse_to_natural
from kernels._flash_bwd import backward_delta
from kernels._flash_fwd import flash_attn_forward
from kernels.reference import attention_qkvpacked_reference, attention_reference
from tests.kernels._flash_utils import (
    assert_close_rule,
    assert_compiled_launches_match_jit,
    assert_dependent_dkdv_launches_match,
    check_against_reference,
    check_public_api,
    randn,
)
from tests.kernels.test_flash_fwd_hopper import edge_inputs, needs_hopper, over_edges, record_calls

BF16, F16 = torch.bfloat16, torch.float16


def _supports_kw(**change):
    kw = dict(win_left=None, win_right=None, key_padding_mask=None, dropout_p=0.0, varlen=False)
    return {**kw, **change}


@pytest.mark.parametrize("module", [dq_hopper, dkdv_hopper], ids=["dq", "dkdv"])
def test_cpu_tensors_never_take_them(module):
    q = torch.randn(1, 4096, 2, 128, dtype=BF16)
    assert not module.supports(q, q, q, q, q, q, **_supports_kw())


@pytest.mark.parametrize("module", [dq_hopper, dkdv_hopper], ids=["dq", "dkdv"])
@pytest.mark.parametrize(
    "headdim, seqlen_q, causal, takes",
    [(128, 4096, True, True), (128, 1024, False, True), (128, 256, True, True), (128, 255, True, False),
     (128, 128, False, True), (128, 127, False, False), (96, 4096, True, False), (256, 4096, False, True),
     (256, 128, True, True), (256, 127, False, False)],
)  # fmt: skip
def test_where_they_are_faster(module, headdim, seqlen_q, causal, takes):
    assert module.faster_here(headdim, seqlen_q, causal) is takes


@pytest.mark.parametrize("config_class", [dq_hopper.HopperDqConfig, dkdv_hopper.HopperDkdvConfig])
def test_backward_configs_refuse_split_kv_rings(config_class):
    """v_stages (K and V rings of their own) is the row-tile forward's option: a backward config that
    sets it raises instead of being launched without it."""
    with pytest.raises(ValueError, match="v_stages"):
        config_class(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240, v_stages=2)
    assert config_class(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240).v_stages == 0


@pytest.mark.parametrize("config_class", [dq_hopper.HopperDqConfig, dkdv_hopper.HopperDkdvConfig])
def test_backward_configs_refuse_turns(config_class):
    """pingpong (the consumers taking turns) is the forward's option: a backward config that sets it
    raises instead of being launched without turns."""
    with pytest.raises(ValueError, match="pingpong"):
        config_class(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240, pingpong=True)


@pytest.mark.parametrize(
    "seqlen_q, causal, takes",
    [(4096, True, True), (16384, False, True), (1024, True, True), (1000, False, False), (512, True, False)],
)
def test_head_dim_64_takes_the_dkdv_kernel_alone(seqlen_q, causal, takes):
    """At head dim 64 the Gluon dK/dV kernel pays from 1k queries (at 128-512 it measured level or
    slower, unlike d128 and d256); the Gluon dq kernel does not pay at d64."""
    assert dkdv_hopper.faster_here(64, seqlen_q, causal) is takes
    assert dq_hopper.faster_here(64, seqlen_q, causal) is False


# ---------------------------------------------------------------------------------------------------
# GPU (sm_90)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, on, dependent",
    [((1, 4096, 16, 128), True, True),  # 512 dq items on 132 SMs: 3.9 each
     ((4, 1000, 4, 64), True, True),
     ((1, 4096 + 128, 16, 128), True, True),  # 528 items: 4 an SM
     ((1, 4096 + 129, 16, 128), True, False),  # 544: past 4 an SM
     ((1, 16384, 16, 128), True, False),
     ((1, 4096, 16, 128), False, False)],
)  # fmt: skip
def test_dkdv_launches_dependent_on_the_dq_kernel_up_to_four_items_an_sm(monkeypatch, shape, on, dependent):
    monkeypatch.setattr(dkdv_hopper, "sm_count", lambda device: 132)
    monkeypatch.setattr(dkdv_hopper, "DEPENDENT_AFTER_DQ", on)
    assert dkdv_hopper.dependent_after_dq(torch.empty(shape, device="meta")) is dependent


@pytest.fixture
def bwd_calls(monkeypatch) -> list:
    """Records each call of the Hopper dq and dK/dV kernels by name, with the ordered one-kernel backward
    (which takes deterministic d128 full-attention calls; tested in test_flash_bwd_fused_hopper.py) off."""
    monkeypatch.setattr(fused_hopper, "ORDERED_ENABLED", False)
    return record_calls(
        monkeypatch, (dq_hopper, "flash_attn_dq_hopper"), (dkdv_hopper, "flash_attn_dkdv_hopper")
    )


def _forward(q, k, v, causal):
    return flash_attn_forward(
        q, k, v, sm_scale=q.shape[-1] ** -0.5, win_left=None, win_right=0 if causal else None,
        key_padding_mask=None, dropout_p=0.0, seed=0,
    )  # fmt: skip


def _gpu_inputs(b, sq, sk, h, hk, d, seed):
    """Seeded bf16 q (b, sq, h, d) and k, v (b, sk, hk, d) on the GPU, requiring grad."""
    torch.manual_seed(seed)
    q = randn(b, sq, h, d, dtype=BF16, device="cuda")
    k, v = (randn(b, sk, hk, d, dtype=BF16, device="cuda") for _ in range(2))
    return q, k, v


def _ref_grads(q, k, v, do, causal):
    """(dq, dk, dv) of the reference in float64 and in the inputs' dtype, by autograd."""

    def grads(q, k, v):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        return torch.autograd.grad(attention_reference(q, k, v, causal=causal), (q, k, v), do.to(q.dtype))

    return grads(q.double(), k.double(), v.double()), grads(q, k, v)


@over_edges(dq_hopper.CONFIGS)
def test_gpu_dq_kernel_matches_reference(case, headdim, dtype):
    """dq and delta of the dq kernel alone, given the forward's out and lse."""
    q, k, v, do, causal = edge_inputs(case, headdim, dtype)
    out, lse2 = _forward(q, k, v, causal)
    dq, delta = torch.full_like(q, float("nan")), torch.full_like(lse2, float("nan"))
    dq_hopper.flash_attn_dq_hopper(q, k, v, do, out, lse2, delta, dq, sm_scale=headdim**-0.5, causal=causal)
    ref64, ref_lp = _ref_grads(q, k, v, do, causal)
    assert_close_rule("dq", dq, ref64[0], ref_lp[0], dtype)
    torch.testing.assert_close(
        delta, (do.float() * out.float()).sum(-1).transpose(1, 2), rtol=1e-4, atol=1e-4
    )
    assert torch.isfinite(lse_to_natural(lse2)).any()  # (the forward ran)


@over_edges(dkdv_hopper.CONFIGS)
def test_gpu_dkdv_kernel_matches_reference(case, headdim, dtype):
    """dK and dV of the dK/dV kernel alone, given the forward's lse and delta."""
    q, k, v, do, causal = edge_inputs(case, headdim, dtype)
    out, lse2 = _forward(q, k, v, causal)
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    delta = backward_delta(out, do, lse2)
    dkdv_hopper.flash_attn_dkdv_hopper(
        q, k, v, do, dk, dv, lse2, delta, sm_scale=headdim**-0.5, causal=causal
    )
    ref64, ref_lp = _ref_grads(q, k, v, do, causal)
    assert_close_rule("dk", dk, ref64[1], ref_lp[1], dtype)
    assert_close_rule("dv", dv, ref64[2], ref_lp[2], dtype)


def _assert_either_setting_gives_the_same_grads(q, k, v, do, causal):
    """flash_attention's gradients with deterministic=True, then False, on the same dO: bitwise equal."""
    grads = {
        det: torch.autograd.grad(flash_attention(q, k, v, causal=causal, deterministic=det), (q, k, v), do)
        for det in (True, False)
    }
    for want, got in zip(grads[True], grads[False], strict=True):
        assert torch.equal(want, got)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, causal",
    [(1, 4096, 4096, 4, 2, 128, True), (2, 1024, 1024, 4, 4, 128, False), (1, 2048, 1500, 8, 1, 128, True),
     (1, 2048, 2048, 4, 2, 256, True), (1, 1024, 1500, 2, 2, 256, False)],
)  # fmt: skip
def test_gpu_backward_takes_them_and_matches(bwd_calls, b, sq, sk, h, hk, d, causal):
    """flash_attention's backward sends these calls to the Hopper dq kernel, then the Hopper dK/dV
    kernel (which reads the delta the first one writes); all three gradients pass the tolerance rule."""
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, d, seed=sq + d)
    check_against_reference(
        lambda q, k, v: _out_and_lse(flash_attention, q, k, v, causal=causal),
        lambda q, k, v: attention_reference(q, k, v, causal=causal, return_lse=True),
        [q, k, v],
        BF16,
    )
    assert bwd_calls == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


def fwd_bwd_results(fn, inputs, do) -> tuple:
    """(out, lse, *input gradients) of fn(*inputs) -> (out, lse) with the loss <out, do>."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse = fn(*leaves)
    out.backward(do)
    return out.detach(), lse.detach(), *(x.grad for x in leaves)


def assert_compiled_launches_match_jit_ones(monkeypatch, fn, inputs, do) -> None:
    """fn(*inputs) -> (out, lse) with the loss <out, do>, once through Triton's JIT launches, then twice
    more with kernels/_launch.py's compiled launches on: each Gluon kernel (forward, dq, dK/dV) took its
    compiled path, and out, lse and every gradient are bit-identical."""
    # (each pass launches either its row-tile or its persistent kernel: `_flash_fwd_hopper.config_for`,
    # and block-sparse's rules for short lists)
    launchers = (
        (fwd_hopper._launch_fwd, fwd_hopper._launch_fwd_persistent),
        (dq_hopper._launch_dq, dq_hopper._launch_dq_persistent),
        (dkdv_hopper._launch_dkdv, dkdv_hopper.persistent_dkdv.launch),
    )
    run = lambda: fwd_bwd_results(fn, inputs, do)  # noqa: E731
    assert_compiled_launches_match_jit(monkeypatch, launchers, run, ("out", "lse", "dq", "dk", "dv"))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d, causal", [(128, True), (256, False)])
def test_gpu_compiled_launches_give_the_jit_launches_results(monkeypatch, bwd_calls, d, causal):
    torch.manual_seed(d)
    q = randn(1, 2048, 4, d, dtype=BF16, device="cuda")
    k, v = (randn(1, 1500, 2, d, dtype=BF16, device="cuda") for _ in range(2))
    do = torch.randn_like(q)
    fn = lambda q, k, v: flash_attention(q, k, v, causal=causal, return_lse=True)  # noqa: E731
    assert_compiled_launches_match_jit_ones(monkeypatch, fn, (q, k, v), do)
    assert bwd_calls[-2:] == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, causal",
    [(2, 1000, 1000, 4, 4, 128, True), (1, 1500, 1500, 8, 2, 128, False), (2, 640, 777, 4, 2, 256, True)],
)  # fmt: skip
def test_gpu_dependent_dkdv_launch_gives_the_ordinary_launchs_results(
    monkeypatch, bwd_calls, b, sq, sk, h, hk, d, causal
):
    """The dense two-kernel backward's dK/dV kernel launched dependent on the dq kernel: bitwise the
    ordinary launch's results, eagerly and from a CUDA graph (d256: its first pass of two dependent)."""
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, d, seed=sq + d)
    do = torch.randn_like(q)
    fn = lambda q, k, v: flash_attention(q, k, v, causal=causal, return_lse=True)  # noqa: E731
    assert_dependent_dkdv_launches_match(monkeypatch, fn, (q, k, v), do, dq_programs=None)
    assert bwd_calls[:2] == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


@pytest.mark.gpu
@needs_hopper
def test_gpu_new_values_at_an_address_already_encoded_give_the_new_results(monkeypatch):
    """The compiled launches keep each TMA descriptor by address, shape and strides: values written in
    place are read by the next call (1024 tokens: causal d128 on the two kernels, not the ordered one)."""
    torch.manual_seed(0)
    q, k, v, do = (randn(1, 1024, 4, 128, dtype=BF16, device="cuda") for _ in range(4))
    fn = lambda q, k, v: flash_attention(q, k, v, causal=True, return_lse=True)  # noqa: E731
    encodings = dkdv_hopper._launch_dkdv.encodings
    for _ in range(3):
        fwd_bwd_results(fn, (q, k, v), do)
    with torch.no_grad():
        for t in (q, k, v, do):
            t.normal_()
    got = fwd_bwd_results(fn, (q, k, v), do)
    assert dkdv_hopper._launch_dkdv.encodings > encodings
    monkeypatch.setattr(_launch, "ENABLED", False)
    expected = fwd_bwd_results(fn, (q, k, v), do)
    for name, want, have in zip(("out", "lse", "dq", "dk", "dv"), expected, got, strict=True):
        assert torch.equal(want, have), name


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, causal",
    [(8, 128, 128, 4, 2, 128, False), (3, 200, 77, 4, 4, 128, False), (4, 130, 300, 2, 1, 256, True),
     (2, 256, 256, 4, 4, 128, True)],
)  # fmt: skip
def test_gpu_short_calls_take_them_from_the_measured_lengths(bwd_calls, b, sq, sk, h, hk, d, causal):
    """From 128 queries (d128 causal: 256; results/s41/call2) the public API's backward takes both Gluon
    kernels, and its outputs, lse and gradients pass the tolerance rule."""
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, d, seed=sq + sk + d)
    check_public_api([q, k, v], BF16, causal=causal)
    assert bwd_calls == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


@pytest.mark.gpu
@needs_hopper
def test_gpu_a_returned_lse_the_loss_ignores_keeps_them(bwd_calls):
    """return_lse with a loss on out alone: no zero lse gradient reaches the backward, so it takes the
    Hopper kernels as a call without lse does."""
    q = torch.randn(1, 2048, 2, 128, device="cuda", dtype=BF16, requires_grad=True)
    out, _ = flash_attention(q, q, q, causal=True, return_lse=True)
    out.sum().backward()
    assert bwd_calls == ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]


def _out_and_lse(fn, *inputs, **kw):
    """(out, lse) with out from a call without lse: a loss that uses lse has its gradient folded into a
    precomputed delta, which the portable dq kernel takes (as the last test checks)."""
    with torch.no_grad():
        _, lse = fn(*(t.detach() for t in inputs), return_lse=True, **kw)
    return fn(*inputs, **kw), lse


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "headdim, kernels",
    [(128, ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]), (64, ["flash_attn_dkdv_hopper"])],
)
def test_gpu_packed_qkv_takes_them(bwd_calls, headdim, kernels):
    """GPT-2's layout: dq, dk and dv are stored into views of the packed gradient (at head dim 64, GPT-2's,
    by the dK/dV kernel alone)."""
    torch.manual_seed(3)
    qkv = randn(1, 4096, 3 * 4, headdim, dtype=BF16, device="cuda")
    check_against_reference(
        lambda qkv: _out_and_lse(flash_attention_qkvpacked, qkv, causal=True),
        lambda qkv: attention_qkvpacked_reference(qkv, causal=True, return_lse=True),
        [qkv],
        BF16,
        names=("qkv",),
    )
    assert bwd_calls == kernels


@pytest.mark.gpu
@needs_hopper
def test_gpu_other_backwards_keep_the_portable_kernels(monkeypatch):
    monkeypatch.setattr(dq_hopper, "flash_attn_dq_hopper", lambda *a, **kw: pytest.fail("took the Hopper dq"))
    monkeypatch.setattr(
        dkdv_hopper, "flash_attn_dkdv_hopper", lambda *a, **kw: pytest.fail("took Hopper dK/dV")
    )
    q = torch.randn(1, 2048, 2, 128, device="cuda", dtype=BF16, requires_grad=True)
    for kw in (dict(causal=True, window=(256, 0)), dict(causal=True, dropout_p=0.1)):
        flash_attention(q, q, q, **kw).sum().backward()
    q32 = torch.randn(1, 2048, 2, 128, device="cuda", requires_grad=True)
    flash_attention(q32, q32, q32).sum().backward()  # fp32
    short = q[:, : dkdv_hopper.MIN_SEQLEN_Q[(128, False)] - 1].detach().requires_grad_()
    flash_attention(short, short, short).sum().backward()  # shorter than measured


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_loss_on_lse_keeps_the_portable_dq_only(bwd_calls, causal):
    """A loss that uses lse has its gradient folded into a delta computed beforehand: the portable dq
    kernel reads it, and so does the Hopper dK/dV kernel; all gradients pass the tolerance rule."""
    torch.manual_seed(7)
    q = randn(1, 1024, 4, 128, dtype=BF16, device="cuda")
    k, v = (randn(1, 1024, 2, 128, dtype=BF16, device="cuda") for _ in range(2))
    check_public_api([q, k, v], BF16, lse_grad=True, causal=causal)
    assert bwd_calls == ["flash_attn_dkdv_hopper"]
