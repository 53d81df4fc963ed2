"""Ours against SDPA cuDNN in alternating rounds: forward and fwd+bwd of ours (deterministic and
deterministic=False) and of cuDNN timed one after the other in one process, several rounds, so that a
ratio is not one run's luck (single runs of bench_attention.py spread by ±4%, once 30%). Each round
starts with the next impl (session 43's calls 1 and 2 ran before that, always in IMPLS order).

Shapes as the issue's benchmark: bf16, batch x seqlen = 16k tokens, nheads x headdim = 2048. Per case
and round: each impl's median time (`common.time_ms`: CUDA events, L2 flushed); per case the medians over
rounds and cuDNN's median ÷ ours (above 1: ours faster), with the lowest and highest round's ratio.

    python benchmarks/ab_cudnn.py --headdims 128 --seqlens 4096 8192 16384 --rounds 5 --out ab_cudnn.json

cuDNN's backward adds dQ in a run-dependent order, as SDPA's flash and memory-efficient kernels do by
default (check_determinism.py, results/s44/call1). Under `torch.use_deterministic_algorithms(True)` torch
refuses cuDNN and runs deterministic variants of the other two; `--torch-deterministic` times ours
(deterministic) against those, with the switch on. `--two-kernels` adds ours deterministic with the ordered
one-kernel backward off (the two deterministic kernels, FLASHTRAIN_ORDERED_BWD=0's route), alternating.

The H200s we time on sit at their software power cap (~690-700 W) under these calls, and the power controller
moves the SM clock over about a second; `time_ms` warms a call up for 25 ms and times it for 100, inside that
scale. `--settle-ms S` runs each call back to back for S ms right before its timing (at the draw of that call),
`--rep-ms` times it for longer, and `--gpu-clocks` samples the clock and power (nvidia-smi) and gives each
impl's median over its timed windows: whether one impl ran at lower clocks than another. Settled, the per-round
spreads closed from up to 0.18 to 0.02 at most (results/s81/call1-2), so that is how to read a ratio:

    python benchmarks/ab_cudnn.py --seqlens 4096 16384 --rounds 3 --deterministic-only --settle-ms 1500 \
        --rep-ms 500 --gpu-clocks --out ab_cudnn_settled.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import fwd_flops, issue_shape, make_impl  # noqa: E402
from benchmarks.common import (  # noqa: E402
    clocks_per_call,
    gpu_clock_log,
    print_summary,
    rotated,
    settled_time_ms,
    with_settings,
    write_results,
)
from kernels import _flash_bwd, _flash_bwd_fused_hopper  # noqa: E402

# name -> bench_attention's impl; ours first, then the anchors each of ours is compared with
IMPLS = {"ours": "triton", "ours_nondeterministic": "triton_atomic", "cudnn": "sdpa_cudnn"}
# under torch.use_deterministic_algorithms(True): SDPA's backends that still run there
STRICT_IMPLS = {"ours": "triton", "sdpa_flash": "sdpa_flash", "sdpa_mem_eff": "sdpa_mem_eff"}
TWO_KERNELS = "ours_two_kernels"  # (--two-kernels: ours, the ordered one-kernel backward off)
GQA_EXPANDED = "ours_gqa_expanded"  # (--gqa-expanded: ours, GQA through the ordered backward run as MHA)
ZERO_FILLED = "ours_zero_filled"  # (--zero-filled: ours, the ordered backward's first adders adding too)
# (--torch-dq-sum: ours, the one-kernel backward's dq buffers summed by torch's adds, zeros stored where no
# program writes, `_flash_bwd_fused_hopper.TORCH_DQ_SUM`)
TORCH_DQ_SUM = "ours_torch_dq_sum"
# (--rows-in-order: ours and ours_nondeterministic with the one-kernel backward's dQ halves staged in row order,
# `_flash_bwd_fused_hopper.PAIRED_DQ_ROWS` off), each against its own with the rows paired
ROWS_IN_ORDER = {"ours_rows_in_order": "ours", "ours_nondeterministic_rows_in_order": "ours_nondeterministic"}
# (--also-causal-key-groups N: ours, causal in up to N key groups)
KEY_GROUPS_PREFIX = "ours_causal_key_groups_"
# (--gqa-kernel-group N: ours, the GQA route's programs at N query heads each, `_flash_bwd.ORDERED_GQA_KERNEL_GROUP`)
KERNEL_GROUP_PREFIX = "ours_gqa_kernel_group_"
# (--also-convoy-key-groups N: ours, the causal convoy in N key groups, `_flash_bwd_fused_hopper.CAUSAL_CONVOY_KEY_GROUPS`)
CONVOY_GROUPS_PREFIX = "ours_convoy_key_groups_"
# variants whose fwd+bwd the rows give ÷ ours's, per name prefix -> (module, the setting its N sets)
SETTING_VARIANTS = {
    KERNEL_GROUP_PREFIX: (_flash_bwd, "ORDERED_GQA_KERNEL_GROUP"),
    CONVOY_GROUPS_PREFIX: (_flash_bwd_fused_hopper, "CAUSAL_CONVOY_KEY_GROUPS"),
}


@dataclasses.dataclass(frozen=True)
class Timing:
    """How each call is timed: settle_ms of back-to-back calls first, then `time_ms` over rep_ms; with
    gpu_clocks the SM clock and power sampled beside the timings."""

    settle_ms: float = 0.0
    rep_ms: float = 100.0
    gpu_clocks: bool = False


def _calls(
    seqlen: int,
    headdim: int,
    causal: bool,
    impls: dict,
    nheads: int | None = None,
    nheads_kv: int | None = None,
) -> dict:
    """Per impl, (forward, fwd+bwd) callables on one set of seeded inputs (bench_attention's impls:
    ours on (B, N, H, d), torch's on a (B, H, N, d) view of the same tensors); K and V with nheads_kv
    heads (GQA; default: nheads)."""
    batch, nheads = issue_shape(seqlen, headdim, nheads)
    nheads_kv = nheads_kv or nheads
    torch.manual_seed(seqlen + headdim + causal)
    q, k, v = (
        torch.randn(batch, seqlen, h, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for h in (nheads, nheads_kv, nheads_kv)
    )
    do = torch.randn_like(q)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))

    def pair(fn, inputs, grad_out):
        fwd = lambda: fn(*inputs, causal)  # noqa: E731
        return fwd, lambda: torch.autograd.grad(fwd(), inputs, grad_out)

    calls = {
        name: pair(make_impl(impl), (q, k, v), do)
        if name.startswith("ours")
        else pair(make_impl(impl), (qt, kt, vt), do.transpose(1, 2))
        for name, impl in impls.items()
    }
    if TWO_KERNELS in calls:
        calls[TWO_KERNELS] = tuple(
            with_settings(fn, _flash_bwd_fused_hopper, ORDERED_ENABLED=False) for fn in calls[TWO_KERNELS]
        )
    if ZERO_FILLED in calls:
        calls[ZERO_FILLED] = tuple(
            with_settings(fn, _flash_bwd_fused_hopper, FIRST_STORES=False) for fn in calls[ZERO_FILLED]
        )
    if TORCH_DQ_SUM in calls:
        calls[TORCH_DQ_SUM] = tuple(
            with_settings(fn, _flash_bwd_fused_hopper, TORCH_DQ_SUM=True) for fn in calls[TORCH_DQ_SUM]
        )
    if GQA_EXPANDED in calls:
        calls[GQA_EXPANDED] = tuple(
            with_settings(
                fn,
                _flash_bwd,
                ORDERED_GQA_EXPANDED=True,
                ORDERED_GQA_EXPANDED_MIN_KEYS=0,
                ORDERED_GQA_EXPANDED_MIN_KEYS_FULL=0,
                ORDERED_GQA_EXPANDED_MAX_KEYS=1 << 30,
            )  # fmt: skip
            for fn in calls[GQA_EXPANDED]
        )
    for name in (n for n in calls if n in ROWS_IN_ORDER):
        calls[name] = tuple(
            with_settings(fn, _flash_bwd_fused_hopper, PAIRED_DQ_ROWS=False) for fn in calls[name]
        )
    for prefix, (module, setting) in SETTING_VARIANTS.items():
        for name in (n for n in calls if n.startswith(prefix)):
            value = int(name.removeprefix(prefix))
            calls[name] = tuple(with_settings(fn, module, **{setting: value}) for fn in calls[name])
    for name in (n for n in calls if n.startswith(KEY_GROUPS_PREFIX)):
        groups = int(name.removeprefix(KEY_GROUPS_PREFIX))
        calls[name] = tuple(
            with_settings(fn, _flash_bwd_fused_hopper, ORDERED_CAUSAL_KEY_GROUPS=groups) for fn in calls[name]
        )
    return calls


def case(
    seqlen: int,
    headdim: int,
    causal: bool,
    rounds: int,
    impls: dict = IMPLS,
    nheads: int | None = None,
    nheads_kv: int | None = None,
    timing: Timing = Timing(),
) -> dict:
    calls = _calls(seqlen, headdim, causal, impls, nheads, nheads_kv)
    times = {(impl, what): [] for impl in impls for what in ("fwd", "fwdbwd")}
    windows = {key: [] for key in times}  # (epoch seconds each timing began and ended, for --gpu-clocks)
    # every call built and tuned before anything is timed (the first round's windows had held the compile,
    # the GPU idle and cooling meanwhile: results/s81/call1)
    for fn in (fn for pair in calls.values() for fn in pair):
        fn()
    torch.cuda.synchronize()
    clocks = gpu_clock_log() if timing.gpu_clocks else contextlib.nullcontext({})
    with clocks as clock_summary:
        for r in range(rounds):
            for impl in rotated(list(impls), r):
                for what, fn in zip(("fwd", "fwdbwd"), calls[impl], strict=True):
                    ms = settled_time_ms(fn, timing.settle_ms, timing.rep_ms, windows[(impl, what)])
                    times[(impl, what)].append(ms)
    batch, nheads = issue_shape(seqlen, headdim, nheads)
    flops = fwd_flops(batch, nheads, seqlen, headdim, causal)
    row = dict(seqlen=seqlen, headdim=headdim, causal=causal, rounds=rounds, batch=batch, nheads=nheads,
               nheads_kv=nheads_kv or nheads)  # fmt: skip
    for (impl, what), ms in times.items():
        row[f"{impl}_{what}_ms"] = ms
        row[f"{impl}_{what}_tflops"] = (3.5 if what == "fwdbwd" else 1) * flops / statistics.median(ms) / 1e9
    ours = [name for name in impls if name.startswith("ours")]
    for anchor in (name for name in impls if name not in ours):
        for impl in ours:
            for what in ("fwd", "fwdbwd"):
                key = f"{anchor}_over_{impl}_{what}"
                row[key], row[f"{key}_range"] = _ratio(times[(anchor, what)], times[(impl, what)])
    for variant, key in (
        (GQA_EXPANDED, "gqa_expanded_over_ours_fwdbwd"),
        (TWO_KERNELS, "two_kernels_over_ours_fwdbwd"),
        (ZERO_FILLED, "zero_filled_over_ours_fwdbwd"),
        (TORCH_DQ_SUM, "torch_dq_sum_over_ours_fwdbwd"),
    ):
        if variant in impls:  # (above 1: the default faster)
            row[key], row[f"{key}_range"] = _ratio(times[(variant, "fwdbwd")], times[("ours", "fwdbwd")])
    for variant in (name for name in impls if name in ROWS_IN_ORDER):  # (above 1: the rows paired faster)
        base = ROWS_IN_ORDER[variant]
        key = f"{variant.removeprefix('ours_')}_over_{base}_fwdbwd"
        row[key], row[f"{key}_range"] = _ratio(times[(variant, "fwdbwd")], times[(base, "fwdbwd")])
    for variant in (name for name in impls if name.startswith(tuple(SETTING_VARIANTS))):
        key = f"{variant.removeprefix('ours_')}_over_ours_fwdbwd"
        row[key], row[f"{key}_range"] = _ratio(times[(variant, "fwdbwd")], times[("ours", "fwdbwd")])
    row.update(settle_ms=timing.settle_ms, rep_ms=timing.rep_ms)
    if timing.gpu_clocks:
        row["gpu_clocks"] = clocks_per_call(clock_summary, {f"{i}_{w}": s for (i, w), s in windows.items()})
    return row


def _ratio(theirs: list, mine: list) -> tuple[float, tuple[float, float]]:
    """Their median time ÷ mine (above 1: mine faster), and the lowest and highest round's ratio."""
    per_round = [t / m for t, m in zip(theirs, mine, strict=True)]
    return statistics.median(theirs) / statistics.median(mine), (min(per_round), max(per_round))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--torch-deterministic", action="store_true",
        help="with torch.use_deterministic_algorithms(True): ours against SDPA flash and memory-efficient",
    )  # fmt: skip
    parser.add_argument("--two-kernels", action="store_true",
                        help=f"also {TWO_KERNELS}: ours deterministic with the ordered one-kernel backward off")  # fmt: skip
    parser.add_argument("--gqa-expanded", action="store_true",
                        help=f"also {GQA_EXPANDED}: ours with GQA calls the ordered one-kernel backward refuses "
                        "run as MHA (`_flash_bwd.ORDERED_GQA_EXPANDED`), at any length")  # fmt: skip
    parser.add_argument("--zero-filled", action="store_true",
                        help=f"also {ZERO_FILLED}: ours with the ordered backward's first adders adding into a "
                        "zero-filled buffer instead of storing (its FIRST_STORES off)")  # fmt: skip
    parser.add_argument("--torch-dq-sum", action="store_true",
                        help=f"also {TORCH_DQ_SUM}: ours with the one-kernel backward's dq buffers summed by "
                        "torch's adds (its TORCH_DQ_SUM on: zeros stored where no program writes)")  # fmt: skip
    parser.add_argument("--ordered-causal-key-groups", type=int, default=None,
                        help="let causal calls of up to this many key groups take the ordered one-kernel backward")  # fmt: skip
    parser.add_argument("--also-causal-key-groups", type=int, default=None, metavar="N",
                        help=f"also {KEY_GROUPS_PREFIX}N: ours with causal ordered calls in up to N key groups "
                        "(its ORDERED_CAUSAL_KEY_GROUPS; past them the convoy), alternating with the default")  # fmt: skip
    parser.add_argument("--gqa-kernel-group", type=int, default=None, metavar="N",
                        help=f"also {KERNEL_GROUP_PREFIX}N: ours with the GQA route's programs taking N query "
                        "heads each (`_flash_bwd.ORDERED_GQA_KERNEL_GROUP`), alternating with the default")  # fmt: skip
    parser.add_argument("--also-convoy-key-groups", type=int, nargs="+", default=[], metavar="N",
                        help=f"also {CONVOY_GROUPS_PREFIX}N per N: ours with the causal convoy in N key groups "
                        "(`CAUSAL_CONVOY_KEY_GROUPS`), alternating with the default")  # fmt: skip
    parser.add_argument(
        "--rows-in-order",
        action="store_true",
        help="add ours (and unless --deterministic-only ours_nondeterministic) with the one-kernel "
        "backward's dQ halves staged in row order (PAIRED_DQ_ROWS off), alternating",
    )
    parser.add_argument("--nheads", type=int, default=None,
                        help="heads (default: the issue's, 2048 / head dim); the batch stays the issue's")  # fmt: skip
    parser.add_argument("--nheads-kv", type=int, default=None,
                        help="K/V heads (GQA: SDPA with enable_gqa; default: as many as the query's)")  # fmt: skip
    parser.add_argument("--deterministic-only", action="store_true",
                        help="leave out ours_nondeterministic (deterministic=False) from the default impls")  # fmt: skip
    parser.add_argument("--settle-ms", type=float, default=0.0,
                        help="run each call back to back for this long right before timing it (the GPU's power "
                        "and clock settled at that call's draw; the controller moves over ~1 s)")  # fmt: skip
    parser.add_argument("--rep-ms", type=float, default=100.0, help="how long time_ms times each call")
    parser.add_argument("--gpu-clocks", action="store_true",
                        help="sample the SM clock and power (nvidia-smi) and report each impl's median over its "
                        "timed windows")  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.settle_ms < 0 or args.rep_ms <= 0:
        parser.error(
            f"--settle-ms must be at least 0 and --rep-ms above 0, got {args.settle_ms} and {args.rep_ms}"
        )
    if args.deterministic_only and args.torch_deterministic:
        parser.error("--deterministic-only leaves out ours_nondeterministic, which --torch-deterministic's impls "
                     "do not have: give one of them")  # fmt: skip
    if args.nheads is not None and args.nheads < 1:
        parser.error(f"--nheads must be at least 1, got {args.nheads}")
    if args.nheads_kv is not None:
        for headdim in args.headdims:
            nheads = issue_shape(1, headdim, args.nheads)[1]
            if args.nheads_kv < 1 or nheads % args.nheads_kv:
                parser.error(
                    f"--nheads-kv must divide the query heads ({nheads} at head dim {headdim}), got {args.nheads_kv}"
                )
    if args.ordered_causal_key_groups is not None:
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_KEY_GROUPS = args.ordered_causal_key_groups
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    impls = STRICT_IMPLS if args.torch_deterministic else IMPLS
    if args.deterministic_only:
        impls = {name: impl for name, impl in impls.items() if name != "ours_nondeterministic"}
    if args.two_kernels:
        impls = {"ours": "triton", TWO_KERNELS: "triton", **impls}
    if args.zero_filled:
        impls = {"ours": "triton", ZERO_FILLED: "triton", **impls}
    if args.torch_dq_sum:
        impls = {"ours": "triton", TORCH_DQ_SUM: "triton", **impls}
    if args.gqa_expanded:
        impls = {"ours": "triton", GQA_EXPANDED: "triton", **impls}
    if args.rows_in_order:  # (each variant after its base, as bench_attention's impl of it)
        impls = {**impls, **{v: impls[base] for v, base in ROWS_IN_ORDER.items() if base in impls}}
    if args.gqa_kernel_group is not None:
        if args.gqa_kernel_group < 1:
            parser.error(f"--gqa-kernel-group must be at least 1, got {args.gqa_kernel_group}")
        impls = {"ours": "triton", f"{KERNEL_GROUP_PREFIX}{args.gqa_kernel_group}": "triton", **impls}
    if args.also_causal_key_groups is not None:
        if args.also_causal_key_groups < 0:
            parser.error(f"--also-causal-key-groups must be at least 0, got {args.also_causal_key_groups}")
        impls = {"ours": "triton", f"{KEY_GROUPS_PREFIX}{args.also_causal_key_groups}": "triton", **impls}
    if any(groups < 1 for groups in args.also_convoy_key_groups):
        parser.error(
            f"--also-convoy-key-groups takes counts of at least 1, got {args.also_convoy_key_groups}"
        )
    for groups in args.also_convoy_key_groups:
        impls = {"ours": "triton", f"{CONVOY_GROUPS_PREFIX}{groups}": "triton", **impls}
    torch.use_deterministic_algorithms(args.torch_deterministic)
    rows = []
    for headdim in args.headdims:
        for causal in causals:
            for seqlen in args.seqlens:
                timing = Timing(args.settle_ms, args.rep_ms, args.gpu_clocks)
                row = case(seqlen, headdim, causal, args.rounds, impls, args.nheads, args.nheads_kv, timing)
                print_summary(row)
                rows.append(row)
                write_results(args.out, rows, {"torch_deterministic": args.torch_deterministic})


if __name__ == "__main__":
    main()
