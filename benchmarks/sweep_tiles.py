"""Times each FlashAttention kernel alone under forced tile configs, with the registers and spills ptxas
gave it: the numbers behind a choice of autotune candidates.

Triton 3.6 on Hopper waits for the score wgmmas of the attention loops right after issuing them, so a
warp group's softmax never overlaps its own score matmuls; what overlaps them is other resident thread
blocks.
Registers per thread decide how many fit (65,536 per SM), which is why `maxnreg` is swept too.

    python benchmarks/sweep_tiles.py --shape 2,8192,16,64,causal --kernel dkdv \\
        --configs "64,64,4,3 64,64,4,3,168 32,64,4,3" --out sweep.json

A config is BLOCK_M,BLOCK_N,WARPS,STAGES[,MAXNREG]. The kernels' own candidate lists are swept when
--configs is left out. Compiles run first in --jobs processes (they fill Triton's disk cache); the
timing runs one at a time in this process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.check_kernel_builds import parse_tile_config  # noqa: E402
from benchmarks.check_kernel_configs import KERNELS, kernel_tuner  # noqa: E402
from benchmarks.common import time_ms, versions, write_results  # noqa: E402

MATMULS = {"fwd": 2, "dkdv": 4, "dq": 3}  # per (query tile, key tile) pair


def parse_shape(text: str) -> dict:
    """'batch,seqlen,nheads,headdim[,causal]' -> dict."""
    parts = text.split(",")
    try:
        b, n, h, d = (int(x) for x in parts[:4])
    except ValueError:
        raise SystemExit(f"--shape {text!r}: write batch,seqlen,nheads,headdim[,causal]") from None
    if parts[4:] not in ([], ["causal"]):
        raise SystemExit(f"--shape {text!r}: the fifth field can only be 'causal'")
    return {"batch": b, "seqlen": n, "nheads": h, "headdim": d, "causal": parts[4:] == ["causal"]}


def parse_config(text: str):
    config = parse_tile_config(text)
    if config is None:
        raise SystemExit(f"config {text!r}: write BLOCK_M,BLOCK_N,WARPS,STAGES[,MAXNREG]")
    return config


def config_text(c) -> str:
    text = f"{c.kwargs['BLOCK_M']},{c.kwargs['BLOCK_N']},{c.num_warps},{c.num_stages}"
    return text + (f",{c.maxnreg}" if c.maxnreg else "")


_TUNERS: dict = {}  # kernel -> (its autotuner, the JIT function's own run), as imported


def _tuner(kernel: str):
    if not _TUNERS:
        for name in KERNELS:
            tuner = kernel_tuner(name)
            _TUNERS[name] = (tuner, tuner.fn.run)
    return _TUNERS[kernel][0]


class _Skipped:
    """Stands in for an autotuned kernel that the measurement leaves out: `k[grid](...)` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _runner(kernel: str, shape: dict):
    """A function launching `kernel` alone on fresh bf16 inputs of `shape` (the backward's other
    kernel skipped), and the launched kernels' flop count in matmul terms."""
    import torch

    from kernels import _flash_bwd
    from kernels._flash_fwd import flash_attn_forward

    b, n, h, d = shape["batch"], shape["seqlen"], shape["nheads"], shape["headdim"]
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    win = dict(win_left=None, win_right=0 if shape["causal"] else None)
    common = dict(sm_scale=d**-0.5, key_padding_mask=None, dropout_p=0.0, seed=0, **win)
    out, lse = flash_attn_forward(q, k, v, **common)
    _flash_bwd._bwd_dkdv_tuned, _flash_bwd._bwd_dq_tuned = _tuner("dkdv"), _tuner("dq")
    if kernel == "fwd":
        fn = lambda: flash_attn_forward(q, k, v, **common)  # noqa: E731
    else:
        other = "_bwd_dq_tuned" if kernel == "dkdv" else "_bwd_dkdv_tuned"
        setattr(_flash_bwd, other, _Skipped())
        fn = lambda: _flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **common)  # noqa: E731
    flops = 2.0 * b * h * n * n * d * MATMULS[kernel] / (2 if shape["causal"] else 1)
    return fn, flops


def _force(kernel: str, config) -> dict:
    """Make the kernel's autotuner run `config` only; returns a dict that records the compiled kernel."""
    tuner = _tuner(kernel)
    tuner.configs = [config]
    seen = {}
    base_run = _TUNERS[kernel][1]

    def recording_run(*args, **kwargs):
        seen["kernel"] = base_run(*args, **kwargs)
        return seen["kernel"]

    tuner.fn.run = recording_run
    return seen


def compile_one(job) -> str | None:
    """In a worker: build (and run once) one config, so the timing process finds it in the cache."""
    kernel, shape, text = job
    try:
        seen = _force(kernel, parse_config(text))
        fn, _ = _runner(kernel, shape)
        fn()
        import torch

        torch.cuda.synchronize()
        return None if "kernel" in seen else "not launched"
    except Exception as e:  # noqa: BLE001  (reported per config; the sweep goes on)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}"


def measure(kernel: str, shape: dict, text: str) -> dict:
    row = {"kernel": kernel, **shape, "config": text}
    try:
        seen = _force(kernel, parse_config(text))
        fn, flops = _runner(kernel, shape)
        fn()
        ms = time_ms(fn)
    except Exception as e:  # noqa: BLE001
        return {**row, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
    compiled = seen.get("kernel")
    return {
        **row,
        "ms": ms,
        "tflops": flops / ms * 1e-9,
        "n_regs": getattr(compiled, "n_regs", None),
        "n_spills": getattr(compiled, "n_spills", None),
        "shared": compiled.metadata.shared if compiled is not None else None,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", action="append", required=True, help="batch,seqlen,nheads,headdim[,causal]"
    )
    parser.add_argument("--kernel", choices=KERNELS, action="append", required=True)
    parser.add_argument(
        "--configs", default=None, help="space-separated BLOCK_M,BLOCK_N,WARPS,STAGES[,MAXNREG]"
    )
    parser.add_argument("--jobs", type=int, default=8, help="processes compiling in parallel")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shape]
    jobs = []
    for kernel in args.kernel:
        texts = args.configs.split() if args.configs else [config_text(c) for c in _tuner(kernel).configs]
        jobs += [(kernel, shape, t) for shape in shapes for t in texts]
    # one compile per (kernel, config, head dim, causal): the sequence length does not change the build
    builds = {(k, s["headdim"], s["causal"], t): (k, s, t) for k, s, t in jobs}
    # spawned, not forked: each worker opens its own CUDA context
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = dict(zip(builds, pool.map(compile_one, builds.values()), strict=True))
    rows = []
    for kernel, shape, text in jobs:
        error = failed[(kernel, shape["headdim"], shape["causal"], text)]
        row = measure(kernel, shape, text) if error is None else {"kernel": kernel, **shape, "config": text,
                                                                  "error": error}  # fmt: skip
        rows.append(row)
        detail = row.get("error") or (
            f"{row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s regs {row['n_regs']} spills {row['n_spills']}"
        )
        print(f"{kernel:4s} {shape} {text:16s} {detail}", flush=True)
    if args.out:
        write_results(args.out, rows, {"args": vars(args)})
    else:
        print(json.dumps(versions()))


if __name__ == "__main__":
    main()
