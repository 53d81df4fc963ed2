"""The GPU benchmarks' and checks' CPU modes, run as their docstrings say (gloo, torch reference inside).

These scripts mostly run on the GPU machine, where a broken path costs a whole device call; their CPU
modes share the code that sets up shapes, masks, sharding and result files, so CI runs them small.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def _run(cmd: list[str], timeout: int = 240) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["none", "docs", "butterfly", "dropout"])
def test_ring_precision_check_passes_on_cpu(mask, tmp_path):
    """Ring vs one process, every mask route, P = 1 and 2: the script exits non-zero on a miss."""
    out = tmp_path / "precision.json"
    _run([*TORCHRUN, "benchmarks/check_ring_precision.py", "--device", "cpu", "--seqlen", "128", "--nheads", "2",
          "--nheads-kv", "1", "--headdim", "16", "--doc-len", "32", "--mask", mask, "--out", str(out)])  # fmt: skip
    rows = json.load(open(out))["rows"]
    assert {(r["P"], r["layout"]) for r in rows if r["impl"] == "ring"} == {
        (p, layout) for p in (1, 2) for layout in ("zigzag", "contiguous")
    }
    assert all(r["within_kernel_error"] for r in rows if r["impl"] == "ring")


@pytest.mark.slow
def test_ring_benchmark_runs_on_cpu(tmp_path):
    out = tmp_path / "ring.json"
    _run([*TORCHRUN, "benchmarks/bench_ring.py", "--device", "cpu", "--tokens-per-rank", "64", "--nheads", "2",
          "--headdim", "16", "--doc-len", "32", "--modes", "zigzag", "ulysses", "--mask", "none", "docs", "dropout",
          "--warmup", "0", "--reps", "1", "--out", str(out), "--profile", str(tmp_path), "--trace"])  # fmt: skip
    rows = json.load(open(out))["rows"]
    assert len(rows) == 6 and all("error" not in r for r in rows), rows
    for row in rows:  # isolated and back-to-back, ours and the ideal
        assert all(row[f"{k}_ms"] > 0 and row[f"ideal_{k}_ms"] > 0 for k in ("fwdbwd", "fwdbwd_stream")), row
    # rank 0's profile of the first zigzag size, with its timeline
    trace = json.load(open(tmp_path / "ring_profile_zigzag_none_64_x2.trace.json"))
    assert any(e.get("name") == "RingAttention" for e in trace["traceEvents"])


@pytest.mark.slow
def test_long_context_benchmark_runs_on_cpu(tmp_path):
    """One process and two (sequence parallel), through the trainer: the GPU run's code path, tiny."""
    out = tmp_path / "long.json"
    _run([sys.executable, "benchmarks/bench_long_context.py", "--device", "cpu", "--model", "gpt_tiny",
          "--contexts", "128", "--gpus", "1", "2", "--steps", "1", "--warmup", "0", "--out", str(out)])  # fmt: skip
    rows = json.load(open(out))["rows"]
    assert [(r["gpus"], r["status"]) for r in rows] == [(1, "ok"), (2, "ok")], rows


@pytest.mark.slow
def test_lra_throughput_benchmark_runs_on_cpu(tmp_path):
    """The Path-64 row through the experiment's own trainer (one block, one image), timed and projected."""
    out = tmp_path / "lra.json"
    _run([sys.executable, "benchmarks/bench_lra_throughput.py", "--device", "cpu", "--experiments", "path64",
          "--images", "16", "--steps", "2", "--warmup", "1", "--cache-dir", str(tmp_path / "cache"),
          "--override", "model.n_layer=1", "--override", "trainer.batch_size=1", "--out", str(out),
          "--profile", "1"])  # fmt: skip
    (row,) = json.load(open(out))["rows"]
    assert row["status"] == "ok" and row["tokens"] == 64 * 64 and row["configured_max_steps"] == 125_000, row
    assert row["device_busy_ms"] == 0 and row["device_idle_frac"] == 1  # no device here: all host time
    # the projection is the configured steps at the measured step time, plus the evaluations
    steps_h = row["configured_max_steps"] * row["step_ms"] / 1000 / 3600
    evals_h = row["configured_max_steps"] // row["eval_interval"] * row["eval_s"] / 3600
    assert row["projected_h"] == pytest.approx(steps_h + evals_h, rel=1e-6)


