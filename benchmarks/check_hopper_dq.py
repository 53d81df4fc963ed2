"""The Gluon Hopper dq kernel (`kernels._flash_dq_hopper`) against the portable one, config by config.

1. Correctness: each candidate config on the Hopper forward's edge shapes (tests/kernels/
   test_flash_fwd_hopper.py's EDGES: lengths 1-4k, GQA/MQA, causal both ways, rows that see no key),
   bf16 and fp16: dq against an fp32 autograd reference with the tests' rule (max error within 2x that
   of torch's computation in the input dtype + a floor), delta = rowsum(dO * O) against fp32, no NaN.
2. Speed: the whole backward (`_flash_bwd.flash_attn_backward`: dq kernel, then the dK/dV kernel that
   dispatch picks) with each config's dq kernel and with the portable one, at the benchmark's shapes (batch x
   seqlen = 16k tokens, nheads x headdim = 2048) and GPT-2 medium's layer (packed QKV, b2 n8k h16 d64
   causal); and the Gluon dq kernel alone.

    python benchmarks/check_hopper_dq.py --out results.json [--quick]
Exit status 1 when a config fails a correctness check.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.check_hopper_fwd import (  # noqa: E402
    add_tflops,
    check_all,
    finish,
    max_err,
    parser_for,
    speed_inputs,
    start,
    sweep,
)
from benchmarks.common import time_ms  # noqa: E402
from kernels import _flash_bwd, _flash_dkdv_hopper, _flash_dq_hopper, _flash_fwd  # noqa: E402
from kernels._flash_dq_hopper import HopperDqConfig as Cfg  # noqa: E402
from kernels.reference import attention_reference  # noqa: E402

CANDIDATES = {  # the first of each list is the one in use (_flash_dq_hopper.CONFIGS; none at d64)
    64: [Cfg(64, 128, 2, 3, 240), Cfg(64, 64, 2, 4, 240), Cfg(64, 128, 2, 2, 240)],
    128: [Cfg(64, 64, 2, 4, 240), Cfg(64, 64, 2, 3, 240), Cfg(64, 128, 2, 2, 240)],
    256: [Cfg(64, 32, 2, 3, 240), Cfg(64, 32, 2, 2, 240)],
}


def forward(q, k, v, causal, scale):
    return _flash_fwd.flash_attn_forward(
        q, k, v, sm_scale=scale, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
        dropout_p=0.0, seed=0,
    )  # fmt: skip


def backward(do, q, k, v, out, lse, causal, scale, hopper_dq, hopper_dkdv=None):
    """The whole backward with the Hopper dq kernel on or off, and the dK/dV one too (None: as set)."""
    dkdv_was = _flash_dkdv_hopper.ENABLED
    _flash_dq_hopper.ENABLED = hopper_dq
    if hopper_dkdv is not None:
        _flash_dkdv_hopper.ENABLED = hopper_dkdv
    try:
        return _flash_bwd.flash_attn_backward(
            do, q, k, v, out, lse, sm_scale=scale, win_left=None, win_right=0 if causal else None,
            key_padding_mask=None, dropout_p=0.0, seed=0,
        )  # fmt: skip
    finally:
        _flash_dq_hopper.ENABLED, _flash_dkdv_hopper.ENABLED = True, dkdv_was


def reference_dq(q, k, v, do, causal, scale):
    """dq of `attention_reference` by autograd, on copies of q, k, v (in their dtype)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    (dq,) = torch.autograd.grad(out, q, do.to(out.dtype))
    return dq


