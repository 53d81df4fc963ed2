"""Build the Gluon Hopper kernels (`kernels._flash_fwd_hopper`, `_flash_dq_hopper`, `_flash_dkdv_hopper`)
for sm_90 on a machine without a GPU.

They never run under Triton's interpreter, so this is what CI can check of them: every config in each
module's `CONFIGS` (and any given with --config) compiles for sm_90 with Triton's own compiler and
bundled ptxas, causal and full, bf16 and fp16, within the shared memory an H100/H200 block may use, and
without register spills inside a loop: the consumer warpgroups run at a fixed register budget, and a
spill in their loops costs far more than it saves. The cubin's stack (cuobjdump's resource usage) says
whether anything spilled; its SASS says where: a local load or store (LDL/STL) between a conditional
backward branch and its target is inside a loop (a persistent kernel's loop over work items, which
holds the key-tile loops, does not count: a spill there costs once per item). A spill outside every
loop (the dK/dV kernel's causal build at head dim 128 keeps one register there, 8 bytes of stack) is
reported, not failed.

    python benchmarks/check_hopper_builds.py --out builds.json
    python benchmarks/check_hopper_builds.py --config fwd:128:64,128,2,2,240   # a candidate (fwd, dq, dkdv)
    python benchmarks/check_hopper_builds.py --fused   # the one-kernel backward's builds, dense and block-sparse
                                                       # (their spills reported)
Exit status 1 when a build fails, overflows shared memory or spills inside a loop.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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
# SASS of a programmatic dependent launch's two PTX instructions (griddepcontrol.launch_dependents, .wait)
GRID_DEPENDENCY_OPS = {"launch_dependents": r"\bPREEXIT\b", "wait_for_prior_grid": r"\bACQBULK\b"}


@functools.lru_cache(maxsize=4)  # (a build's SASS is read for its spills and, ordered, its semaphore adds)
def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def stack_bytes(cubin: bytes) -> int | None:
    """Per-thread stack (spilled registers and the like) of the cubin's kernel, from cuobjdump."""
    usage = _cuobjdump(cubin, "--dump-resource-usage")
    match = re.search(r"STACK:(\d+)", usage or "")
    return int(match.group(1)) if match else None


def semaphore_adds(cubin: bytes) -> tuple[int, int] | None:
    """(global adds, those not right after a GPU-wide memory barrier) in the kernel's SASS: the ordered
    one-kernel backward's semaphore counts (REDG, not the TMA's UTMAREDG) must be release adds, a
    MEMBAR.*.GPU among the 3 instructions before each (`kernels._flash_bwd_fused_hopper._releaser`)."""
    sass = _cuobjdump(cubin, "-sass")
    if sass is None:
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    adds = [i for i, op in enumerate(ops) if re.search(r"\bREDG?\.", op) or re.search(r"\bATOMG?\.", op)]
    bare = [i for i in adds if not any(re.search(r"MEMBAR\.\w+\.GPU", op) for op in ops[max(i - 3, 0) : i])]
    return len(adds), len(bare)


def turn_barriers(cubin: bytes) -> int | None:
    """Waits and arrivals on named barriers 8 and 9 in the kernel's SASS: the forward's turns
    (`kernels._flash_fwd_hopper.wait_turn`), present in a build with PINGPONG and in no other."""
    sass = _cuobjdump(cubin, "-sass")
    if sass is None:
        return None
    return len(re.findall(r"\bBAR\.(?:SYNC(?:\.DEFER_BLOCKING)?|ARV) 0x[89],", sass))


def grid_dependency_controls(cubin: bytes) -> dict | None:
    """The kernel's SASS instructions of a programmatic dependent launch by kind (`launch_dependents`,
    `wait_for_prior_grid` in `kernels._hopper_pipeline`): none in a build without PDL."""
    sass = _cuobjdump(cubin, "-sass")
    if sass is None:
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    return {
        name: sum(bool(re.search(pattern, op)) for op in ops) for name, pattern in GRID_DEPENDENCY_OPS.items()
    }


