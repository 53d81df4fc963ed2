"""Where the ordered backward's dq conversion runs (GPU only): kernel timestamps from torch.profiler of d128
fwd+bwd calls, with dq written in the backward's tail (`kernels._dq_tail`) and with the pass after it.

Per call and way: the one-kernel backward's start and length, and every kernel after it up to the next
forward (the tail kernel, or torch's sum/copy pass), each as (name, start - the backward's end, length), µs.
A tail kernel that starts before the backward ends has a negative start there.

    python benchmarks/diag_dq_tail.py --out diag_dq_tail.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import write_results  # noqa: E402
from kernels import _dq_tail, flash_attention  # noqa: E402

BACKWARD = "_attn_bwd_fused_hopper"


def kernel_events(fn, calls: int) -> list[dict]:
    """The CUDA kernels of `calls` runs of fn, in start order: name, ts and dur (µs)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    return sorted(
        ({"name": e["name"], "ts": e["ts"], "dur": e["dur"]} for e in kernels), key=lambda e: e["ts"]
    )


def after_backward(events: list[dict]) -> list[dict]:
    """Per backward kernel: its length and the kernels that start after it began, until the next forward."""
    rows = []
    for i, e in enumerate(events):
        if BACKWARD not in e["name"]:
            continue
        end = e["ts"] + e["dur"]
        rest = []
        for later in events[i + 1 :]:
            if "fwd" in later["name"]:
                break
            rest.append((later["name"][:60], round(later["ts"] - end, 1), round(later["dur"], 1)))
        rows.append({"backward_us": round(e["dur"], 1), "after": rest})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", nargs="+", default=["full:4096", "causal:16384"], help="causal|full:SEQLEN"
    )
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for spec in args.cases:
        kind, seqlen = spec.split(":")
        seqlen, causal = int(seqlen), kind == "causal"
        batch = max(1, 16384 // seqlen)
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        do = torch.randn_like(q)

        def fwdbwd(q=q, k=k, v=v, do=do, causal=causal):
            torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)

        for tail in (True, False):
            _dq_tail.ENABLED = tail
            for _ in range(3):  # (compile, warm up)
                fwdbwd()
            torch.cuda.synchronize()
            row = dict(causal=causal, seqlen=seqlen, batch=batch, tail=tail,
                       calls=after_backward(kernel_events(fwdbwd, args.calls)))  # fmt: skip
            print(row)
            rows.append(row)
    _dq_tail.ENABLED = True
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