def check_config(cfg, d, dtype, shapes):
    rows, ok = [], True
    for b, nq, nk, h, hkv, causal in shapes:
        torch.manual_seed(nq + nk + d)
        q = torch.randn(b, nq, h, d, device="cuda", dtype=dtype)
        (
            k,
            v,
        ) = (torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        scale = 1 / math.sqrt(d)
        out, lse = forward(q, k, v, causal, scale)
        dq, delta = torch.empty_like(q), torch.empty_like(lse)
        _flash_dq_hopper.flash_attn_dq_hopper(q, k, v, do, out, lse, delta, dq, sm_scale=scale, causal=causal,
                                              config=cfg)  # fmt: skip
        torch.cuda.synchronize()
        ref = reference_dq(q.float(), k.float(), v.float(), do.float(), causal, scale)
        lp_err = max_err(reference_dq(q, k, v, do, causal, scale), ref)
        ref_delta = (do.float() * out.float()).sum(-1).transpose(1, 2)
        e_dq, e_delta = max_err(dq, ref), max_err(delta, ref_delta)
        good = not torch.isnan(dq).any() and e_dq <= 2 * lp_err + 2e-3 and e_delta <= 1e-3 * (1 + d**0.5)
        ok &= bool(good)
        rows.append(dict(shape=[b, nq, nk, h, hkv, d], causal=causal, dtype=str(dtype)[6:], err_dq=e_dq,
                         rounding_err_dq=lp_err, err_delta=e_delta, ok=bool(good)))  # fmt: skip
        if not good:
            print("FAIL", cfg, rows[-1], flush=True)
    print(f"{'ok  ' if ok else 'FAIL'} {cfg} d{d} {dtype}: {len(rows)} shapes", flush=True)
    return ok, rows


def backward_inputs(d, causal, seqlen, packed=False):
    """(row, q, k, v, do, out, lse, scale, backward flops) at the benchmark's shapes (batch x seqlen = 16k
    tokens, nheads x headdim = 2048) or, packed, GPT-2 medium's layer (q, k, v views of one projection)."""
    row, q, k, v, scale, fwd_flops = speed_inputs(d, causal, seqlen, packed)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    out, lse = forward(q, k, v, causal, scale)
    return row, q, k, v, do, out, lse, scale, 2.5 * fwd_flops  # (the backward's flops)


@contextlib.contextmanager
def dispatching(module, headdim, cfg):
    """`module` (a Hopper kernel module) takes every call at headdim with cfg while inside: its
    CONFIGS[headdim] and its faster_here rule are put back afterwards."""
    in_use, rule = module.CONFIGS.get(headdim), module.faster_here
    module.CONFIGS[headdim], module.faster_here = cfg, lambda *a: True
    try:
        yield
    finally:
        module.faster_here = rule
        if in_use is None:
            del module.CONFIGS[headdim]
        else:
            module.CONFIGS[headdim] = in_use


def speed(d, causal, seqlen, cfgs, packed=False):
    row, q, k, v, do, out, lse, scale, flops = backward_inputs(d, causal, seqlen, packed)
    row["bwd_portable_ms"] = time_ms(lambda: backward(do, q, k, v, out, lse, causal, scale, False))
    for cfg in cfgs:
        key = f"{cfg.block_m}x{cfg.block_n}_s{cfg.stages}_r{cfg.consumer_regs}"
        try:
            with dispatching(_flash_dq_hopper, d, cfg):
                row[f"bwd_gluon_{key}_ms"] = time_ms(
                    lambda: backward(do, q, k, v, out, lse, causal, scale, True)
                )
            bufs = torch.empty_like(q), torch.empty_like(lse)
            row[f"dq_gluon_{key}_ms"] = time_ms(
                lambda cfg=cfg, bufs=bufs: _flash_dq_hopper.flash_attn_dq_hopper(
                    q, k, v, do, out, lse, bufs[1], bufs[0], sm_scale=scale, causal=causal, config=cfg
                )
            )
        except Exception as e:  # noqa: BLE001  (a config that does not fit is reported, not fatal)
            row[f"gluon_{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    add_tflops(row, flops, prefix="bwd")
    best = min((v, k) for k, v in row.items() if k.startswith("bwd_gluon") and k.endswith("_ms"))
    print(f"d{d} n{seqlen} causal={causal} packed={packed}: backward portable {row['bwd_portable_tflops']:.0f} "
          f"TFLOP/s, with the gluon dq {flops / best[0] / 1e9:.0f} ({best[1]}; "
          f"{row['bwd_portable_ms'] / best[0]:.3f}x)", flush=True)  # fmt: skip
    return row


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--skip-speed", action="store_true")
    args, candidates = start(parser, CANDIDATES)
    all_ok, checks = check_all(candidates, check_config)
    finish(args.out, [] if args.skip_speed else sweep(speed, candidates), checks, all_ok)


if __name__ == "__main__":
    main()