def spills_in_loops(cubin: bytes) -> int | None:
    """Local loads and stores (LDL/STL: spilled registers) inside a loop of the kernel's SASS, a loop
    being the code between a conditional backward branch and its target. (Unconditional backward
    branches are the compiler's out-of-line blocks jumping back, not loops.)"""
    sass = _cuobjdump(cubin, "-sass")
    if sass is None:
        return None
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    spills = [addr for addr, op in code if re.search(r"\b(LDL|STL)\b", op)]
    loops = []
    for addr, op in code:
        branch = re.match(r"@!?U?P\w+\s+BRA\s+(?:`\(\.L_x_\d+\)\s+)?0x([0-9a-f]+)", op.strip())
        if branch and int(branch.group(1), 16) < addr:
            loops.append((int(branch.group(1), 16), addr))
    # A persistent kernel's loop over work items holds the key-tile loops (loops that issue wgmma,
    # HGMMA in SASS); a value spilled there costs a load and a store per item, not per key tile, so
    # only spills inside some other loop count.
    mma = [addr for addr, op in code if "HGMMA" in op]
    inner_mma = [o for o in loops if any(o[0] <= a <= o[1] for a in mma)]
    item_loops = {
        loop for loop in loops if any(o != loop and loop[0] <= o[0] and o[1] <= loop[1] for o in inner_mma)
    }
    counted = [loop for loop in loops if loop not in item_loops]
    return sum(any(lo <= a <= hi for lo, hi in counted) for a in spills)


