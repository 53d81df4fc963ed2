"""flash_attention's fwd+bwd time in two source trees (a change against its base), in alternating rounds.

One process cannot import two versions of `kernels`, so each round times each tree in a process of its
own (`--time`, with PYTHONPATH at that tree; builds come from Triton's on-disk cache after the first
round), in alternating order. A shape is batch,seqlen,heads,kv_heads,headdim,causal (causal 0 or 1).

    python benchmarks/ab_trees.py --trees /tmp/base . --shapes 1,16384,32,8,128,1 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# appended, not put first: `kernels` must come from the tree on PYTHONPATH, `benchmarks` from this one
sys.path.append(ROOT)

from benchmarks.common import mean_ms, rotated, write_results  # noqa: E402


def parse_shape(shape: str) -> tuple[int, int, int, int, int, int]:
    """batch,seqlen,heads,kv_heads,headdim,causal as six ints; a ValueError saying what to pass otherwise."""
    parts = shape.split(",")
    if len(parts) != 6 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(
            f"a shape is batch,seqlen,heads,kv_heads,headdim,causal (six integers), got {shape!r}"
        )
    batch, seqlen, heads, kv_heads, headdim, causal = (int(p) for p in parts)
    if min(batch, seqlen, heads, kv_heads, headdim) < 1 or heads % kv_heads or causal not in (0, 1):
        raise ValueError(
            f"shape {shape!r}: batch, seqlen, heads, kv_heads and headdim must be >= 1, kv_heads must divide heads, "
            "and causal 0 or 1"
        )
    return batch, seqlen, heads, kv_heads, headdim, causal


def time_shape(shape: str, reps: int) -> float:
    """ms of one fwd+bwd of the shape in this process's tree, over reps calls after two warm-up calls."""
    import torch

    from kernels import flash_attention

    batch, seqlen, heads, kv_heads, headdim, causal = parse_shape(shape)
    q = torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(batch, seqlen, kv_heads, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(2)
    )
    g = torch.randn_like(q)

    def step():
        torch.autograd.grad(flash_attention(q, k, v, causal=bool(causal)), (q, k, v), g)

    return mean_ms(step, reps, warmup=2)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trees", nargs=2, metavar=("BASE", "CHANGE"), default=None)
    parser.add_argument("--shapes", nargs="+", default=["1,16384,32,8,128,1"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--time", help=argparse.SUPPRESS)  # (one shape, in this process's tree)
    parser.add_argument("--out", default="ab_trees.json")
    args = parser.parse_args(argv)
    if args.time:
        print(json.dumps({"ms": time_shape(args.time, args.reps)}), flush=True)
        return
    if not args.trees:
        parser.error("--trees BASE CHANGE: the two source trees to compare")
    for shape in args.shapes:  # (before any process starts: each round's processes would fail alike)
        try:
            parse_shape(shape)
        except ValueError as e:
            parser.error(str(e))
    missing = [tree for tree in args.trees if not os.path.isdir(os.path.join(tree, "kernels"))]
    if missing:
        parser.error(
            f"--trees: no kernels/ package under {', '.join(missing)} (a source tree's root, e.g. a git archive)"
        )
    if args.rounds < 1 or args.reps < 1:
        parser.error(f"--rounds and --reps must be >= 1, got {args.rounds} and {args.reps}")
    trees = [os.path.abspath(tree) for tree in args.trees]
    rows = []
    for shape in args.shapes:
        times = {tree: [] for tree in trees}
        for rnd in range(args.rounds):
            for tree in rotated(trees, rnd):
                env = {**os.environ, "PYTHONPATH": tree}
                cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "ab_trees.py"), "--time", shape]
                proc = subprocess.run(
                    cmd + ["--reps", str(args.reps)], capture_output=True, text=True, env=env
                )
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                if not lines:
                    sys.exit(f"{tree} {shape}: {proc.stderr.strip()[-600:]}")
                times[tree].append(json.loads(lines[-1])["ms"])
        base, change = (statistics.median(times[tree]) for tree in trees)
        row = {"shape": shape, "base_ms": base, "change_ms": change, "change_over_base": change / base}
        row["rounds"] = {"base": times[trees[0]], "change": times[trees[1]]}
        rows.append(row)
        print(json.dumps({key: row[key] for key in ("shape", "base_ms", "change_ms", "change_over_base")}))
        # (after each shape: a run killed at its time limit keeps the shapes done)
        write_results(args.out, rows)


if __name__ == "__main__":
    main()
