"""Runs every autotune config of the FlashAttention kernels alone, one process each, and reports which
fail: a compile error, a CUDA fault (a misaligned address, say) or numbers off the float64 reference.

A CUDA fault poisons its process and the autotuner's sweep hides which config caused it, so each
(kernel, config) gets its own process; the other two kernels run fixed configs (--others), so a fault
belongs to the config under test.

    python benchmarks/check_kernel_configs.py --batch 4 --seqlen 4096 --nheads 32 --headdim 64 --causal --dropout 0.1

Prints one line per (kernel, config) and writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNELS = ("fwd", "dkdv", "dq")


def kernel_tuner(kernel: str):
    """The autotuner of one of KERNELS."""
    from kernels import _flash_bwd, _flash_fwd

    return {
        "fwd": _flash_fwd._attn_fwd_tuned,
        "dkdv": _flash_bwd._bwd_dkdv_tuned,
        "dq": _flash_bwd._bwd_dq_tuned,
    }[kernel]


def run_one(args) -> dict:
    """In the child: force one config of one kernel, run fwd+bwd, compare with the float64 reference."""
    import torch

    from kernels import _common, flash_attention
    from kernels.reference import attention_reference, dropout_keep_reference

    kernel, index = args.one.split(":")
    others = dict(item.split("=") for item in args.others.split(","))
    for name in KERNELS:  # one config each: the autotuner launches it without a sweep
        tuner = kernel_tuner(name)
        tuner.configs = [tuner.configs[int(index if name == kernel else others[name])]]
    config = kernel_tuner(kernel).configs[0]
    b, n, h, d, p = args.batch, args.seqlen, args.nheads, args.headdim, args.dropout
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.manual_seed(1)
    out = flash_attention(q, k, v, causal=args.causal, dropout_p=p)
    grads = torch.autograd.grad(out, (q, k, v), do)
    torch.cuda.synchronize()
    # the float64 reference on batch 0, heads 0..3 (the whole problem would not fit in float64)
    sl = (slice(0, 1), slice(None), slice(0, 4))
    kw = dict(causal=args.causal, dropout_p=p)
    if p > 0:
        torch.manual_seed(1)
        rows = torch.arange(4 * n, device="cuda")[:, None]  # the kernels' row ids of (batch 0, heads 0..3)
        keep = dropout_keep_reference(_common.draw_seed(), rows, torch.arange(n, device="cuda")[None], p)
        kw["dropout_mask"] = keep.view(1, 4, n, n)
    ins = [t.detach()[sl].double().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*ins, **kw)
    ref_grads = torch.autograd.grad(ref, ins, do[sl].double())
    errs = [
        (a[sl].double() - r).abs().max().item() for a, r in zip((out, *grads), (ref, *ref_grads), strict=True)
    ]
    return {"config": f"{config.kwargs} w{config.num_warps} s{config.num_stages}", "max_errors": errs}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--nheads", type=int, default=32)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument(
        "--others", default="fwd=0,dkdv=5,dq=4", help="fixed configs of the kernels not under test"
    )
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=180)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: kernel:index
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args)))
        return

    jobs = [(kernel, i) for kernel in KERNELS for i in range(len(kernel_tuner(kernel).configs))]
    shape = [f"--batch={args.batch}", f"--seqlen={args.seqlen}", f"--nheads={args.nheads}",
             f"--headdim={args.headdim}", f"--dropout={args.dropout}", f"--others={args.others}",
             *(["--causal"] if args.causal else [])]  # fmt: skip

    def child(job):
        kernel, i = job
        cmd = [sys.executable, os.path.abspath(__file__), *shape, "--one", f"{kernel}:{i}"]
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"kernel": kernel, "index": i, "status": "timeout"}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode == 0 and lines:
            return {"kernel": kernel, "index": i, "status": "ok", **json.loads(lines[-1][7:])}
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        return {"kernel": kernel, "index": i, "status": f"rc={proc.returncode}", "error": " | ".join(tail)}

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(child, jobs))
    for r in results:
        detail = r.get("config", "") + " " + str(r.get("max_errors", r.get("error", "")))
        print(f"{r['kernel']:5s} #{r['index']}: {r['status']:8s} {detail}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
