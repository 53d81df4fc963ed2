"""The Gluon Hopper dK/dV kernel (`kernels._flash_dkdv_hopper`) against the portable one, config by config.

1. Correctness: each candidate config on the Hopper forward's edge shapes (tests/kernels/
   test_flash_fwd_hopper.py's EDGES), bf16 and fp16: dK and dV against an fp32 autograd reference with
   the tests' rule (max error within 2x that of torch's computation in the input dtype + a floor), no NaN.
2. Speed: the whole backward (`_flash_bwd.flash_attn_backward`) with the portable kernels, with the
   Hopper dq kernel, and with the Hopper dq and each dK/dV config, at the benchmark's shapes (batch x
   seqlen = 16k tokens, nheads x headdim = 2048, head dim 128).

    python benchmarks/check_hopper_dkdv.py --out results.json [--quick]
Exit status 1 when a config fails a correctness check; the configs that pass are timed all the same.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.check_hopper_dq import backward, backward_inputs, check_all, dispatching, forward  # noqa: E402
from benchmarks.check_hopper_fwd import add_tflops, finish, max_err, parser_for, start  # noqa: E402
from benchmarks.common import rotated, time_ms  # noqa: E402
from kernels import _flash_bwd, _flash_dkdv_hopper, _flash_dq_hopper  # noqa: E402
from kernels._flash_dkdv_hopper import HopperDkdvConfig as Cfg  # noqa: E402
from kernels.reference import attention_reference  # noqa: E402

CANDIDATES = {  # the first of each list is the one in use (_flash_dkdv_hopper.CONFIGS)
    # (branch dkdv-carry-ds holds a variant that issues each step's dK product in the next step: on one
    # H200 it was 0.92-1.06x these, results/carry_ds/call1)
    # (results/s59/dkdv_turns.patch: this kernel's consumers taking turns at the tensor cores, as the
    # forward's; on one H200 the kernel alone 0.99-1.02x at d64 and d128 causal, 1.03-1.04x at d128 full
    # 1k-2k, which the one-kernel backward takes; block-sparse d128 0.93-1.00x: results/s59/call2, call3)
    128: [Cfg(64, 64, 2, 2, 240), Cfg(64, 64, 2, 3, 240)],
    # (branch dkdv-kv-regs holds K and V as register operands: at d128 they spill; at d64 on one H200 no
    # faster, and GPT-2 medium 8k 0.99x, results/s34/call4)
    64: [Cfg(128, 64, 2, 2, 240), Cfg(64, 64, 2, 4, 240), Cfg(128, 64, 2, 3, 240)],
    # (dv_block_m, dv_stages: the dV pass's query tile and stages, `HopperDkdvConfig.for_pass`)
    256: [
        Cfg(32, 64, 2, 2, 240, producer_regs=32, dv_block_m=64, dv_stages=2),
        Cfg(32, 64, 2, 2, 240, producer_regs=32),
        Cfg(32, 64, 2, 2, 240, producer_regs=32, dv_block_m=64, dv_stages=1),
    ],
}


def reference_dkdv(q, k, v, do, causal, scale):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    return torch.autograd.grad(out, (k, v), do.to(out.dtype))


def check_config(cfg, d, dtype, shapes):
    rows, ok = [], True
    for b, nq, nk, h, hkv, causal in shapes:
        torch.manual_seed(nq + nk + d)
        q = torch.randn(b, nq, h, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        scale = 1 / math.sqrt(d)
        out, lse = forward(q, k, v, causal, scale)
        delta = _flash_bwd.backward_delta(out, do, lse)
        dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        _flash_dkdv_hopper.flash_attn_dkdv_hopper(
            q, k, v, do, dk, dv, lse, delta, sm_scale=scale, causal=causal, config=cfg
        )
        torch.cuda.synchronize()
        ref = reference_dkdv(q.float(), k.float(), v.float(), do.float(), causal, scale)
        low = reference_dkdv(q, k, v, do, causal, scale)
        row = dict(shape=[b, nq, nk, h, hkv, d], causal=causal, dtype=str(dtype)[6:])
        good = True
        for name, got, r, lp in zip(("dk", "dv"), (dk, dv), ref, low, strict=True):
            e, lp_err = max_err(got, r), max_err(lp, r)
            row[f"err_{name}"], row[f"rounding_err_{name}"] = e, lp_err
            good &= not torch.isnan(got).any() and e <= 2 * lp_err + 2e-3
        row["ok"] = bool(good)
        ok &= bool(good)
        rows.append(row)
        if not good:
            print("FAIL", cfg, row, flush=True)
    print(f"{'ok  ' if ok else 'FAIL'} {cfg} d{d} {dtype}: {len(rows)} shapes", flush=True)
    return ok, rows


def guarded_check(cfg, d, dtype, shapes):
    """check_config, with a config whose launch raises reported as failed."""
    try:
        return check_config(cfg, d, dtype, shapes)
    except Exception as e:  # noqa: BLE001  (a candidate that cannot run is a failed candidate)
        error = f"{type(e).__name__}: {str(e)[:300]}"
        print("FAIL", cfg, f"d{d} {dtype}: {error}", flush=True)
        return False, [dict(ok=False, error=error)]


def speed(d, causal, seqlen, cfgs, packed=False, rounds=1):
    """The backward's time with each config; rounds > 1 times them round-robin that many times (keys
    end in _r0, _r1, ...; each round in a rotated order), for configs whose order between machines or
    runs is in doubt."""
    row, q, k, v, do, out, lse, scale, flops = backward_inputs(d, causal, seqlen, packed)
    row["bwd_portable_ms"] = time_ms(lambda: backward(do, q, k, v, out, lse, causal, scale, False, False))
    # the Hopper dq kernel with its config in use, whatever its faster_here says at this head dim; where
    # it has none (d64) the portable dq kernel, which writes the delta too
    dq_cfg = _flash_dq_hopper.CONFIGS.get(d)
    hopper_dq = dq_cfg is not None
    with dispatching(_flash_dq_hopper, d, dq_cfg) if hopper_dq else contextlib.nullcontext():
        if hopper_dq:
            row["bwd_hopper_dq_ms"] = time_ms(
                lambda: backward(do, q, k, v, out, lse, causal, scale, True, False)
            )
        # (each round starts one config later: timed in a fixed order, the later ones lose, `rotated`)
        for r, cfg in ((i, cfg) for i in range(rounds) for cfg in rotated(cfgs, i)):
            key = f"bwd_{'hopper_dq_' if hopper_dq else ''}dkdv_{cfg.block_m}x{cfg.block_n}_s{cfg.stages}"
            if cfg.dv_block_m or cfg.dv_stages:
                key += f"_dv{cfg.for_pass(1).block_m}s{cfg.for_pass(1).stages}"
            key += f"_r{r}" if rounds > 1 else ""
            try:
                with dispatching(_flash_dkdv_hopper, d, cfg):
                    row[key + "_ms"] = time_ms(
                        lambda: backward(do, q, k, v, out, lse, causal, scale, hopper_dq, True)
                    )
            except Exception as e:  # noqa: BLE001  (a config that does not fit is reported, not fatal)
                row[key + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    add_tflops(row, flops)
    print(f"d{d} n{seqlen} causal={causal} packed={packed}: backward TFLOP/s " + ", ".join(
        f"{k[4:-7]} {v:.0f}" for k, v in row.items() if k.endswith("_tflops")), flush=True)  # fmt: skip
    return row


def main():
    parser = parser_for(__doc__)
    parser.add_argument(
        "--speed", nargs="*", default=["128:causal", "128:full", "64:causal"],
        help="HEADDIM:causal|full cases to time (1k, 4k, 16k each), or HEADDIM:packed (GPT-2 medium's "
        "layer: packed QKV, b2 n8k h16, causal)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="time the configs round-robin this many times")
    args, candidates = start(parser, CANDIDATES)
    all_ok, checks = check_all(candidates, guarded_check)
    # only configs correct on every shape and dtype are timed
    failed = {c["config"] for c in checks if not all(row["ok"] for row in c["rows"])}
    candidates = {d: [cfg for cfg in cfgs if str(cfg) not in failed] for d, cfgs in candidates.items()}
    rows = []
    for case in args.speed:
        d, mask = case.split(":")
        if mask == "packed":
            rows.append(speed(int(d), True, 8192, candidates[int(d)], packed=True, rounds=args.rounds))
            continue
        for seqlen in (1024, 4096, 16384):
            rows.append(speed(int(d), mask == "causal", seqlen, candidates[int(d)], rounds=args.rounds))
    finish(args.out, rows, checks, all_ok)


if __name__ == "__main__":
    main()
