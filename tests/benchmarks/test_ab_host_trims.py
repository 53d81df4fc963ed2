"""benchmarks/ab_host_trims.py: its two ways give the same answers and it leaves the trimmed code in place."""

from __future__ import annotations

import pytest
import torch

from benchmarks import ab_host_trims
from kernels import _block_sparse_hopper, _hopper_pipeline
from kernels._launch import CompiledLaunch
from kernels.layouts import butterfly_layout


@pytest.mark.parametrize("way", list(ab_host_trims.WAYS))
def test_both_ways_answer_alike_and_the_trimmed_code_comes_back(way):
    torch.manual_seed(0)
    q = torch.randn(1, 256, 2, 64, dtype=torch.bfloat16)
    flat = torch.randn(q.numel() + 1, dtype=torch.bfloat16)
    tensors = [
        q,
        q.transpose(-1, -2),
        flat[1:].view(q.shape),
        torch.randn(1, 256, 2, 4, dtype=torch.bfloat16),
    ]
    want = [_hopper_pipeline.tma_ready(t) for t in tensors]
    layout = butterfly_layout(256, 128)
    try:
        ab_host_trims.use(way)
        assert [_hopper_pipeline.tma_ready(t) for t in tensors] == want == [True, False, False, False]
        # (CPU tensors: the forward's answer decides in the trimmed way, the full check says no in the other)
        got = _block_sparse_hopper.usable_backward(q, q, q, q, q, layout, 0.0, False, forward_hopper=True)
        assert got == (way == "trimmed")
    finally:
        ab_host_trims.use("trimmed")
    assert (_hopper_pipeline.tma_ready, _block_sparse_hopper.usable_backward) == ab_host_trims.TRIMMED


def test_alternating_host_times_switch_ways_in_turn_reversed_every_other_batch(monkeypatch):
    """bench_host_overhead.alternating_host_ms (ab_host_trims.py's and check_launch_encoding.py's loop),
    its timer stubbed so it runs on CPU: warm-up under every way, then each batch times every function
    under every way, the order of ways reversed every other batch."""
    from benchmarks import bench_host_overhead

    log = []
    monkeypatch.setattr(bench_host_overhead, "per_call_ms", lambda fn, calls, sync_each: fn() or 1.0)
    ways = {"a": lambda: log.append("to a"), "b": lambda: log.append("to b")}
    fns = {"f": lambda: log.append("f"), "g": lambda: log.append("g")}
    times = bench_host_overhead.alternating_host_ms(ways, fns, batches=2, calls=5)
    assert log[:22] == ["to a"] + ["f"] * 10 + ["g"] * 10 + ["to b"]
    assert log[42:] == ["to a", "f", "g", "to b", "f", "g", "to b", "f", "g", "to a", "f", "g"]
    assert times == {(w, n): [1.0, 1.0] for w in ways for n in fns}


@pytest.mark.parametrize("way", list(ab_host_trims.WAYS_S64))
def test_session_64s_ways_answer_alike_and_the_trimmed_code_comes_back(way, device):
    """Both ways of `--trims s64`: the same cdiv in every module that calls it, the same delta and decode."""
    from kernels import _common, _flash_bwd, decode, flash_decode

    out, do = torch.randn(1, 70, 2, 16, device=device), torch.randn(1, 70, 2, 16, device=device)
    lse = torch.zeros(1, 2, 70, device=device)
    q, k_cache, v_cache = (
        torch.randn(*shape, device=device) for shape in ((2, 1, 4, 16), (2, 40, 2, 16), (2, 40, 2, 16))
    )
    lengths = torch.tensor([40, 17], dtype=torch.int32, device=device)
    want = (
        _flash_bwd.backward_delta(out, do, lse),
        flash_decode(q, k_cache, v_cache, lengths, return_lse=True),
    )
    try:
        ab_host_trims.use_s64(way)
        for module in ab_host_trims.CDIV_MODULES:
            assert [module.cdiv(a, b) for a, b in ((1, 64), (64, 64), (65, 64), (0, 7))] == [1, 1, 2, 0]
        got = (
            _flash_bwd.backward_delta(out, do, lse),
            flash_decode(q, k_cache, v_cache, lengths, return_lse=True),
        )
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        ab_host_trims.use_s64("trimmed")
    assert all(module.cdiv is _common.cdiv for module in ab_host_trims.CDIV_MODULES)
    trimmed_launches = ab_host_trims.WAYS_S64["trimmed"][1:]
    assert tuple(getattr(owner, name) for owner, name, _ in ab_host_trims.LAUNCHES) == trimmed_launches
    assert (_flash_bwd._launch_preprocess, decode._launch_split, decode._launch_merge) == trimmed_launches[:3]
    assert all(isinstance(launch, CompiledLaunch) for launch in trimmed_launches)


