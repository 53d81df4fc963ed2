"""Build every tile config of our kernels for a Hopper GPU, on a machine without one.

GPU time is short, and three of its calls ended in compile errors that were there to be found without a
GPU: a dropout tile config that fails an MLIR pass, warp-specialised configs that fail another, and a
global the compiler refuses. Triton's compiler runs on CPU (source -> TTIR -> TTGIR -> LLVM -> PTX ->
cubin with the bundled ptxas), so this tool builds what the GPU would build:

1. In a child process under the interpreter, representative calls of the public kernels (dense causal /
   full, window, padding mask, dropout, varlen, GQA, block-sparse, decode; forward and backward) run on
   small CPU tensors, and every kernel launch is recorded: the kernel, its arguments (tensors as dtype and
   alignment only) and its meta-parameters.
2. Here, without the interpreter, each launch's kernel is compiled for `--arch` (default sm_90) once per
   tile config its autotuner would try at that launch's shape (the GPU config list, through the kernel's
   own pruning), or with its fixed config. A config is "ok" (with its shared memory, flagged when above
   the GPU's limit: the autotuner skips those at run time) or fails with the compiler's error.

    python benchmarks/check_kernel_builds.py --out results.json          # all cases, a few minutes
    python benchmarks/check_kernel_builds.py --cases dense_causal --jobs 2
    python benchmarks/check_kernel_builds.py --cases dropout --try-config _bwd_dkdv:64,96,8,2  # a candidate
Exit status 1 when any config fails to compile for a reason other than shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMEM_LIMIT = {90: 232448, 80: 166912}  # bytes a block may use (H100/H200, A100), as the driver reports


# ---- phase 1: record launches under the interpreter ------------------------------------------------------


def _cases():
    """name -> a function running the public kernels on small CPU tensors (forward and backward)."""
    import torch

    import kernels

    def qkv(b=1, n=96, h=2, hkv=None, d=64, dtype=torch.float16):
        q = torch.randn(b, n, h, d, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, n, hkv or h, d, dtype=dtype, requires_grad=True) for _ in range(2))
        return q, k, v

    def dense(d=64, **kw):
        def run():
            q, k, v = qkv(d=d, hkv=kw.pop("hkv", None))
            kernels.flash_attention(q, k, v, **kw).sum().backward()

        return run

    def fp32_window_gqa():
        # test_flash_attention's fp32 window case, which ran past 150 s on an H200 twice (session 69)
        q = torch.randn(1, 127, 2, 40, dtype=torch.float32, requires_grad=True)
        k, v = (torch.randn(1, 129, 1, 40, dtype=torch.float32, requires_grad=True) for _ in range(2))
        out, lse = kernels.flash_attention(q, k, v, window=(16, 8), return_lse=True)
        (out.sum() + lse.sum()).backward()

    def padded():
        q, k, v = qkv()
        keep = torch.ones(1, 96, dtype=torch.bool)
        keep[:, 70:] = False
        kernels.flash_attention(q, k, v, causal=False, key_padding_mask=keep).sum().backward()

    def varlen(**kw):
        def run():
            q, k, v = (t[0].detach().requires_grad_() for t in qkv())
            cu = torch.tensor([0, 40, 96], dtype=torch.int32)
            kernels.flash_attention_varlen(q, k, v, cu, cu, 56, 56, causal=True, **kw).sum().backward()

        return run

    def block_sparse():
        q, k, v = qkv(n=256)
        layout = kernels.layouts.butterfly_layout(256, 64)
        kernels.block_sparse_attention(q, k, v, layout).sum().backward()

    def decode():
        q = torch.randn(1, 1, 2, 64, dtype=torch.float16)
        k, v = (torch.randn(1, 200, 2, 64, dtype=torch.float16) for _ in range(2))
        kernels.flash_decode(q, k, v, torch.tensor([150], dtype=torch.int32), causal=True)

    def decode_layout():
        # a block-sparse model's decode step: one pattern (MHA), and a pattern per head under GQA
        k, v = (torch.randn(1, 256, 2, 64, dtype=torch.float16) for _ in range(2))
        lengths = torch.tensor([200], dtype=torch.int32)
        shared = kernels.layouts.butterfly_layout(256, 64, causal=True)
        kernels.flash_decode(torch.randn(1, 1, 2, 64, dtype=torch.float16), k, v, lengths, layout=shared)
        per_head = kernels.layouts.random_layout(256, 64, 0.5, nheads=4, causal=True)
        q = torch.randn(1, 1, 4, 64, dtype=torch.float16)
        kernels.flash_decode(q, k, v, lengths, causal=True, layout=per_head)

    cases = {
        "dense_causal": dense(causal=True),
        "dense_full": dense(causal=False),
        "dense_d128_gqa": dense(d=128, causal=True, hkv=1),
        "dense_d256": dense(d=256, causal=True),
        # every head-dim class the API takes: ptxas died on 32-wide key tiles of the forward at d16 and d32
        "dense_d16": dense(d=16, causal=False),
        "dense_d32": dense(d=32, causal=True),
        "dense_d40": dense(d=40, causal=True),
        "dense_d80": dense(d=80, causal=True),
        "dense_d96": dense(d=96, causal=True),
        "dense_d160": dense(d=160, causal=True),
        "window": dense(causal=True, window=(32, 0)),
        "fp32_window_gqa": fp32_window_gqa,
        "dropout": dense(causal=True, dropout_p=0.1),
        "dropout_d128": dense(d=128, causal=True, dropout_p=0.1),
        "padding_mask": padded,
        "varlen": varlen(),
        # packed keys start anywhere, so these kernels keep the path for tiles inside a 32-column span
        "dropout_varlen": varlen(dropout_p=0.1),
        "block_sparse": block_sparse,
        "decode": decode,
        "decode_layout": decode_layout,
    }
    return cases


def _describe(value):
    """A launch argument as something picklable that rebuilds into an equivalent argument."""
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16 == 0)
    return ("value", value)


def record(case_names: list[str], out_path: str) -> None:
    """Run the cases (all when none are named) under the interpreter; pickle (the case names,
    [(case, kernel module, kernel name, args, kwargs)])."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    launches, seen = [], set()
    current = {"case": None}
    original = InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        meta = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        fn = self.fn
        launch = (current["case"], fn.__module__, fn.__name__, [_describe(a) for a in args], meta)
        key = repr(launch)
        if key not in seen:
            seen.add(key)
            launches.append(launch)
        return original(self, *args, **kwargs)

    InterpretedFunction.run = recording_run
    torch.manual_seed(0)
    cases = _cases()
    case_names = case_names or list(cases)
    unknown = set(case_names) - set(cases)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; choose from {sorted(cases)}")
    for name in case_names:
        current["case"] = name
        cases[name]()
    with open(out_path, "wb") as f:
        pickle.dump((case_names, launches), f)


