"""Two routes of our attention kernels, or two attention backends, inside one training process,
alternating every few steps: each way's step time (CUDA events between steps) under the step's own
conditions (its other kernels, its clocks and power, its memory, the host's pace at the time) and without
the spread between processes that separate bench_train.py rows carry.

Why: a route can win alone and lose in the step. The ordered one-kernel backward at head dim 64 ran
1.02-1.06x the two kernels in alternating A/Bs at the layer's shape, yet GPT-2 medium trained 1.2% slower
at 8k and 0.3% at 16k with it, each row in its own process (benchmarks/NOTES_attention.md, sessions 55,
56, 59). With --route both routes run in one process on one compiled model (our attention is an opaque
custom op, so its routes are read at every call and switching them recompiles nothing).

And a step bound by the host (GPT-2 small at 1k) reads as fast as the host of that process is: ours
against SDPA cuDNN there moved between 0.80x and 1.02x from one process to the next (README, ‡). With
--impls each backend trains its own copy of the model (same seed, compiled per block as bench_train.py
does), both in this process, and the blocks of steps alternate between them, so both meet the same host.
SDPA is pinned to the backend bench_train.py's IMPLS names for the whole of each of its blocks, and one
profiled step per backend checks that its kernels ran.

    python benchmarks/ab_train_route.py --route d64_one_kernel --model gpt2_medium --seqlen 8192 \
        --rounds 8 --steps 3 --out ab.json [--profile]
    python benchmarks/ab_train_route.py --impls sdpa_cudnn triton --model gpt2_small --seqlen 1024 \
        --rounds 10 --steps 6 --out ab.json

Per round each way runs --steps steps (the first of each block is dropped: the switch's own step), the
ways' order rotated from round to round; the result is each way's median step device ms and tokens/s,
the first way's median ÷ the second's (`off_over_on` for a route, e.g. `sdpa_cudnn_over_triton`; above
1: the second is faster), and with --profile each way's attention kernels' device ms a step from one
profiled step.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_train import (  # noqa: E402
    ATTENTION_HINTS,
    IMPLS,
    MODELS,
    kernel_names,
    matmul_peak_tflops,
    sdpa_context,
    training_step,
)
from benchmarks.common import device_profile, rotated, write_results  # noqa: E402
from flashtrain.gc_schedule import scheduled_gc  # noqa: E402
from kernels import _flash_bwd_fused_hopper as fused  # noqa: E402
from kernels import _flash_fwd_hopper as fwd_hopper  # noqa: E402
from kernels._flash_dkdv_hopper import HopperDkdvConfig  # noqa: E402


def _d64_one_kernel(on: bool) -> None:
    """On: head dim 64's backward on the one-kernel backward, its dQ added in a fixed order (64-query
    steps on two stages, session 55's config); off: the dq and dK/dV kernels."""
    if on:
        fused.CONFIGS[64] = HopperDkdvConfig(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240)
    else:
        fused.CONFIGS.pop(64, None)


def _ordered_backward(on: bool) -> None:
    """On: the ordered one-kernel backward where it takes the call (head dim 128); off: the dq and dK/dV
    kernels (FLASHTRAIN_ORDERED_BWD=0)."""
    fused.ORDERED_ENABLED = on


def _forward_turns(on: bool) -> None:
    """On: the forward's consumers take turns where `_flash_fwd_hopper.config_for` gives them (d128 full
    below 32k, d64's persistent variant); off: nowhere (FLASHTRAIN_FWD_PINGPONG=0)."""
    fwd_hopper.PINGPONG = on


# name: set(on), for route settings the kernels read at every call
ROUTES = {
    "d64_one_kernel": _d64_one_kernel,
    "ordered_backward": _ordered_backward,
    "forward_turns": _forward_turns,
}


def route_state() -> tuple:
    """A copy of every setting a route changes (`restore_routes` puts it back)."""
    return dict(fused.CONFIGS), fused.ORDERED_ENABLED, fwd_hopper.PINGPONG


def restore_routes(state: tuple) -> None:
    configs, fused.ORDERED_ENABLED, fwd_hopper.PINGPONG = state
    fused.CONFIGS.clear()
    fused.CONFIGS.update(configs)


def timed_block(step, steps: int) -> list[float]:
    """Device ms of each of `steps` steps but the first (events between steps; one sync at the end)."""
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    marks[0].record()
    for i in range(steps):
        step()
        marks[i + 1].record()
    torch.cuda.synchronize()
    return [marks[i].elapsed_time(marks[i + 1]) for i in range(1, steps)]


