"""Every tile config our autotuners would try at representative shapes builds for Hopper (sm_90).

Triton's compiler runs on CPU, so a config that fails to compile (an MLIR pass, ptxas, a refused
global) is found here instead of inside a GPU call. `benchmarks/check_kernel_builds.py` records the
kernel launches of the public API under the interpreter, then compiles each launch for every config its
autotuner would try at that shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "benchmarks", "check_kernel_builds.py")
pytestmark = pytest.mark.slow


def run_tool(tmp_path, *args) -> tuple[int, list[dict]]:
    env = {
        k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"
    }  # this process compiles for the GPU
    out = tmp_path / "builds.json"
    proc = subprocess.run(
        [sys.executable, TOOL, "--jobs", "2", "--out", str(out), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())["results"]


def test_every_config_of_every_case_builds_for_sm90(tmp_path):
    rc, results = run_tool(tmp_path)
    errors = [r for r in results if r["status"] == "error"]
    assert not errors, "\n".join(f"{r['case']} {r['kernel']} {r['config']}: {r['error']}" for r in errors)
    assert rc == 0
    cases = {r["case"] for r in results}
    assert {
        "dense_causal",
        "dense_d256",
        "dense_d16",
        "dense_d32",
        "dense_d160",
        "dropout",
        "dropout_varlen",
        "varlen",
        "block_sparse",
        "decode",
        "fp32_window_gqa",
    } <= cases
    kernels = {r["kernel"] for r in results}
    assert {"_attn_fwd", "_bwd_dkdv", "_bwd_dq", "_decode_split"} <= kernels
    # the dense kernels are built once per autotuner config, not only the interpreter's one config
    fwd_configs = {r["config"] for r in results if r["kernel"] == "_attn_fwd" and r["case"] == "dense_causal"}
    assert len(fwd_configs) >= 5
    # fp32 calls (tests') try two tiles a kernel: ptxas took minutes over all of them
    fp32 = [
        r["kernel"] for r in results if r["case"] == "fp32_window_gqa" and r["kernel"] != "_bwd_preprocess"
    ]
    assert sorted(fp32) == sorted(["_attn_fwd", "_bwd_dq", "_bwd_dkdv"] * 2)
    assert all(r["shared"] > 0 for r in results if r["status"] == "ok")


def test_every_dropout_config_builds_and_a_rejected_candidate_is_reported(tmp_path):
    """With every config (pruning off) the dropout kernels build: dk/dv 32x64 / 8 warps / 2 stages once
    failed Triton 3.6's TritonGPUOptimizeThreadLocality pass with an earlier dropout draw (four per Philox
    call, spread over the tile by joins in another order). A candidate the compiler refuses
    (`--try-config`; a tile side that is not a power of two) is reported with the compiler's reason and
    exit status 1."""
    rc, results = run_tool(
        tmp_path, "--cases", "dropout", "--all-configs", "--try-config", "_bwd_dkdv:32,48,4,2"
    )
    errors = {(r["kernel"], r["config"]) for r in results if r["status"] == "error"}
    assert errors == {("_bwd_dkdv", "{'BLOCK_M': 32, 'BLOCK_N': 48} w4 s2")}
    assert "power of 2" in next(r["error"] for r in results if r["status"] == "error")
    assert any(r["config"] == "{'BLOCK_M': 32, 'BLOCK_N': 64} w8 s2" and r["status"] == "ok" for r in results)
    assert rc == 1