def build(kernel: str, headdim: int, cfg, causal: bool, dtype, sparse: bool = False, part: int = 0) -> dict:
    """Compile one config of `kernel` ("fwd", "dq", "dkdv", "fused", "fused_ordered", the one-kernel
    backward with its dQ adds in a fixed order, "fused_convoy", in the convoy order, or "fused_convoy_down",
    the causal convoy walking its tiles from the last) for sm_90, dense
    or block-sparse (walking tile lists, `kernels._block_sparse_hopper`); part: the dK/dV kernel's pass
    (`_flash_dkdv_hopper.passes`); the dq and dK/dV kernels with PDL as the two-kernel backward launches them
    (`_flash_dkdv_hopper.DEPENDENT_AFTER_DQ`, the dK/dV kernel's first pass); never raises."""
    import torch

    from benchmarks.check_kernel_builds import compile_kernel
    from kernels import _flash_bwd_fused_hopper as fused_hopper
    from kernels import _flash_dkdv_hopper as dkdv_hopper
    from kernels import _flash_dkdv_persistent_hopper as persistent_dkdv
    from kernels import _flash_dq_hopper as dq_hopper
    from kernels import _flash_fwd_hopper as hopper
    from kernels import _hopper_pipeline as pipeline

    result = dict(kernel=kernel, headdim=headdim, config=str(cfg), causal=causal,
                  dtype=str(dtype).removeprefix("torch."), sparse=sparse, part=part)  # fmt: skip
    start = time.time()
    ordered = kernel in ("fused_ordered", "fused_convoy", "fused_convoy_down")  # (the one-kernel backward's)
    if kernel == "dkdv":  # (the dV pass may stream larger query tiles)
        cfg = cfg.for_pass(part)
    try:
        q = torch.randn(2, 1000, 4, headdim, dtype=dtype)  # a length that is no multiple of any tile
        lse = torch.empty(2, 4, 1000)
        rows, keys = pipeline.descriptor(q, cfg.block_m), pipeline.descriptor(q, cfg.block_n)
        if kernel == "fwd":
            jit = hopper._attn_fwd_hopper
            args = [rows, keys, keys, rows, lse, lse.stride(0), lse.stride(1), 1000, 1000, 2, 0.18, 264]
        elif kernel.startswith("fused"):  # (its dq view's blocks are half a head wide)
            # (a causal convoy block of 8 and kv_repeat 2, not 1, which Triton would build as constants: the
            # general build)
            jit = fused_hopper._attn_bwd_fused_hopper
            # (1000 queries, a multiple of 8: the ordered builds' dq view of rows paired unless
            # FLASHTRAIN_PAIRED_DQ_ROWS=0)
            dq_view = fused_hopper.dq_view(torch.zeros(2, 1000, 4, headdim), cfg.block_m, ordered)
            result["dq_rows_paired"] = isinstance(dq_view, pipeline.TmaView)
            halves = pipeline.descriptor(dq_view, cfg.block_m)
            args = [rows, keys, keys, rows, keys, keys, halves, lse, lse, lse.stride(0), lse.stride(1), 1000, 1000,
                    2, 2, 0.18, 0.125, 264, torch.zeros(16, dtype=torch.int32), 2, 8]  # fmt: skip
        elif kernel == "dkdv":
            jit = dkdv_hopper._attn_bwd_dkdv_hopper
            args = [rows, keys, keys, rows, keys, keys, lse, lse, lse.stride(0), lse.stride(1), 1000, 1000, 2,
                    0.18, 0.125, 264]  # fmt: skip
        else:
            jit = dq_hopper._attn_bwd_dq_hopper
            args = [rows, rows, keys, keys, rows, q, lse, lse, q.stride(0), q.stride(1), q.stride(2),
                    lse.stride(0), lse.stride(1), 1000, 1000, 2, 0.18, 0.125, 264]  # fmt: skip
        # tile lists and their counts (the one-kernel backward: and ranks, shaped as the lists), then (layout
        # heads, list rows, list length); a dense build gets placeholders, never read
        if sparse:
            lists, shape = (
                [torch.zeros(1, 8, 16, dtype=torch.int32), torch.ones(1, 8, 2, dtype=torch.int32)],
                [4, 8, 16],
            )
        else:
            lists, shape = [lse, lse], [1, 1, 1]
        args += lists + (lists[:1] if kernel.startswith("fused") else []) + shape
        if cfg.persistent:  # a persistent variant: the grid it walks
            jit = {
                "fwd": hopper._attn_fwd_hopper_persistent,
                "dq": dq_hopper._attn_bwd_dq_hopper_persistent,
                "dkdv": persistent_dkdv._attn_bwd_dkdv_hopper_persistent,
            }[kernel]
            args += [8, 4, 2]
        meta = dict(
            SPARSE=sparse, CAUSAL=causal, NUM_CONSUMERS=cfg.consumers, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
            PRODUCER_REGS=cfg.producer_regs, num_warps=4,
        )  # fmt: skip
        if kernel == "dkdv":
            meta["PART"] = part
        if kernel in ("dq", "dkdv"):
            first_pass = kernel == "dq" or part == dkdv_hopper.passes(headdim)[0]
            result["pdl"] = meta["PDL"] = dkdv_hopper.DEPENDENT_AFTER_DQ and first_pass
        if kernel.startswith("fused"):
            meta["ORDERED"] = ordered
            meta["CONVOY"] = kernel.startswith("fused_convoy")
            meta["DOWN"] = kernel == "fused_convoy_down"
            meta["FIRST_STORES"] = meta["ORDERED"] and fused_hopper.FIRST_STORES  # (the default route's)
        if cfg.v_stages:  # (the forward's K and V rings of their own)
            meta["V_STAGES"] = cfg.v_stages
        if kernel == "fwd" and cfg.pingpong:  # (the forward's consumers taking turns, `wait_turn`)
            meta["PINGPONG"] = True
        compiled = compile_kernel(jit, args, meta)
        cubin = compiled.asm["cubin"]
        shared, stack = compiled.metadata.shared, stack_bytes(cubin)
        in_loops = spills_in_loops(cubin) if stack else 0
        if shared > SMEM_LIMIT:
            status = "over shared memory"
        elif in_loops or in_loops is None:  # (None: no cuobjdump to say where a spill is)
            status = "spills"
        else:
            status = "ok"
        result.update(status=status, shared=shared, stack=stack, spills_in_loops=in_loops,
                      warps=compiled.metadata.num_warps)  # fmt: skip
        if kernel == "fwd":
            result["turn_barriers"] = turn_barriers(cubin)
        if kernel in ("dq", "dkdv"):
            result["grid_dependency_controls"] = grid_dependency_controls(cubin)
        if meta.get("ORDERED"):
            counts = semaphore_adds(cubin) or (None, None)
            result["semaphore_adds"], result["semaphore_adds_without_release"] = counts
    except Exception as e:  # noqa: BLE001  (the point is to report whatever the compiler raises)
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        result.update(status="error", error=f"{type(e).__name__}: {' | '.join(lines[-3:])[:400]}")
    result["seconds"] = round(time.time() - start, 1)
    return result


