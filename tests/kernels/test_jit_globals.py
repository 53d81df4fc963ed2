"""Every global a Triton kernel reads is one Triton's compiler accepts.

The interpreter (which runs the kernel tests in CI) executes kernels as Python and reads any module
global; the compiler for the GPU accepts only modules, other jit functions, triton.language objects and
dtypes, a few Python builtins, and values wrapped in `tl.constexpr(...)`. A plain `N: tl.constexpr = 8`
at module level passes every interpreter test and fails every GPU build ("Cannot access global variable
N from within @jit'ed function"), which is what a dropout branch did on its first H200 run. This test
applies the compiler's rule to the kernels' source, so CI catches it on CPU.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
import types

import pytest
import triton
import triton.language as tl

import kernels

# every module of the kernels package, so a new kernel file is covered without a change here
KERNEL_MODULES = sorted(f"kernels.{m.name}" for m in pkgutil.iter_modules(kernels.__path__))
# the Python builtins Triton's code generator maps to its own (triton/compiler/code_generator.py)
TRITON_BUILTINS = {
    "range",
    "static_range",
    "min",
    "max",
    "print",
    "float",
    "int",
    "isinstance",
    "getattr",
    "len",
}


def _jit_functions(module):
    """The plain Python functions behind the module's jit kernels (autotuner and heuristics unwrapped)."""
    found = {}
    for name, obj in vars(module).items():
        inner = obj
        while hasattr(inner, "fn") and not isinstance(inner, types.FunctionType):
            inner = inner.fn
        if inner is not obj and isinstance(inner, types.FunctionType) and inner.__module__ == module.__name__:
            found[name] = inner
    return found


def _compiler_accepts(value) -> bool:
    return (
        isinstance(value, types.ModuleType)
        or isinstance(value, tl.constexpr)
        or isinstance(value, tl.dtype)
        or hasattr(value, "fn")  # another jit function (JITFunction or, under the interpreter, its twin)
        or getattr(value, "__triton_builtin__", False)
        or getattr(value, "__module__", "").startswith("triton.language")
    )


def _locals(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def rejected_globals(fn: types.FunctionType) -> list[str]:
    """Names `fn` reads from its module that Triton's compiler would refuse."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    local = _locals(tree)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)) or node.id in local:
            continue
        if node.id in fn.__globals__:
            if not _compiler_accepts(fn.__globals__[node.id]):
                bad.append(node.id)
        elif node.id not in TRITON_BUILTINS and hasattr(builtins, node.id):
            bad.append(node.id)  # a Python builtin Triton does not provide
    return sorted(set(bad))


def _all_kernels():
    for module_name in KERNEL_MODULES:
        module = importlib.import_module(module_name)
        for name, fn in _jit_functions(module).items():
            yield pytest.param(fn, id=f"{module_name}.{name}")


def test_the_kernel_modules_hold_jit_functions():
    assert {"kernels._flash_fwd", "kernels._flash_bwd", "kernels.decode"} <= set(KERNEL_MODULES)
    assert len(list(_all_kernels())) >= 10


@pytest.mark.parametrize("fn", list(_all_kernels()))
def test_kernel_reads_only_globals_the_compiler_accepts(fn):
    assert rejected_globals(fn) == [], f"{fn.__name__}: wrap these globals in tl.constexpr(...)"


# ---- the check itself, on kernels written to break or pass it -------------------------------------------

ANNOTATED_ONLY: tl.constexpr = 8  # an annotation is not enough: the value stays a plain int
WRAPPED = tl.constexpr(8)
PLAIN = 8


def _bad_annotated(x_ptr):
    tl.store(x_ptr, ANNOTATED_ONLY)


def _bad_plain(x_ptr):
    tl.store(x_ptr, PLAIN)


def _bad_builtin(x_ptr):
    tl.store(x_ptr, abs(WRAPPED))


def _good(x_ptr, n):
    PLAIN = 2  # noqa: N806  (a local of the same name as a module global: the compiler never looks further)
    for i in range(n):
        tl.store(x_ptr + i, tl.full((), WRAPPED, tl.int32) + min(i, PLAIN))


def test_the_check_names_each_rejected_global():
    assert rejected_globals(_bad_annotated) == ["ANNOTATED_ONLY"]
    assert rejected_globals(_bad_plain) == ["PLAIN"]
    assert rejected_globals(_bad_builtin) == ["abs"]
    assert rejected_globals(_good) == []


SAMPLES = {  # name -> (kernel, signature, what the compiler says; None = it builds)
    "annotated": (_bad_annotated, {"x_ptr": "*i32"}, "Cannot access global variable ANNOTATED_ONLY"),
    "plain": (_bad_plain, {"x_ptr": "*i32"}, "Cannot access global variable PLAIN"),
    "builtin": (_bad_builtin, {"x_ptr": "*i32"}, "abs is not defined"),
    "good": (_good, {"x_ptr": "*i32", "n": "i32"}, None),
}


def compiler_verdicts() -> dict[str, str | None]:
    """Each sample built for sm_90 by Triton's front end (it runs on CPU): name -> error text, or None."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    verdicts = {}
    for name, (fn, signature, _) in SAMPLES.items():
        try:
            triton.compile(ASTSource(JITFunction(fn), signature, {}), target=GPUTarget("cuda", 90, 32))
            verdicts[name] = None
        except Exception as e:  # noqa: BLE001  (the compiler's message is the result)
            verdicts[name] = str(e)
    return verdicts


@pytest.fixture(scope="module")
def verdicts():
    # A fresh process without the interpreter: interpreter runs of earlier tests leave triton.language
    # patched in this one (after them even `i + 1` on a loop index fails to compile here).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, __file__], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_compiler_agrees(verdicts, name):
    """Triton's front end refuses what the check refuses, with the same name, and builds what it accepts."""
    said, expected = verdicts[name], SAMPLES[name][2]
    if expected is None:
        assert said is None, said
    else:
        assert said is not None and expected in said, said


if __name__ == "__main__":  # the fixture's child process
    print(json.dumps(compiler_verdicts()))
