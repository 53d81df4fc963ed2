"""The Gluon Hopper forward's configs against each other and SDPA cuDNN's forward, in alternating rounds
(each round starting one entry later), on the issue's shapes (bf16, batch x seqlen = 16k tokens, nheads x
headdim = 2048): the forward's own call (`flash_attn_forward_hopper` with the config given), median
milliseconds per round, and per config the median over rounds and cuDNN's ÷ it.

    python benchmarks/ab_fwd_configs.py --headdim 128 --causal --seqlens 2048 4096 8192 --rounds 6 --out ab.json
    python benchmarks/ab_fwd_configs.py --pingpong ...   # each config also with FlashAttention-3's ping-pong

At the H200's power cap (~690 W) configs that draw more per cycle run at lower clocks: `--settle-ms 1500
--rep-ms 500 --gpu-clocks` times each config settled at its own draw (as `ab_cudnn.py`), with its median SM
clock and power over its timed windows.
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
    alternating_ms,
    clocks_per_call,
    gpu_clock_log,
    print_summary,
    write_results,
)
from kernels import _flash_fwd_hopper  # noqa: E402
from kernels._flash_fwd_hopper import HopperFwdConfig as Cfg  # noqa: E402

CANDIDATES = {  # name: config, per head dim
    128: {
        "persistent_64key_s4": _flash_fwd_hopper.PERSISTENT_64KEY,
        "rows_128key_rings2": _flash_fwd_hopper.CONFIGS[128],
        "rows_64key_s4": Cfg(block_m=64, block_n=64, consumers=2, stages=4, consumer_regs=240),
        # (the persistent variant on the row-tile kernel's 128-key tiles in K and V rings of 2 + 2: 197 KB)
        "persistent_128key_rings2": _flash_fwd_hopper.PERSISTENT_CONFIGS[128],
    },
    64: {
        "persistent": _flash_fwd_hopper.PERSISTENT_CONFIGS[64],
        "rows": _flash_fwd_hopper.CONFIGS[64],
        # (the persistent variant's K and V in rings of their own: 3 + 3 tiles, 131 KB; 4 + 3, 148 KB. Forward
        # alone at full 1k-16k, one H200: 0.935-0.991x cuDNN's against one ring's 0.991-1.000 with turns,
        # results/s76/call9, so d64 keeps one ring)
        "persistent_rings3": dataclasses.replace(_flash_fwd_hopper.PERSISTENT_CONFIGS[64], v_stages=3),
        "persistent_rings4_3": dataclasses.replace(
            _flash_fwd_hopper.PERSISTENT_CONFIGS[64], stages=4, v_stages=3
        ),
    },
}
# --pingpong: beside each, the same config with its consumers taking turns (`_flash_fwd_hopper.wait_turn`)
PINGPONG_SUFFIX = "_pingpong"


def candidates(headdim: int, pingpong: bool, only=None) -> dict:
    """The configs timed at this head dim: CANDIDATES' (those named in `only`, if given), and with
    pingpong each also with turns."""
    if only is not None:
        unknown = sorted(set(only) - set(CANDIDATES[headdim]))
        if unknown:
            raise ValueError(f"--only {unknown}: d{headdim}'s candidates are {sorted(CANDIDATES[headdim])}")
    chosen = {name: cfg for name, cfg in CANDIDATES[headdim].items() if only is None or name in only}
    if pingpong:
        for name, cfg in list(chosen.items()):
            chosen[name + PINGPONG_SUFFIX] = dataclasses.replace(cfg, pingpong=True)
    return chosen


def case(
    headdim: int,
    seqlen: int,
    causal: bool,
    rounds: int,
    configs: dict,
    settle_ms=0.0,
    rep_ms=100.0,
    gpu_clocks=False,
) -> dict:
    batch, nheads = issue_shape(seqlen, headdim)
    torch.manual_seed(seqlen)
    q, k, v = (
        torch.randn(batch, seqlen, nheads, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(3)
    )
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    scale = headdim**-0.5

    sdpa_cudnn = make_impl("sdpa_cudnn")
    cudnn = lambda: sdpa_cudnn(qt, kt, vt, causal)  # noqa: E731
    calls = {
        name: (
            lambda c=cfg: _flash_fwd_hopper.flash_attn_forward_hopper(
                q, k, v, sm_scale=scale, causal=causal, config=c
            )
        )
        for name, cfg in configs.items()
    }
    calls["cudnn"] = cudnn
    want = cudnn().transpose(1, 2).float()
    row = dict(headdim=headdim, seqlen=seqlen, causal=causal, rounds=rounds,
               chosen=dataclasses.asdict(_flash_fwd_hopper.config_for(headdim, seqlen, causal)))  # fmt: skip
    names = list(calls)
    for name in names[:-1]:  # (each config's output against cuDNN's, so a timing is of a right answer)
        row[f"{name}_max_err"] = (calls[name]()[0].float() - want).abs().max().item()
    windows = {}
    with gpu_clock_log() if gpu_clocks else contextlib.nullcontext({}) as clock_summary:
        times = alternating_ms(calls, rounds, settle_ms, rep_ms, windows)
    flops = fwd_flops(batch, nheads, seqlen, headdim, causal)
    for name, ms in times.items():
        row[f"{name}_ms"] = ms
        row[f"{name}_tflops"] = flops / statistics.median(ms) / 1e9
        row[f"cudnn_over_{name}"] = statistics.median(times["cudnn"]) / statistics.median(ms)
    row.update(settle_ms=settle_ms, rep_ms=rep_ms)
    if gpu_clocks:
        row["gpu_clocks"] = clocks_per_call(clock_summary, windows)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128, choices=sorted(CANDIDATES))
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--pingpong", action="store_true", help="also each config with its consumers taking turns"
    )
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="time these CANDIDATES alone")
    parser.add_argument("--settle-ms", type=float, default=0.0,
                        help="run each config back to back for this long right before timing it")  # fmt: skip
    parser.add_argument("--rep-ms", type=float, default=100.0, help="how long each timing lasts")
    parser.add_argument("--gpu-clocks", action="store_true",
                        help="each config's median SM clock and power over its timed windows (nvidia-smi)")  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    configs = candidates(args.headdim, args.pingpong, args.only)
    for seqlen in args.seqlens:
        row = case(
            args.headdim,
            seqlen,
            args.causal,
            args.rounds,
            configs,
            args.settle_ms,
            args.rep_ms,
            args.gpu_clocks,
        )
        print_summary(row)
        rows.append(row)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
