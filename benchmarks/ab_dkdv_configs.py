"""The Gluon Hopper dK/dV kernel (`kernels._flash_dkdv_hopper`) alone, its config in use against the other
candidates of check_hopper_dkdv.py (one-pass head dims), in alternating rounds (each round starting one
entry later), on the issue's shapes (bf16, batch x seqlen = 16k tokens, nheads x
headdim = 2048) or GPT-2 medium's packed layer (b2 n8k h16 d64, causal): median milliseconds per round of
`flash_attn_dkdv_hopper` given the forward's lse and the delta, and per variant the median over rounds and
the in-use config's time ÷ it. Each variant first runs once, synchronised, with its name printed, so a
launch that never ends names itself (HANG_S seconds, 120 by default, then a traceback and exit).
(Session 59 timed its consumers taking turns with it: results/s59/dkdv_turns.patch, call2/.)

    python benchmarks/ab_dkdv_configs.py --headdim 64 --causal --seqlens 1024 4096 16384 --rounds 5 --out ab.json
    python benchmarks/ab_dkdv_configs.py --headdim 64 --packed --out ab.json
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.check_hopper_dkdv import CANDIDATES  # noqa: E402
from benchmarks.check_hopper_dq import forward  # noqa: E402
from benchmarks.check_hopper_fwd import speed_inputs  # noqa: E402
from benchmarks.common import alternating_ms, print_summary, write_results  # noqa: E402
from kernels import _flash_bwd, _flash_dkdv_hopper  # noqa: E402


def variants(headdim: int) -> dict:
    """name: config, the config in use first ("in_use"), then check_hopper_dkdv.py's other candidates."""
    in_use = _flash_dkdv_hopper.CONFIGS[headdim]
    others = [cfg for cfg in CANDIDATES[headdim] if cfg != in_use]
    return {"in_use": in_use, **{f"{c.block_m}x{c.block_n}_s{c.stages}": c for c in others}}


def case(headdim: int, seqlen: int, causal: bool, packed: bool, rounds: int, configs: dict) -> dict:
    row, q, k, v, scale, fwd_flops = speed_inputs(headdim, causal, seqlen, packed)
    torch.manual_seed(seqlen)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    out, lse = forward(q, k, v, causal, scale)
    delta = _flash_bwd.backward_delta(out, do, lse)
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def run(cfg):
        return lambda: _flash_dkdv_hopper.flash_attn_dkdv_hopper(
            q, k, v, do, dk, dv, lse, delta, sm_scale=scale, causal=causal, config=cfg
        )

    for name, cfg in configs.items():  # (a hang names its variant)
        print(f"first launch: {name}", flush=True)
        run(cfg)()
        torch.cuda.synchronize()
    for name, times in alternating_ms({name: run(cfg) for name, cfg in configs.items()}, rounds).items():
        row[f"{name}_ms"] = times
        row[f"{name}_median_ms"] = statistics.median(times)
        # (the kernel's products: S^T, dP^T, dV and dK, 4 of the forward's 2)
        row[f"{name}_tflops"] = 2 * fwd_flops / row[f"{name}_median_ms"] / 1e9
    for name in configs:
        if name != "in_use":
            row[f"in_use_over_{name}"] = row["in_use_median_ms"] / row[f"{name}_median_ms"]
    print_summary(row)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, choices=sorted(_flash_dkdv_hopper.CONFIGS), required=True)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument(
        "--packed", action="store_true", help="GPT-2 medium's packed layer (b2 n8k h16, causal)"
    )
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if _flash_dkdv_hopper.passes(args.headdim) != (0,):
        parser.error(
            f"head dim {args.headdim} runs two passes, each with its own config: use check_hopper_dkdv.py"
        )
    faulthandler.dump_traceback_later(timeout=float(os.environ.get("HANG_S", "120")), exit=True)
    configs = variants(args.headdim)
    shapes = [(8192, True, True)] if args.packed else [(n, args.causal, False) for n in args.seqlens]
    rows = []
    for seqlen, causal, packed in shapes:
        rows.append(case(args.headdim, seqlen, causal, packed, args.rounds, configs))
        faulthandler.dump_traceback_later(timeout=float(os.environ.get("HANG_S", "120")), exit=True)
        write_results(
            args.out, rows, dict(configs={n: str(c) for n, c in configs.items()}, rounds=args.rounds)
        )


if __name__ == "__main__":
    main()
