"""The Gluon Hopper forward (`kernels._flash_fwd_hopper`) against the portable forward, config by config.

1. Correctness: each candidate config on shapes that exercise its edges (lengths 1, 17, 127, 129, 300,
   1000 and 4k, GQA and MQA, causal with seqlen_q != seqlen_k both ways, rows that see no key, packed
   QKV strides, fp16 and bf16) against an fp32 reference, with the tests' rule: max error within 2x
   that of torch's computation in the input dtype + a floor; lse within 1e-3; no NaN.
2. Speed: forward milliseconds of each config and of the portable kernel (its autotuned config), with
   SDPA's cuDNN and flash kernels as anchors, at the benchmark's shapes (batch x seqlen = 16k tokens,
   nheads x headdim = 2048) and GPT-2 medium's layer (packed QKV, b2 n8k h16 d64 causal).

    python benchmarks/check_hopper_fwd.py --out results.json [--quick]
Exit status 1 when a config fails a correctness check.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import itertools
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import time_ms, write_results  # noqa: E402
from kernels import _flash_fwd, _flash_fwd_hopper  # noqa: E402
from kernels._flash_fwd_hopper import HopperFwdConfig as Cfg  # noqa: E402
from kernels.reference import attention_reference  # noqa: E402
from tests.kernels.test_flash_fwd_hopper import EDGES  # noqa: E402  (the GPU tests' edge shapes)

LOG2E = 1.4426950408889634

CANDIDATES = {  # the first of each list is the one in use (_flash_fwd_hopper.CONFIGS)
    # (pingpong=True: the consumers take turns at issuing their products, `_flash_fwd_hopper.wait_turn`)
    64: [
        Cfg(64, 128, 2, 3, 240),
        Cfg(64, 128, 2, 3, 240, persistent=True),
        Cfg(64, 128, 2, 3, 240, pingpong=True),
        Cfg(64, 128, 2, 3, 240, persistent=True, pingpong=True),
    ],
    # (128-key tiles in K and V rings of 2 and 2 or 3 and 2 tiles (v_stages) from 2k queries, the persistent
    # variant's 64-key ones below; 128-key tiles on three shared stages (224 KB) were fast but gave wrong
    # outputs under the GPU tests, on two shared stages 0.89-0.96x the 64-key ones (session 38))
    128: [
        Cfg(64, 128, 2, 2, 240, v_stages=2),
        Cfg(64, 128, 2, 3, 240, v_stages=2),
        Cfg(64, 64, 2, 4, 240, persistent=True),
        Cfg(64, 64, 2, 4, 240),
        Cfg(64, 128, 2, 3, 240),
        Cfg(64, 128, 2, 2, 240, v_stages=2, pingpong=True),
        Cfg(64, 64, 2, 4, 240, persistent=True, pingpong=True),
    ],
    256: [Cfg(64, 32, 2, 3, 240), Cfg(64, 64, 2, 2, 240), Cfg(64, 32, 2, 4, 240), Cfg(64, 32, 2, 2, 240)],
}


def reference(q, k, v, causal, scale):
    """fp32 out and base-2 lse (`kernels.reference.attention_reference` on fp32 copies)."""
    out, lse = attention_reference(
        q.float(), k.float(), v.float(), causal=causal, softmax_scale=scale, return_lse=True
    )
    return out, lse * LOG2E


def portable(q, k, v, causal, scale):
    _flash_fwd_hopper.ENABLED = False
    try:
        return _flash_fwd.flash_attn_forward(
            q, k, v, sm_scale=scale, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
            dropout_p=0.0, seed=0,
        )  # fmt: skip
    finally:
        _flash_fwd_hopper.ENABLED = True


def max_err(a, b):
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    diff = (a - b).abs().masked_fill(both_inf, 0.0)
    return float(diff.nan_to_num(float("inf")).max()) if diff.numel() else 0.0


def check_config(cfg, d, dtype, shapes):
    """The tests' tolerance rule: error against the fp32 reference within 2x that of torch's own
    computation in dtype (`kernels.reference.attention_reference` on the dtype inputs) + a floor."""
    rows, ok = [], True
    for b, nq, nk, h, hkv, causal in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, nq, h, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        scale = 1 / math.sqrt(d)
        ref_o, ref_l = reference(q, k, v, causal, scale)
        o, lse = _flash_fwd_hopper.flash_attn_forward_hopper(
            q, k, v, sm_scale=scale, causal=causal, config=cfg
        )
        torch.cuda.synchronize()
        lp_err = max_err(attention_reference(q, k, v, causal=causal, softmax_scale=scale), ref_o)
        e_o, e_l = max_err(o, ref_o), max_err(lse, ref_l)
        good = (
            not torch.isnan(o).any()
            and e_o <= 2 * lp_err + 2e-3
            and e_l <= 1e-3
            and torch.equal(torch.isinf(lse), torch.isinf(ref_l))
        )
        ok &= bool(good)
        rows.append(dict(shape=[b, nq, nk, h, hkv, d], causal=causal, dtype=str(dtype)[6:], err_out=e_o,
                         rounding_err_out=lp_err, err_lse=e_l, ok=bool(good)))  # fmt: skip
        if not good:
            print("FAIL", cfg, rows[-1], flush=True)
    print(f"{'ok  ' if ok else 'FAIL'} {cfg} d{d} {dtype}: {len(rows)} shapes", flush=True)
    return ok, rows


def packed_check(cfg):
    """GPT-2's layout: q, k, v are views of one (B, S, 3H, D) projection output."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 1000, 3 * 4, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split(4, dim=2)
    ref_o, _ = reference(q, k, v, True, 0.125)
    o, _ = _flash_fwd_hopper.flash_attn_forward_hopper(q, k, v, sm_scale=0.125, causal=True, config=cfg)
    e, lp = max_err(o, ref_o), max_err(attention_reference(q, k, v, causal=True, softmax_scale=0.125), ref_o)
    print(("ok  " if e <= 2 * lp + 2e-3 else "FAIL"), "packed", cfg, e, lp, flush=True)
    return e <= 2 * lp + 2e-3, dict(shape="packed b2 n1000 h4 d64 causal", err_out=e, rounding_err_out=lp)


