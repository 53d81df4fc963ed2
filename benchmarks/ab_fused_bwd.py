"""The one-kernel backward (`kernels._flash_bwd_fused_hopper`) against the deterministic two kernels,
alternating in one process for several rounds: the backward alone on a saved forward (do_bench
median), d128 (--headdim), bf16, batch x seqlen = 16k tokens, nheads x headdim = 2048. Session 42
used it where single runs of bench_attention.py and exp_fused_bwd.py disagreed (causal 16k).

    python benchmarks/ab_fused_bwd.py --causal --seqlens 8192 16384 --rounds 5 --out ab.json

--ordered adds the one-kernel backward with each dq tile's adds in a fixed order (deterministic; full
attention, or causal from 2k), and checks that its gradients repeat bit for bit and how far they are from the two kernels'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import alternating_ms, write_results  # noqa: E402
from benchmarks.exp_fused_bwd import _backward, rel_distances, saved_forward  # noqa: E402
from kernels import _flash_bwd_fused_hopper, _flash_dkdv_hopper  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("--causal-from", type=int, default=None,
                        help="send causal calls from this many queries to the fused kernel (its CAUSAL_FROM)")  # fmt: skip
    parser.add_argument("--ordered", action="store_true", help="also the ordered one-kernel backward")
    parser.add_argument("--ordered-causal-from", type=int, default=None,
                        help="send causal calls from this many queries to the ordered one (its ORDERED_CAUSAL_FROM)")  # fmt: skip
    parser.add_argument("--ordered-causal-key-groups", type=int, default=None,
                        help="let causal calls of up to this many key groups take the ordered one (its ORDERED_CAUSAL_KEY_GROUPS)")  # fmt: skip
    parser.add_argument("--group", type=int, default=1, help="query heads a key head (GQA)")
    parser.add_argument("--nheads", type=int, default=None,
                        help="query heads (default: the issue's, 16 at head dim 128); the batch stays the issue's")  # fmt: skip
    parser.add_argument("--ordered-max-group", type=int, default=None,
                        help="let calls of up to this many query heads a key head take the ordered one (its ORDERED_CAUSAL_MAX_GROUP, ORDERED_CAUSAL_CONVOY_MAX_GROUP and ORDERED_ROTATION_MAX_GROUP)")  # fmt: skip
    parser.add_argument("--causal-convoy-upto", type=int, default=None,
                        help="the causal convoy's longest call (its ORDERED_CAUSAL_CONVOY_MAX_SEQLEN)")  # fmt: skip
    parser.add_argument("--convoy-blocks", type=int, nargs="+", default=None,
                        help="with --ordered --causal, time the causal convoy with each of these launch blocks "
                        "at every length (its CONVOY_BLOCK_SETTING) instead of causal_convoy_block's")  # fmt: skip
    parser.add_argument("--full-convoy", action="store_true",
                        help="with --ordered (full attention), also time every length in the convoy order "
                        "(ordered_full_convoy: its MAX_KEY_GROUPS 0), where the rule takes key groups up to 2")  # fmt: skip
    parser.add_argument("--walk-down", action="store_true",
                        help="with --ordered --causal, time each causal convoy variant also walking its tiles "
                        "from the last (its WALK_DOWN_SETTING; the others walk up)")  # fmt: skip
    parser.add_argument("--causal-convoy-everywhere", action="store_true",
                        help="with --ordered --causal, let the causal convoy variants take one key group's lengths "
                        "too (their ORDERED_CAUSAL_KEY_GROUPS 0) while `ordered` keeps the rule's: the convoy "
                        "against one key group in one run")  # fmt: skip
    parser.add_argument("--headdim", type=int, default=128,
                        help="head dim (default 128; batch x seqlen and nheads x headdim stay the issue's)")  # fmt: skip
    parser.add_argument("--fused-configs", nargs="+", default=None, metavar="BLOCK_M:STAGES",
                        help="the one-kernel backward's launch shapes at --headdim (its CONFIGS, two consumers of "
                        "64 keys, 240 registers): `fused` and `ordered` take the first, and each other one is a "
                        "variant of its own, ordered_mBLOCK_MsSTAGES (a head dim the kernel does not take by "
                        "default, 64, takes it only through these)")  # fmt: skip
    parser.add_argument("--convoy-key-groups", type=int, nargs="+", default=None,
                        help="with --ordered --causal, also time each causal convoy variant in each of these "
                        "numbers of key groups (its CAUSAL_CONVOY_KEY_GROUPS; the others in 1)")  # fmt: skip
    parser.add_argument("--packed", action="store_true",
                        help="q, k, v as views of one packed tensor and the gradients stored into one, as a "
                        "GPT's attention runs (`exp_fused_bwd.saved_forward`)")  # fmt: skip
    args = parser.parse_args()
    if args.convoy_key_groups and (not (args.ordered and args.causal) or min(args.convoy_key_groups) < 1):
        parser.error(
            "--convoy-key-groups takes positive numbers and times the causal convoy: give --ordered --causal"
        )
    if args.nheads is not None and (args.nheads < 1 or args.nheads % args.group):
        parser.error(f"--nheads must be a positive multiple of --group ({args.group}), got {args.nheads}")
    if args.causal_convoy_everywhere and not (args.ordered and args.causal):
        parser.error("--causal-convoy-everywhere times the causal convoy: give --ordered --causal")
    if args.full_convoy and (args.causal or not args.ordered):
        parser.error("--full-convoy times full attention's convoy order: give --ordered, not --causal")
    # variant -> its one-kernel backward's config at --headdim (other variants: the first, or the rule's)
    fused_configs = {}
    for text in args.fused_configs or ():
        try:
            block_m, stages = (int(x) for x in text.split(":"))
        except ValueError:
            parser.error(f"--fused-configs takes BLOCK_M:STAGES, got {text!r}")
        fused_configs[f"ordered_m{block_m}s{stages}"] = _flash_dkdv_hopper.HopperDkdvConfig(
            block_m=block_m, block_n=64, consumers=2, stages=stages, consumer_regs=240
        )
    if len(fused_configs) > 1 and not args.ordered:
        parser.error("more than one --fused-configs times ordered variants: give --ordered")
    first_config = next(iter(fused_configs.values()), _flash_bwd_fused_hopper.CONFIGS.get(args.headdim))
    if first_config is None:
        parser.error(
            f"the one-kernel backward takes no head dim {args.headdim} by default: give --fused-configs"
        )
    # (every argument checked: the kernels' settings change from here)
    if args.causal_convoy_upto is not None:
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_CONVOY_MAX_SEQLEN = args.causal_convoy_upto
    if args.ordered_max_group is not None:
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_MAX_GROUP = args.ordered_max_group
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_CONVOY_MAX_GROUP = args.ordered_max_group
        _flash_bwd_fused_hopper.ORDERED_ROTATION_MAX_GROUP = args.ordered_max_group
    if args.ordered_causal_key_groups is not None:
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_KEY_GROUPS = args.ordered_causal_key_groups
    if args.causal_from is not None:
        _flash_bwd_fused_hopper.CAUSAL_FROM = args.causal_from
    if args.ordered_causal_from is not None:
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_FROM = args.ordered_causal_from
    # variant -> (atomic dq, ordered one-kernel backward on)
    variants = {"deterministic": (False, False), "fused": (True, False)}
    if args.ordered:
        variants["ordered"] = (False, True)
    variants.update((name, (False, True)) for name in list(fused_configs)[1:])
    ordered_default = _flash_bwd_fused_hopper.ORDERED_ENABLED
    configs_default = dict(_flash_bwd_fused_hopper.CONFIGS)
    # the causal convoy order (variant ordered: without it), with the default launch blocks or each given
    convoys = {"ordered_causal_convoy": _flash_bwd_fused_hopper.CONVOY_BLOCK_SETTING}  # (None: the rule's)
    if args.convoy_blocks:
        convoys = {f"ordered_causal_convoy_b{block}": block for block in args.convoy_blocks}
    walk_down = {}  # (variant -> whether it walks down; None, the rule's, for a variant not in it)
    if args.walk_down:
        walk_down = {name: False for name in convoys} | {f"{name}_down": True for name in convoys}
        convoys |= {f"{name}_down": block for name, block in convoys.items()}
    convoy_groups = {}  # (variant -> the causal convoy's key groups; 1 for a variant not in it)
    single = list(convoys)  # (the convoy variants in one key group)
    for groups in args.convoy_key_groups or ():
        for name in single:
            convoys[f"{name}_g{groups}"] = convoys[name]
            convoy_groups[f"{name}_g{groups}"] = groups
            if name in walk_down:
                walk_down[f"{name}_g{groups}"] = walk_down[name]
    if args.ordered and args.causal:
        variants.update((name, (False, True)) for name in convoys)
    if args.full_convoy:
        variants["ordered_full_convoy"] = (False, True)
    max_key_groups = _flash_bwd_fused_hopper.MAX_KEY_GROUPS
    causal_key_groups = _flash_bwd_fused_hopper.ORDERED_CAUSAL_KEY_GROUPS

    def backward(variant, inputs):
        atomic, _flash_bwd_fused_hopper.ORDERED_ENABLED = variants[variant]
        _flash_bwd_fused_hopper.CONFIGS[args.headdim] = fused_configs.get(variant, first_config)
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_CONVOY = variant in convoys
        _flash_bwd_fused_hopper.CONVOY_BLOCK_SETTING = convoys.get(variant)
        _flash_bwd_fused_hopper.WALK_DOWN_SETTING = walk_down.get(variant)
        _flash_bwd_fused_hopper.CAUSAL_CONVOY_KEY_GROUPS = convoy_groups.get(variant, 1)
        # (0: past no key group, so every full-attention call in the convoy order)
        _flash_bwd_fused_hopper.MAX_KEY_GROUPS = 0 if variant == "ordered_full_convoy" else max_key_groups
        # (0: past no key group, so every causal call the convoy variants take in the convoy order)
        everywhere = args.causal_convoy_everywhere and variant in convoys
        _flash_bwd_fused_hopper.ORDERED_CAUSAL_KEY_GROUPS = 0 if everywhere else causal_key_groups
        return _backward(*inputs, args.causal, atomic, args.packed)

    def repeats_and_distance(variant, inputs, repeats, reference):
        """Whether variant's gradients repeat bit for bit over repeats runs, and its first run's largest
        difference from reference's, per gradient, relative to reference's largest value."""
        runs = [backward(variant, inputs) for _ in range(repeats)]
        bitwise = all(torch.equal(a, b) for again in runs[1:] for a, b in zip(runs[0], again, strict=True))
        return bitwise, rel_distances(runs[0], reference)

    rows = []
    for seqlen in args.seqlens:
        inputs = saved_forward(seqlen, args.headdim, args.causal, args.group, args.nheads, args.packed)
        row = dict(
            seqlen=seqlen, headdim=args.headdim, causal=args.causal, group=args.group, rounds=args.rounds,
            packed=args.packed,
        )  # fmt: skip
        row["fused_configs"] = args.fused_configs
        row["batch"], row["nheads"] = inputs[0].shape[0], inputs[0].shape[2]
        if args.ordered:
            two_kernels = backward("deterministic", inputs)
            row["ordered_repeats_bitwise"], row["ordered_vs_deterministic_rel"] = repeats_and_distance(
                "ordered", inputs, 3, two_kernels
            )
            extra = (*convoys, "ordered_full_convoy", *fused_configs)
            for name in (v for v in extra if v in variants and v != "ordered"):
                row[f"{name}_repeats_bitwise"], row[f"{name}_vs_deterministic_rel"] = repeats_and_distance(
                    name, inputs, 4, two_kernels
                )
        times = alternating_ms({v: lambda v=v, t=inputs: backward(v, t) for v in variants}, args.rounds)
        for variant, ms in times.items():
            row[f"{variant}_ms"] = ms
        row["median_ratio"] = statistics.median(times["deterministic"]) / statistics.median(times["fused"])
        for variant in (v for v in variants if v.startswith("ordered")):
            row[f"deterministic_over_{variant}"] = statistics.median(
                times["deterministic"]
            ) / statistics.median(times[variant])
            row[f"fused_over_{variant}"] = statistics.median(times["fused"]) / statistics.median(
                times[variant]
            )
        print({k: val for k, val in row.items() if not k.endswith("_ms")}, flush=True)
        rows.append(row)
        write_results(args.out, rows)
    _flash_bwd_fused_hopper.ORDERED_ENABLED = ordered_default
    _flash_bwd_fused_hopper.CONFIGS.clear()
    _flash_bwd_fused_hopper.CONFIGS.update(configs_default)


if __name__ == "__main__":
    main()
