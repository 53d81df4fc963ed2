"""Which attention backends give bitwise the same gradients when a backward runs again on the same inputs.

The issue compares ours with SDPA's cuDNN kernels. Our default backward is deterministic (dq in its own
kernel, no atomics) and `deterministic=False` adds dQ in fp32 in arrival order. Comparing cuDNN with the
right one needs to know which kind cuDNN's backward is; torch's notes on randomness list cuDNN's SDPA
among the nondeterministic backends. This measures it instead of taking it on trust.

Per impl (bench_attention.py's names) and shape: one fwd+bwd on seeded bf16 inputs, then `--repeats`
more on the same inputs. For out, dq, dk and dv: how many repeats differ from the first run in any bit,
and the largest elementwise difference. Then, with `torch.use_deterministic_algorithms(True)`, whether
the impl still runs (torch raises for an op that has only nondeterministic kernels) and whether its
gradients then repeat.

    python benchmarks/check_determinism.py --impls triton triton_atomic sdpa_cudnn sdpa_flash \\
        --shape 4,4096,16,128 --shape 4,4096,16,128,causal --out determinism.json
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import make_impl, native_shape  # noqa: E402
from benchmarks.common import error_note, print_summary, write_results  # noqa: E402
from benchmarks.sweep_tiles import parse_shape  # noqa: E402

NAMES = ("out", "dq", "dk", "dv")


def _inputs(impl: str, shape: dict) -> tuple:
    """Seeded q, k, v, dO in the impl's native layout: (B, N, H, d) for ours, (B, H, N, d) for torch's."""
    n, d = shape["seqlen"], shape["headdim"]
    layout = native_shape(impl, shape["batch"], n, shape["nheads"], d)
    gen = torch.Generator(device="cuda").manual_seed(n + d + shape["causal"])
    q, k, v, do = (torch.randn(layout, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def _run(fn, q, k, v, do, causal: bool) -> tuple:
    out = fn(q, k, v, causal)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), do))


def _repeats(fn, inputs, causal: bool, repeats: int) -> dict:
    """Per tensor: repeats that differ from the first run in any bit, and the largest difference."""
    first = _run(fn, *inputs, causal)
    differing = dict.fromkeys(NAMES, 0)
    max_diff = dict.fromkeys(NAMES, 0.0)
    for _ in range(repeats):
        again = _run(fn, *inputs, causal)
        for name, a, b in zip(NAMES, first, again, strict=True):
            if not torch.equal(a, b):
                differing[name] += 1
                max_diff[name] = max(max_diff[name], (a.float() - b.float()).abs().max().item())
    return {"differing_repeats": differing, "max_abs_diff": max_diff}


def check(impl: str, shape: dict, repeats: int) -> dict:
    row = dict(impl=impl, **shape, repeats=repeats)
    fn, inputs = make_impl(impl), _inputs(impl, shape)
    try:
        row.update(_repeats(fn, inputs, shape["causal"], repeats))
    except Exception as exc:  # noqa: BLE001  (a backend that cannot take the shape keeps a row saying so)
        row["error"] = error_note(exc)
        return row
    row["deterministic"] = not any(row["differing_repeats"].values())
    # under torch's determinism switch: torch raises for ops with only nondeterministic kernels
    torch.use_deterministic_algorithms(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            strict = _repeats(fn, inputs, shape["causal"], repeats)
        row["under_use_deterministic_algorithms"] = dict(
            strict, warnings=sorted({str(w.message)[:200] for w in caught})
        )
    except Exception as exc:  # noqa: BLE001  (the refusal is the finding)
        row["under_use_deterministic_algorithms"] = {"error": error_note(exc)}
    finally:
        torch.use_deterministic_algorithms(False)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["triton", "triton_atomic", "sdpa_cudnn", "sdpa_flash"])
    parser.add_argument(
        "--shape", action="append", required=True, help="batch,seqlen,nheads,headdim[,causal]"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/determinism.json")
    args = parser.parse_args()
    rows = []
    for text in args.shape:
        shape = parse_shape(text)
        for impl in args.impls:
            rows.append(check(impl, shape, args.repeats))
            print_summary(rows[-1])
            write_results(args.out, rows)  # after each row: a time-out keeps what was measured


if __name__ == "__main__":
    main()