@pytest.mark.parametrize("way", list(ab_host_trims.WAYS_S89))
def test_session_89s_ways_answer_alike_and_the_trimmed_runs_come_back(way, device):
    """Both ways of `--trims s89` on a windowed fwd+bwd (the portable forward, dq and dK/dV kernels): the same
    out and gradients, and afterwards each tuned kernel's run is the trimmed one again."""
    from kernels import flash_attention

    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 48, 2, 16, device=device, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 48, 2, 16, device=device)

    def fwd_bwd():
        out = flash_attention(q, k, v, causal=True, window=(16, 0))
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), do))

    want = fwd_bwd()
    try:
        ab_host_trims.use_s89(way)
        got = fwd_bwd()
    finally:
        ab_host_trims.use_s89("trimmed")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # (exactly as before: under the interpreter no `run` of their own, so a patch of Autotuner.run reaches them)
    assert tuple(t.__dict__.get("run") for t in ab_host_trims.TUNED) == ab_host_trims.WAYS_S89["trimmed"]


def test_the_modules_switched_are_every_kernels_module_calling_cdiv():
    """A module that imports `cdiv` but is missing from CDIV_MODULES would keep its plain cdiv in both ways."""
    import importlib
    import pathlib

    import kernels

    callers = set()
    for path in pathlib.Path(kernels.__file__).parent.glob("*.py"):
        module = importlib.import_module(f"kernels.{path.stem}")
        if path.stem != "_common" and getattr(module, "cdiv", None) is not None:
            callers.add(module)
    assert callers == set(ab_host_trims.CDIV_MODULES)


def test_measure_reports_the_medians_and_the_per_batch_ratios(monkeypatch):
    """ab_host_trims.measure on stubbed timings: each way's median, and the median of the per-batch ratios,
    which a drift shared by both ways of a batch leaves alone."""
    batches = {"trimmed": [1.0, 2.0, 4.0], "untrimmed": [1.1, 2.2, 4.4]}  # the host's pace drifting 4x
    monkeypatch.setattr(ab_host_trims, "case_fns", lambda path, seqlen, headdim: (None, None))
    monkeypatch.setattr(
        ab_host_trims,
        "alternating_host_ms",
        lambda ways, fns, batches_, calls: {(way, "fwdbwd"): batches[way] for way in ways},
    )
    row = ab_host_trims.measure("s64", "dense", 4096, 128, batches=3, calls=40)
    assert row["trimmed_fwdbwd_ms"] == 2.0 and row["untrimmed_fwdbwd_ms"] == 2.2
    assert row["paired_ratio"] == 1.1 and row["paired_ratio_range"] == [1.1, 1.1]
    assert row["trimmed_fwdbwd_range"] == [1.0, 4.0]


def _dense_inference(fa, q, k, v):
    return fa.flash_attention(q, k, v, causal=True)


def _block_sparse_inference(bs, q, k, v):
    layout = butterfly_layout(q.shape[1], 16, n_factors=1).to(q.device)
    return bs.block_sparse_attention(q, k, v, layout, causal=True)


ROUTED = {
    "s67": (ab_host_trims.FLASH_ATTENTION, "_FlashAttnFunc", _dense_inference),
    "s68": (ab_host_trims.BLOCK_SPARSE, "BlockSparseAttnFunc", _block_sparse_inference),
}


@pytest.mark.parametrize("trims", list(ROUTED))
@pytest.mark.parametrize("way", list(ab_host_trims.INFERENCE_WAYS))
def test_inference_route_ways_route_a_no_grad_call_and_restore_the_rule(trims, way, monkeypatch, device):
    """s67 (flash_attention), s68 (block_sparse_attention): trimmed, a no_grad call skips the autograd
    Function; untrimmed, it goes through it (as before); either way the same output, and the rule comes
    back afterwards."""
    module, function_name, call = ROUTED[trims]
    rule = module.inference_call
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 40, 2, 16, device=device) for _ in range(3))
    with torch.no_grad():
        want = call(module, q, k, v)
    applied = []
    function = getattr(module, function_name)
    real_apply = function.apply
    monkeypatch.setattr(function, "apply", lambda *args: applied.append(1) or real_apply(*args))
    try:
        ab_host_trims.TRIM_SETS[trims](way)
        with torch.no_grad():
            got = call(module, q, k, v)
    finally:
        ab_host_trims.TRIM_SETS[trims]("trimmed")
    assert torch.equal(got, want)
    assert bool(applied) == (way == "untrimmed")
    assert module.inference_call is rule


@pytest.mark.parametrize(
    "path, fn_name",
    [("block_sparse", "fwdbwd"), ("dense", "fwdbwd"), ("decode", "decode"), ("inference", "inference"),
     ("block_sparse_inference", "inference"), ("generate", "generate"), ("generate_block_sparse", "generate")],
)  # fmt: skip
def test_each_path_times_the_call_its_rows_name(path, fn_name):
    assert ab_host_trims.timed_fn_name(path) == fn_name
