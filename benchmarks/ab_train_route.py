"""Two routes of our attention kernels inside one training process, alternating every few steps: the
step's time with a route off and on (CUDA events between steps), under the step's own conditions (its
other kernels, its clocks and power, its memory) and without the spread between processes that separate
bench_train.py rows carry.

Why: a route can win alone and lose in the step. The ordered one-kernel backward at head dim 64 ran
1.02-1.06x the two kernels in alternating A/Bs at the layer's shape, yet GPT-2 medium trained 1.2% slower
at 8k and 0.3% at 16k with it, each row in its own process (benchmarks/NOTES_attention.md, sessions 55,
56, 59). Here both routes run in one process on one compiled model (our attention is an opaque custom
op, so its routes are read at every call and switching them recompiles nothing).

    python benchmarks/ab_train_route.py --route d64_one_kernel --model gpt2_medium --seqlen 8192 \
        --rounds 8 --steps 3 --out ab.json [--profile]

Per round each route runs --steps steps (the first of each block is dropped: the switch's own step),
the routes' order rotated from round to round; the result is each route's median step device ms, the
off ÷ on ratio (above 1: on is faster), and with --profile each route's attention kernels' device ms a
step from one profiled step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_train import ATTENTION_HINTS, MODELS, training_step  # noqa: E402
from benchmarks.common import device_profile, rotated, write_results  # noqa: E402
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
    parser.add_argument("--route", choices=sorted(ROUTES), required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2_medium")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per route a round, the first not timed")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per route before the rounds")
    parser.add_argument(
        "--profile", action="store_true", help="also each route's attention kernels' ms a step"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2: the first step after a switch is not timed")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the routes are the Hopper kernels')")
    setting, state = ROUTES[args.route], route_state()
    step, _, _, batch = training_step(args.model, args.seqlen, "triton", args.tokens_per_step)
    routes = ("off", "on")
    try:
        row = compare(step, setting, routes, args)
    finally:
        restore_routes(state)
    row.update(route=args.route, model=args.model, seqlen=args.seqlen, batch=batch)
    print(
        {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if not k.endswith("step_ms")}
    )
    write_results(args.out, [row])


def compare(step, setting, routes, args) -> dict:
    """Warm-up, then the rounds (and with args.profile one profiled step a route): the result row."""
    for route in routes:  # (compiles, autotunes and builds both routes' kernels before any timing)
        setting(route == "on")
        for _ in range(args.warmup):
            step()
    times = {route: [] for route in routes}
    for r in range(args.rounds):
        for route in rotated(routes, r):
            setting(route == "on")
            times[route] += timed_block(step, args.steps)
    row = dict(rounds=args.rounds, steps_per_block=args.steps)
    for route in routes:
        row[f"{route}_step_ms"] = times[route]
        row[f"{route}_median_ms"] = statistics.median(times[route])
    row["off_over_on"] = row["off_median_ms"] / row["on_median_ms"]
    if args.profile:
        for route in routes:
            setting(route == "on")  # (`device_profile` runs the switch's step unprofiled)
            row[f"{route}_attention_kernels_ms"] = attention_kernels_ms(step)
    return row


if __name__ == "__main__":
    main()