def attention_kernels_ms(step) -> dict[str, float]:
    """Device ms of each attention kernel in one profiled step (`device_profile`'s heaviest kernels)."""
    top = device_profile(step, 1, top=40)["top_kernels_ms"]
    return {name: ms for name, ms in top.items() if any(t in name.lower() for t in ATTENTION_HINTS)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ways = parser.add_mutually_exclusive_group(required=True)
    ways.add_argument("--route", choices=sorted(ROUTES), help="our kernels' route, off and on, in one model")
    ways.add_argument(
        "--impls", nargs=2, choices=sorted(IMPLS), metavar="IMPL",
        help=f"two attention backends, a model each (bench_train.py's names: {', '.join(sorted(IMPLS))})",
    )  # fmt: skip
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2_medium")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per way a round, the first not timed")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per way before the rounds")
    parser.add_argument(
        "--compile-mode", choices=["default", "reduce-overhead"], default="default",
        help="torch.compile's mode for the blocks (reduce-overhead: replayed from CUDA graphs, the host out of the step)",
    )  # fmt: skip
    parser.add_argument(
        "--gc-every",
        type=int,
        default=50,
        help="Python's young generations collected every N steps (the trainer's)",
    )
    parser.add_argument("--profile", action="store_true", help="also each way's attention kernels' ms a step")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2: the first step after a switch is not timed")
    if args.impls is not None and args.impls[0] == args.impls[1]:
        parser.error(f"--impls needs two different backends, got {args.impls[0]} twice")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the training steps and the routes are the GPU's)")
    if args.route is not None:
        saved = route_state()
        try:
            row = compare_routes(ROUTES[args.route], args)
        finally:
            restore_routes(saved)
        row.update(route=args.route)
    else:
        row = compare_impls(args)
    print(
        {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if not k.endswith("step_ms")}
    )
    write_results(args.out, [row])


def compile_mode(args) -> str | None:
    return None if args.compile_mode == "default" else args.compile_mode


@contextlib.contextmanager
def route_set(setting, on: bool):
    setting(on)  # (taken back by main's restore_routes once all ways have run)
    yield


def compare_routes(setting, args) -> dict:
    """One model on our attention, the route off and on."""
    step, _, _, batch = training_step(
        args.model, args.seqlen, "triton", args.tokens_per_step, compile_mode=compile_mode(args)
    )
    ways = {route: (step, lambda on=route == "on": route_set(setting, on)) for route in ("off", "on")}
    row = compare(ways, args)
    row.update(model=args.model, seqlen=args.seqlen, batch=batch)
    return row


def compare_impls(args) -> dict:
    """A model per backend, same seed and data; each built, compiled and warmed up under its pin, and one
    profiled step of each checked for its backend's kernels (bench_train.py's rule)."""
    # (the blocks share one compiled graph per backend, so two in all; a frame past dynamo's recompile limit
    # would run uncompiled without an error, so the limit is raised anyway)
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    ways, row = {}, dict(model=args.model, seqlen=args.seqlen, impls=list(args.impls))
    for impl in args.impls:
        backend, sdpa_backend, marker = IMPLS[impl]
        with sdpa_context(sdpa_backend):
            step, model, _, batch = training_step(
                args.model, args.seqlen, backend, args.tokens_per_step, compile_mode=compile_mode(args)
            )
            step()  # (compiles before the kernel-name pass)
            names = kernel_names(step)
        ways[impl] = (step, lambda pin=sdpa_backend: sdpa_context(pin))
        if marker:
            row[f"{impl}_backend_verified"] = any(marker in n.lower() for n in names)
        attention = [n for n in names if any(t in n.lower() for t in ATTENTION_HINTS)]
        row[f"{impl}_attention_kernels"] = attention[:6]
    row.update(compare(ways, args), batch=batch)
    peak = matmul_peak_tflops()
    row["matmul_peak_tflops"] = peak
    for impl in args.impls:
        tokens_per_s = batch * args.seqlen / (row[f"{impl}_median_ms"] / 1000)
        row[f"{impl}_tokens_per_s"] = tokens_per_s
        row[f"{impl}_mfu"] = model.flops_per_token(args.seqlen) * tokens_per_s / (peak * 1e12)
    return row


def collected(step, collect_after, done):
    """step, then the collector's schedule told one more step is done."""

    def step_then_collect():
        loss = step()
        collect_after(next(done))
        return loss

    return step_then_collect


def compare(ways: dict, args) -> dict:
    """ways: name -> (step, context): each block of a way's steps runs inside a fresh context() (a route's
    setting, a backend's pin). Warm-up, then the rounds (and with args.profile one profiled step a way):
    the result row."""
    names = list(ways)
    for name in names:  # (compiles, autotunes and builds every way's kernels before any timing)
        step, context = ways[name]
        with context():
            for _ in range(args.warmup):
                step()
    times = {name: [] for name in names}
    # (Python's collector on the trainer's schedule, as bench_train.py's rows run: a collection that the
    # allocation threshold triggers inside a host-bound step stalls it)
    with scheduled_gc(args.gc_every) as collect_after:
        done = itertools.count(1)
        for r in range(args.rounds):
            for name in rotated(names, r):
                step, context = ways[name]
                with context():
                    times[name] += timed_block(collected(step, collect_after, done), args.steps)
    row = dict(rounds=args.rounds, steps_per_block=args.steps, compile_mode=args.compile_mode)
    for name in names:
        row[f"{name}_step_ms"] = times[name]
        row[f"{name}_median_ms"] = statistics.median(times[name])
    row[f"{names[0]}_over_{names[1]}"] = row[f"{names[0]}_median_ms"] / row[f"{names[1]}_median_ms"]
    if args.profile:
        for name in names:
            step, context = ways[name]
            with context():  # (`device_profile` runs the switch's step unprofiled)
                row[f"{name}_attention_kernels_ms"] = attention_kernels_ms(step)
    return row


if __name__ == "__main__":
    main()
