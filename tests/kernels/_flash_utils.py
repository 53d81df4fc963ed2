"""Shared checks for the FlashAttention tests: the flash-attention tolerance rule, bad-input tables,
compiled launches against Triton's.

The kernel's error against a float64 reference must be at most 2x the error of PyTorch's own
computation of the same reference in the kernel's dtype, plus a small absolute floor.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from benchmarks.common import capture_graph

FLOOR = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def assert_close_rule(name, out, ref64, ref_lp, dtype):
    """max|out - ref64| <= 2 * max|ref_lp - ref64| + floor, with -inf entries required to match."""
    out, ref64, ref_lp = out.double(), ref64.double(), ref_lp.double()
    assert not torch.isnan(out).any(), f"{name}: NaN in kernel output"
    inf_out, inf_ref = torch.isinf(out), torch.isinf(ref64)
    assert torch.equal(inf_out, inf_ref), (
        f"{name}: infinities differ ({int(inf_out.sum())} vs {int(inf_ref.sum())})"
    )
    fin = ~inf_ref
    err = (out - ref64)[fin].abs().max().item() if fin.any() else 0.0
    lp_err = (ref_lp - ref64)[fin].abs().nan_to_num(0.0).max().item() if fin.any() else 0.0
    bound = 2 * lp_err + FLOOR[dtype]
    assert err <= bound, (
        f"{name}: max error {err:.3e} > bound {bound:.3e} (reference in {dtype}: {lp_err:.3e})"
    )


class MustNotLaunch:
    """Stands in for a Triton kernel (`kernel[grid](...)`) a test says must not run: launching it fails
    the test, naming `what` ran."""

    def __init__(self, what: str):
        self.what = what

    def __getitem__(self, grid):
        raise AssertionError(f"{self.what} ran")


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) inside the block, off again after it."""
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def randn(*shape, dtype, device, requires_grad=True):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def run_and_grads(fn, inputs, dout):
    """fn(*inputs) -> (out, lse); returns out, lse and the gradients of (out * dout).sum()."""
    out, lse = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, dout)
    return out, lse, grads


def check_against_reference(
    kernel_fn, ref_fn, inputs, dtype, check_grads=True, names=("q", "k", "v"), lse_grad=False
):
    """Run the kernel on inputs (already in dtype), the reference on float64 and dtype copies, compare.

    The gradients are those of (out * dout).sum(), plus (lse * dlse).sum() with lse_grad (random dout
    and dlse; rows of lse = -inf pass no gradient)."""
    out, lse = kernel_fn(*inputs)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if lse_grad else None
    ins64 = [x.detach().double().requires_grad_() for x in inputs]
    inslp = [x.detach().clone().requires_grad_() for x in inputs]
    ref64, lse64 = ref_fn(*ins64)
    reflp, lselp = ref_fn(*inslp)
    assert out.dtype == dtype and out.shape == ref64.shape
    assert lse.dtype == torch.float32 and lse.shape == lse64.shape
    assert_close_rule("out", out, ref64, reflp, dtype)
    assert_close_rule("lse", lse, lse64, lselp.float(), dtype if dtype != torch.float32 else torch.float32)
    if not check_grads:
        return
    if lse_grad:
        grads = torch.autograd.grad((out, lse), inputs, (dout, dlse))
        g64 = torch.autograd.grad((ref64, lse64), ins64, (dout.double(), dlse.double()))
        glp = torch.autograd.grad((reflp, lselp), inslp, (dout, dlse.to(lselp.dtype)))
    else:
        grads = torch.autograd.grad(out, inputs, dout)
        g64 = torch.autograd.grad(ref64, ins64, dout.double())
        glp = torch.autograd.grad(reflp, inslp, dout)
    for name, g, r64, rlp in zip(names, grads, g64, glp, strict=True):
        assert_close_rule(f"d{name}", g, r64, rlp, dtype)


def check_public_api(inputs, dtype, lse_grad=False, **kw):
    """`check_against_reference` of `kernels.flash_attention(q, k, v, return_lse=True, **kw)` against
    `kernels.reference.attention_reference` with the same arguments."""
    from kernels import flash_attention
    from kernels.reference import attention_reference

    check_against_reference(
        lambda q, k, v: flash_attention(q, k, v, return_lse=True, **kw),
        lambda q, k, v: attention_reference(q, k, v, return_lse=True, **kw),
        inputs,
        dtype,
        lse_grad=lse_grad,
    )