def check_all(candidates, check):
    """check(cfg, headdim, dtype, shapes) -> (ok, rows) for every candidate config, on the edge shapes in
    bf16 and their first six in fp16; returns (all ok, the records)."""
    all_ok, checks = True, []
    for d, cfgs in candidates.items():
        for cfg in cfgs:
            for dtype in (torch.bfloat16, torch.float16):
                ok, rows = check(cfg, d, dtype, EDGES if dtype == torch.bfloat16 else EDGES[:6])
                all_ok &= ok
                checks.append(dict(config=str(cfg), rows=rows))
    return all_ok, checks


def sdpa_ms(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))


def speed_inputs(d, causal, seqlen, packed=False):
    """(row, q, k, v, scale, forward flops) at the benchmark's shapes (batch x seqlen = 16k tokens,
    nheads x headdim = 2048) or, packed, GPT-2 medium's layer (q, k, v views of one projection)."""
    if packed:
        b, h = 2, 16
        qkv = torch.randn(b, seqlen, 3 * h, d, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.split(h, dim=2)
    else:
        b, h = 16384 // seqlen, 2048 // d
        q, k, v = (torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * seqlen * seqlen * d / (2 if causal else 1)
    row = dict(batch=b, seqlen=seqlen, nheads=h, headdim=d, causal=causal, packed=packed)
    return row, q, k, v, 1 / math.sqrt(d), flops


def add_tflops(row, flops, prefix=""):
    """A `*_tflops` entry beside each `<prefix>*_ms` one of row."""
    for key in [k for k in row if k.startswith(prefix) and k.endswith("_ms")]:
        row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9


def sweep(speed, candidates, seqlens=(1024, 4096, 16384)):
    """speed(headdim, causal, seqlen, configs[, packed]) rows: each head dim of candidates, causal and full,
    at seqlens, and (with d64) GPT-2 medium's packed layer (b2 n8k h16 d64 causal)."""
    rows = [
        speed(d, causal, seqlen, candidates[d])
        for d in sorted(candidates)
        for causal in (True, False)
        for seqlen in seqlens
    ]
    return rows + ([speed(64, True, 8192, candidates[64], packed=True)] if 64 in candidates else [])


def parser_for(doc):
    """The check scripts' command line: --out (the results JSON), --quick (the first config per head
    dim only) and --headdims (those of the candidates to run; all by default); each script adds its own
    options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="first config per head dim only")
    parser.add_argument("--headdims", type=int, nargs="+", help="these head dims' candidates only")
    return parser


def start(parser, candidates):
    """(arguments, the candidate configs to run): parses the command line and arms the hang guard
    (a traceback and exit after HANG_S seconds, 240 by default)."""
    args = parser.parse_args()
    faulthandler.dump_traceback_later(timeout=float(os.environ.get("HANG_S", "240")), exit=True)
    unknown = set(args.headdims or ()) - set(candidates)
    if unknown:
        parser.error(f"no candidate configs for head dims {sorted(unknown)}; have {sorted(candidates)}")
    return args, {
        d: c[:1] if args.quick else c
        for d, c in candidates.items()
        if not args.headdims or d in args.headdims
    }


def finish(out, rows, checks, all_ok):
    """Writes the results and exits: status 1 when a config failed a correctness check."""
    write_results(out, rows, dict(checks=checks, all_ok=all_ok))
    print("all configs correct" if all_ok else "SOME CONFIG FAILED", flush=True)
    sys.exit(0 if all_ok else 1)


def speed(d, causal, seqlen, cfgs, packed=False, rounds=1):
    """The forward's time with each config; rounds > 1 times them round-robin that many times (keys
    end in _round0, _round1, ...)."""
    row, q, k, v, scale, flops = speed_inputs(d, causal, seqlen, packed)
    row["portable_ms"] = time_ms(lambda: portable(q, k, v, causal, scale))
    for r, cfg in itertools.product(range(rounds), cfgs):
        key = f"gluon_{cfg.block_m}x{cfg.block_n}_c{cfg.consumers}_s{cfg.stages}_r{cfg.consumer_regs}"
        key += "_persistent" if cfg.persistent else ""
        key += f"_v{cfg.v_stages}" if cfg.v_stages else ""
        key += "_pingpong" if cfg.pingpong else ""
        key += f"_round{r}" if rounds > 1 else ""
        try:
            row[key + "_ms"] = time_ms(
                lambda cfg=cfg: _flash_fwd_hopper.flash_attn_forward_hopper(
                    q, k, v, sm_scale=scale, causal=causal, config=cfg
                )
            )
        except Exception as e:  # noqa: BLE001  (a config that does not fit is reported, not fatal)
            row[key + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        try:
            row[backend.split("_")[0].lower() + "_ms"] = sdpa_ms(q, k, v, causal, backend)
        except Exception as e:  # noqa: BLE001
            row[backend.lower() + "_error"] = str(e)[:200]
    add_tflops(row, flops)
    best = min((v, k) for k, v in row.items() if k.startswith("gluon") and k.endswith("_ms"))
    print(f"d{d} n{seqlen} causal={causal} packed={packed}: portable {row['portable_tflops']:.0f} TFLOP/s, "
          f"best gluon {flops / best[0] / 1e9:.0f} ({best[1]}), cudnn {row.get('cudnn_tflops', 0):.0f}, "
          f"flash {row.get('flash_tflops', 0):.0f}", flush=True)  # fmt: skip
    return row


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="time the configs round-robin this many times")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument(
        "--check-quick", action="store_true", help="correctness of the first config per head dim"
    )
    args, candidates = start(parser, CANDIDATES)
    checked = {d: c[:1] if args.check_quick else c for d, c in candidates.items()}
    all_ok, checks = check_all(checked, check_config)
    for cfg in checked.get(64, []):
        ok, row = packed_check(cfg)
        all_ok &= ok
        checks.append(dict(config=str(cfg), rows=[row]))
    timed = functools.partial(speed, rounds=args.rounds)
    finish(args.out, [] if args.skip_speed else sweep(timed, candidates, args.seqlens), checks, all_ok)


if __name__ == "__main__":
    main()