# ---- phase 2: compile each launch's configs for the GPU --------------------------------------------------


def _rebuild(described):
    import torch

    kind, *rest = described
    if kind == "tensor":
        dtype, aligned = rest
        t = torch.empty(64, dtype=getattr(torch, dtype))  # CPU allocations are 64-byte aligned
        return t if aligned else t[1:]
    return rest[0]


def _tuner_of(module_name: str, kernel_name: str):
    """The autotuner wrapping kernel_name in its module (GPU config list: no interpreter here), or None."""
    import importlib

    from triton.runtime.autotuner import Autotuner

    module = importlib.import_module(module_name)
    for value in vars(module).values():
        if isinstance(value, Autotuner) and value.fn.fn.__name__ == kernel_name:
            return value
    return None


def parse_tile_config(numbers: str):
    """'BLOCK_M,BLOCK_N,WARPS,STAGES[,MAXNREG]' -> triton.Config, or None when it does not parse."""
    import triton

    try:
        vals = [int(x) for x in numbers.split(",")]
    except ValueError:
        return None
    if len(vals) not in (4, 5):
        return None
    block_m, block_n, warps, stages = vals[:4]
    maxnreg = vals[4] if len(vals) == 5 else None
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages, maxnreg=maxnreg
    )


def parse_try_config(text: str) -> tuple:
    """'KERNEL:BLOCK_M,BLOCK_N,WARPS,STAGES[,MAXNREG]' -> (kernel name, triton.Config)."""
    kernel, _, numbers = text.partition(":")
    config = parse_tile_config(numbers)
    if config is None:
        raise SystemExit(
            f"--try-config {text!r}: write KERNEL:BLOCK_M,BLOCK_N,WARPS,STAGES, e.g. _bwd_dkdv:64,96,8,2"
        )
    return kernel, config