def bad_input_names(table) -> list[str]:
    """The case names of a bad-input table: table(device) -> [(name, call, match), ...]."""
    return [name for name, _, _ in table("cpu")]


def assert_bad_input_raises(table, name, device):
    """The named case of a bad-input table raises ValueError with a message matching its pattern."""
    _, call, match = next(case for case in table(device) if case[0] == name)
    with pytest.raises(ValueError, match=match):
        call()


def assert_compiled_launches_match_jit(monkeypatch, launch_groups, run, names=None) -> None:
    """run() -> tensors, once through Triton's own launches, then twice more with kernels/_launch.py's
    compiled launches on: in each group of `CompiledLaunch`es (one kernel's variants, any of which the call
    may take) some launch took the compiled path, every compiled entry calls its C launcher (not the `run`
    fallback), and every output is bit-identical (names: the outputs', for the failure message)."""
    from kernels import _launch

    fast = lambda: [sum(launch.fast_launches for launch in group) for group in launch_groups]  # noqa: E731
    monkeypatch.setattr(_launch, "ENABLED", False)
    expected = run()
    monkeypatch.setattr(_launch, "ENABLED", True)
    before = fast()
    for _ in range(2):
        got = run()
    assert all(now > n for now, n in zip(fast(), before, strict=True))
    entries = [entry for group in launch_groups for launch in group for entry in launch._compiled.values()]
    assert all(entry.c_launcher is not None for entry in entries)  # (not the `run` fallback)
    for name, want, have in zip(names or range(len(expected)), expected, got, strict=True):
        assert torch.equal(want, have), name


def _fwd_bwd(fn, leaves, do) -> list:
    """(out, lse, *gradients), detached: no autograd graph of the call outlives it (a graph of a call on
    the default stream still alive breaks a later capture)."""
    out, lse = fn(*leaves)
    return [out.detach(), lse.detach(), *torch.autograd.grad(out, leaves, do)]


def _graph_replayed(fn, leaves, do) -> list:
    """fn's (out, lse, *gradients) captured in a CUDA graph (`benchmarks.common.capture_graph`) and replayed."""
    graph, results = capture_graph(lambda: _fwd_bwd(fn, leaves, do))
    graph.replay()
    torch.cuda.synchronize()
    return results


def assert_dependent_dkdv_launches_match(monkeypatch, fn, inputs, do, dq_programs: int | None = 3) -> None:
    """fn(*inputs) -> (out, lse) with the loss <out, do> through the two-kernel Hopper backward, its dK/dV
    kernel launched the ordinary way, then as a programmatic dependent launch of the dq kernel
    (`_flash_dkdv_hopper.DEPENDENT_AFTER_DQ`), eagerly and replayed from a CUDA graph: out, lse and every
    gradient bit-identical, none NaN. Every fresh tensor starts NaN (torch.empty_like), so a dK/dV
    program reading delta before the dq kernel has written it gives NaN; dq_programs: the persistent dq
    kernel's programs (few: it runs long, and the dK/dV programs start beside it on the free SMs)."""
    from kernels import _flash_dkdv_hopper, _flash_dq_hopper

    if dq_programs is not None:
        monkeypatch.setattr(_flash_dq_hopper, "sm_count", lambda device: dq_programs)
    empty_like = torch.empty_like

    def nan_filled_like(*args, **kwargs):
        t = empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty_like", nan_filled_like)
    dependent = []
    real = _flash_dkdv_hopper.flash_attn_dkdv_hopper
    monkeypatch.setattr(
        _flash_dkdv_hopper,
        "flash_attn_dkdv_hopper",
        lambda *a, **kw: dependent.append(kw.get("dependent", False)) or real(*a, **kw),
    )
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    monkeypatch.setattr(_flash_dkdv_hopper, "DEPENDENT_AFTER_DQ", False)
    expected = _fwd_bwd(fn, leaves, do)
    monkeypatch.setattr(_flash_dkdv_hopper, "DEPENDENT_AFTER_DQ", True)
    runs = {"eager": _fwd_bwd(fn, leaves, do), "graph": _graph_replayed(fn, leaves, do)}
    assert dependent[0] is False and dependent[1:] and all(dependent[1:]), dependent
    names = ("out", "lse", *(f"grad {i}" for i in range(len(inputs))))
    for name, want in zip(names, expected, strict=True):
        assert not want.isnan().any(), name
    for how, got in runs.items():
        for name, want, have in zip(names, expected, got, strict=True):
            assert torch.equal(want, have), (how, name)