def test_decode_benchmark_runs_on_cpu(tmp_path):
    """MHA and GQA points through our kernel (interpreter) and the eager reference, errors recorded."""
    out = tmp_path / "decode.json"
    _run([sys.executable, "benchmarks/bench_decode.py", "--device", "cpu", "--batches", "2", "--cache-lens", "80",
          "--nheads", "4", "--nheads-kv", "4", "2", "--headdim", "16", "--impls", "triton", "eager",
          "--out", str(out)])  # fmt: skip
    rows = json.load(open(out))["rows"]
    assert [(r["nheads_kv"], r["impl"]) for r in rows] == [
        (4, "triton"),
        (4, "eager"),
        (2, "triton"),
        (2, "eager"),
    ]
    assert all("error" not in r and r["max_err"] < 2e-3 and r["ms"] > 0 for r in rows), rows


@pytest.mark.parametrize("layout, read", [("butterfly", 3 / 5), ("random", None)])
def test_decode_benchmark_through_a_layout_on_cpu(tmp_path, layout, read):
    """triton_layout decodes through a block-sparse layout, its error against the reference restricted to
    the last position's row, and records the share of the cache that row reads; without --layout the
    impl is refused."""
    out = tmp_path / "decode.json"
    _run([sys.executable, "benchmarks/bench_decode.py", "--device", "cpu", "--batches", "1", "--cache-lens", "150",
          "--nheads", "4", "--nheads-kv", "2", "--headdim", "16", "--impls", "triton_layout", "--layout", layout,
          "--block", "32", "--density", "0.3", "--out", str(out)])  # fmt: skip
    (row,) = json.load(open(out))["rows"]
    assert row["impl"] == "triton_layout" and row["layout"] == layout and "error" not in row, row
    assert row["max_err"] < 2e-3 and 0 < row["read_fraction"] < 1
    # (of 5 blocks the butterfly's row 4 keeps 4, the diagonal, 3, the band, and 0, 4 ^ 4; 5 and 6 lie past it)
    if read is not None:
        assert row["read_fraction"] == pytest.approx(read)
    refused = subprocess.run(
        [sys.executable, "benchmarks/bench_decode.py", "--device", "cpu", "--impls", "triton_layout"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode != 0 and "--layout" in refused.stderr


@pytest.mark.slow
def test_scaling_benchmark_times_the_phases_on_cpu(tmp_path):
    """One process and FSDP over two (gloo), with the per-phase host times the FSDP study used."""
    out = tmp_path / "scaling.json"
    _run([sys.executable, "benchmarks/bench_scaling.py", "--device", "cpu", "--model", "gpt_tiny", "--seq-len", "64",
          "--gpus", "1", "2", "--strategies", "fsdp", "--fit-models", "--steps", "2", "--warmup", "1", "--phases",
          "--override", "parallel.blocks_per_unit=2",  # FSDP only: the one-process anchor runs without it
          "--run-root", str(tmp_path / "runs"), "--out", str(out)])  # fmt: skip
    rows = json.load(open(out))["rows"]
    assert [(r["strategy"], r["gpus"], r["status"]) for r in rows] == [
        ("single", 1, "ok"),
        ("fsdp", 2, "ok"),
    ], rows
    for r in rows:
        phases = r["phases_ms"]
        assert all(phases[k] > 0 for k in ("forward", "backward", "clip", "optimizer", "step")), phases
        parts = sum(phases[k] for k in ("forward", "backward", "clip", "optimizer", "rest"))
        assert parts == pytest.approx(phases["step"])
        assert "phases_synced_ms" not in r  # no device to sync on a CPU run


def test_fsdp_precision_check_runs_on_cpu(tmp_path):
    """FSDP2's two residual dtypes against fp32, 2 gloo ranks: the fp32 residual is one device's autocast."""
    out = tmp_path / "precision.json"
    _run([*TORCHRUN, "benchmarks/check_fsdp_precision.py", "--device", "cpu", "--model", "gpt_tiny", "--seq-len",
          "64", "--out", str(out)])  # fmt: skip
    rows = {r["variant"]: r for r in json.load(open(out))["rows"]}
    assert list(rows) == ["fp32", "autocast", "fsdp_fp32_residual", "fsdp_bf16_residual"]
    assert rows["fsdp_fp32_residual"]["loss"] == rows["autocast"]["loss"]
    assert 0 < rows["autocast"]["max_rel_grad_err"] < 0.05
