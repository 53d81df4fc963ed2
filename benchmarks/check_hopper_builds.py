"""Build the Gluon Hopper forward (`kernels._flash_fwd_hopper`) for sm_90 on a machine without a GPU.

The kernel never runs under Triton's interpreter, so this is what CI can check of it: every config in
`CONFIGS` (and any given with --config) compiles for sm_90 with Triton's own compiler and bundled ptxas,
causal and full, bf16 and fp16, within the shared memory an H100/H200 block may use, and without
register spills (read from the cubin's resource usage with the bundled cuobjdump: the consumer
warpgroups run at a fixed register budget, and a spill there costs far more than it saves).

    python benchmarks/check_hopper_builds.py --out builds.json
    python benchmarks/check_hopper_builds.py --config 128:64,128,2,2,240   # a candidate
Exit status 1 when a build fails, overflows shared memory or spills.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SMEM_LIMIT = 232448  # bytes a block may use on an H100/H200


def stack_bytes(cubin: bytes) -> int | None:
    """Per-thread stack (spilled registers and the like) of the cubin's kernel, from cuobjdump."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    match = re.search(r"STACK:(\d+)", usage)
    return int(match.group(1)) if match else None


def build(headdim: int, cfg, causal: bool, dtype) -> dict:
    import torch

    from benchmarks.check_kernel_builds import compile_kernel
    from kernels import _flash_fwd_hopper as hopper

    result = dict(headdim=headdim, config=str(cfg), causal=causal, dtype=str(dtype).removeprefix("torch."))
    start = time.time()
    try:
        q = torch.randn(2, 1000, 4, headdim, dtype=dtype)  # a length that is no multiple of any tile
        lse = torch.empty(2, 4, 1000)
        args = [
            hopper.descriptor(q, cfg.block_m), hopper.descriptor(q, cfg.block_n),
            hopper.descriptor(q, cfg.block_n), hopper.descriptor(q, cfg.block_m),
            lse, lse.stride(0), lse.stride(1), 1000, 1000, 2, 0.18, 264,
        ]  # fmt: skip
        meta = dict(
            CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
            PRODUCER_REGS=cfg.producer_regs, num_warps=4,
        )  # fmt: skip
        compiled = compile_kernel(hopper._attn_fwd_hopper, args, meta)
        shared, stack = compiled.metadata.shared, stack_bytes(compiled.asm["cubin"])
        if shared > SMEM_LIMIT:
            status = "over shared memory"
        elif stack:
            status = "spills"
        else:
            status = "ok"
        result.update(status=status, shared=shared, stack=stack, warps=compiled.metadata.num_warps)
    except Exception as e:  # noqa: BLE001  (the point is to report whatever the compiler raises)
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        result.update(status="error", error=f"{type(e).__name__}: {' | '.join(lines[-3:])[:400]}")
    result["seconds"] = round(time.time() - start, 1)
    return result


def parse_config(text: str):
    from kernels._flash_fwd_hopper import HopperFwdConfig

    headdim, fields = text.split(":")
    return int(headdim), HopperFwdConfig(*(int(x) for x in fields.split(",")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--config", action="append", default=[],
        help="HEADDIM:block_m,block_n,consumers,stages,consumer_regs[,producer_regs] instead of CONFIGS",
    )  # fmt: skip
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: this process compiles for the GPU")
    import torch

    from kernels._flash_fwd_hopper import CONFIGS

    configs = [parse_config(c) for c in args.config] or sorted(CONFIGS.items())
    results = []
    for headdim, cfg in configs:
        for causal in (True, False):
            for dtype in (torch.bfloat16, torch.float16):
                results.append(build(headdim, cfg, causal, dtype))
                r = results[-1]
                print(f"{r['status']:>18}  d{headdim} {cfg} causal={causal} {r['dtype']}: "
                      f"{r.get('shared', '-')} B shared, stack {r.get('stack', '-')}, {r['seconds']} s"
                      + (f"  {r['error']}" if "error" in r else ""), flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": "sm_90", "results": results}, f, indent=1)
    sys.exit(0 if all(r["status"] == "ok" for r in results) else 1)


if __name__ == "__main__":
    main()