def parse_config(text: str):
    """KERNEL:HEADDIM:fields -> (kernel, headdim, config)."""
    from kernels._flash_dkdv_hopper import HopperDkdvConfig
    from kernels._flash_dq_hopper import HopperDqConfig
    from kernels._flash_fwd_hopper import HopperFwdConfig

    kernel, headdim, fields = text.split(":")
    cls = {"fwd": HopperFwdConfig, "dq": HopperDqConfig, "dkdv": HopperDkdvConfig}[kernel]
    return kernel, int(headdim), cls(*(int(x) for x in fields.split(",")))  # (bools as 0 / 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--config", action="append", default=[],
        help="KERNEL:HEADDIM:block_m,block_n,consumers,stages,consumer_regs[,producer_regs[,persistent[,v_stages"
        "[,dv_block_m,dv_stages]]]] (KERNEL fwd, dq or dkdv; the fields of its config class in order: v_stages the "
        "forward's V ring, the last two the dK/dV kernel's dV pass) instead of the CONFIGS",
    )  # fmt: skip
    parser.add_argument(
        "--fused", action="store_true",
        help="build the one-kernel backward's configs (kernels._flash_bwd_fused_hopper, also with ordered dQ adds, "
        "full attention) alone; its builds spill "
        "(tests/kernels/test_flash_bwd_fused_hopper.py records how much), so only a failed build or one over shared "
        "memory fails",
    )  # fmt: skip
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: this process compiles for the GPU")
    import torch

    from kernels import _block_sparse_hopper, _flash_dkdv_hopper, _flash_dq_hopper, _flash_fwd_hopper

    # (kernel, head dim, config, build it dense, build it block-sparse): the dense modules' CONFIGS and
    # the block-sparse path's (`kernels._block_sparse_hopper.CONFIGS`, which shares some of them)
    sparse_configs = {
        (kernel, d, cfg)
        for d, cfgs in _block_sparse_hopper.CONFIGS.items()
        for kernel, cfg in zip(("fwd", "dq", "dkdv"), cfgs, strict=True)
    } | {
        (kernel, d, cfg)
        for kernel, table in (
            ("fwd", _block_sparse_hopper.PERSISTENT_FORWARD),
            ("dq", _block_sparse_hopper.PERSISTENT_DQ),
            ("dkdv", _block_sparse_hopper.PERSISTENT_DKDV),
        )
        for d, (cfg, _) in table.items()
    }
    dense_configs = [parse_config(c) for c in args.config] or [
        (kernel, d, cfg)
        for kernel, module in (
            ("fwd", _flash_fwd_hopper),
            ("dq", _flash_dq_hopper),
            ("dkdv", _flash_dkdv_hopper),
        )
        for d, cfg in sorted(module.CONFIGS.items())
    ]
    if not args.config:  # the persistent variants, and the forward's configs whose consumers take turns
        dense_configs += [
            (kernel, d, cfg)
            for kernel, module in (("fwd", _flash_fwd_hopper), ("dq", _flash_dq_hopper))
            for d, cfg in sorted(module.PERSISTENT_CONFIGS.items())
        ] + [("fwd", d, cfg) for d, cfg in sorted(_flash_fwd_hopper.PINGPONG_CONFIGS.items())]
    if args.fused:
        from kernels import _flash_bwd_fused_hopper

        dense_configs = [
            (kernel, d, cfg)
            for kernel in ("fused", "fused_ordered", "fused_convoy", "fused_convoy_down")
            for d, cfg in sorted(_flash_bwd_fused_hopper.CONFIGS.items())
        ]
        # (block-sparse lists: either order of adds, no convoy)
        sparse_configs = [c for c in dense_configs if c[0] in ("fused", "fused_ordered")]
    configs = [(*c, True, c in sparse_configs) for c in dense_configs]
    if not args.config and not args.fused:
        configs += [(*c, False, True) for c in sorted(sparse_configs, key=str) if c not in dense_configs]
    results = []
    for kernel, headdim, cfg, dense, listed in configs:
        for sparse in [s for s, wanted in ((False, dense), (True, listed)) if wanted]:
            parts = _flash_dkdv_hopper.passes(headdim) if kernel == "dkdv" else (0,)
            causals = (True,) if kernel == "fused_convoy_down" else (True, False)  # (a causal order alone)
            for part, causal, dtype in itertools.product(parts, causals, (torch.bfloat16, torch.float16)):
                results.append(build(kernel, headdim, cfg, causal, dtype, sparse, part))
                r = results[-1]
                print(f"{r['status']:>18}  {kernel}{f' pass {part}' if part else ''} d{headdim} {cfg} "
                      f"{'sparse' if sparse else 'dense'} "
                      f"causal={causal} {r['dtype']}: "
                      f"{r.get('shared', '-')} B shared, stack {r.get('stack', '-')} "
                      f"({r.get('spills_in_loops', '-')} spill instructions in loops), {r['seconds']} s"
                      + (f"  {r['error']}" if "error" in r else ""), flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": "sm_90", "results": results}, f, indent=1)
    passing = ("ok", "spills") if args.fused else ("ok",)
    sys.exit(0 if all(r["status"] in passing for r in results) else 1)


if __name__ == "__main__":
    main()