def _configs_to_build(launch, all_configs: bool, tries=()):
    """[(label, meta)]: the meta-parameters of every config the GPU run would try at this launch, plus
    the --try-config candidates given for its kernel."""
    _, module_name, kernel_name, args, meta = launch
    tuner = _tuner_of(module_name, kernel_name)
    if tuner is None:
        return [("fixed", meta)]
    tuned_keys = set(tuner.configs[0].kwargs) | {"num_warps", "num_stages", "num_ctas", "maxnreg"}
    base = {k: v for k, v in meta.items() if k not in tuned_keys}
    configs = tuner.configs
    if not all_configs and tuner.early_config_prune:
        named = dict(zip(tuner.arg_names, [_rebuild(a) for a in args], strict=False))
        configs = tuner.early_config_prune(configs, named, **base)
    configs = [*configs, *(c for name, c in tries if name == kernel_name)]
    out = []
    for c in configs:
        extra = {"num_warps": c.num_warps, "num_stages": c.num_stages}
        label = f"{c.kwargs} w{c.num_warps} s{c.num_stages}"
        out.append((label, {**base, **c.kwargs, **extra}))
    return out


def compile_kernel(jit, args: list, meta: dict, arch: int = 90):
    """`jit` (a Triton or Gluon kernel) specialised on example arguments (CPU tensors, host TMA
    descriptors, scalars) and compiled for sm_`arch` with Triton's own compiler, as a launch would."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(*args, **meta)
    options, signature, constexprs, attrs = jit._pack_args(backend, meta, bound, specialization, options)
    source = GluonASTSource if getattr(jit, "is_gluon", lambda: False)() else ASTSource
    return triton.compile(source(jit, signature, constexprs, attrs), target=target, options=options.__dict__)


def build(job) -> dict:
    """Compile one (launch, config) for the target; never raises."""
    launch, label, meta, arch = job
    case, module_name, kernel_name, args, _ = launch
    result = {"case": case, "kernel": kernel_name, "config": label}
    start = time.time()
    # a failing MLIR pass prints its whole reproducer to fd 2: keep the report readable
    saved_stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import importlib

        from triton.runtime.jit import JITFunction

        fn = getattr(importlib.import_module(module_name), kernel_name)
        jit = fn if isinstance(fn, JITFunction) else JITFunction(fn.fn if hasattr(fn, "fn") else fn)
        compiled = compile_kernel(jit, [_rebuild(a) for a in args], meta, arch)
        shared = compiled.metadata.shared
        over = shared > SMEM_LIMIT.get(arch, 101376)
        result.update(status="over shared memory" if over else "ok", shared=shared)
    except Exception as e:  # noqa: BLE001  (the point is to report whatever the compiler raises)
        root = e  # a nested jit call reports its caller's line; the cause says what was refused
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__
        lines = [line for line in str(root).strip().splitlines() if line.strip()]
        result.update(status="error", error=f"{type(root).__name__}: {' | '.join(lines[-3:])[:400]}")
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(devnull)
    result["seconds"] = round(time.time() - start, 1)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability to build for (90 = Hopper)")
    parser.add_argument(
        "--all-configs", action="store_true", help="every config, not only those kept by pruning"
    )
    parser.add_argument(
        "--try-config", action="append", default=[], metavar="KERNEL:BLOCK_M,BLOCK_N,WARPS,STAGES",
        help="also build this candidate tile config at every launch of KERNEL (before offering it to the autotuner)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="JSON file for the results")
    parser.add_argument("--record", help=argparse.SUPPRESS)  # phase 1, run in the child process
    a = parser.parse_args()
    if a.record:
        record(a.cases, a.record)
        return
    tries = [parse_try_config(t) for t in a.try_config]
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: this process compiles for the GPU")
    sys.path.insert(0, ROOT)
    from triton.runtime.jit import JITFunction  # noqa: F401  (fail early if triton is missing)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.pkl")
        env = {
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        subprocess.run(
            [sys.executable, __file__, "--record", path, "--cases", *(a.cases or [])],
            check=True,
            env=env,
            cwd=ROOT,
        )
        with open(path, "rb") as f:
            cases, launches = pickle.load(f)
    launched = {launch[2] for launch in launches}
    for kernel, _ in tries:
        if kernel not in launched:
            raise SystemExit(
                f"--try-config: no launch of {kernel!r} in these cases; launched: {sorted(launched)}"
            )
    jobs = [
        (launch, label, meta, a.arch)
        for launch in launches
        for label, meta in _configs_to_build(launch, a.all_configs, tries)
    ]
    print(f"{len(launches)} launches, {len(jobs)} (launch, config) builds for sm_{a.arch}", flush=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(build, jobs))
    failed = [r for r in results if r["status"] == "error"]
    for r in results:
        detail = r.get("error") or f"shared {r['shared']} B"
        print(
            f"{r['status']:>18}  {r['case']:<15} {r['kernel']:<22} {r['config']:<45} {r['seconds']:6.1f} s  {detail}"
        )
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "over shared memory", "error")}
    print(f"{counts} in {time.time() - start:.0f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"arch": a.arch, "cases": cases, "results": results}, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
