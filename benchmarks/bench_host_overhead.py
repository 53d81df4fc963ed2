"""Host cost of one attention call: how long the Python side of our dense and block-sparse kernels
takes to issue a forward and backward, against how long the GPU needs for them.

At small sizes (a 4k-token sequence, a short-context GPT step) the host, not the GPU, sets the pace:
the wrappers, torch's dispatch and autograd, Triton's launcher and autotuner lookup. For each path,
on a (1, n, 16, d) bf16 problem:

- `fwdbwd_host_ms`: mean wall time per fwd+bwd call, issued back to back without synchronising
  (the host's rate when it cannot keep ahead of nothing but itself);
- `fwdbwd_synced_ms`: the same with a device sync after every call (host and device in series);
- `fwd_host_ms`: the forward alone under no_grad;
- `host_top`: cProfile's top functions by own time per fwd+bwd call (`common.host_profile`, 100 calls).

    python benchmarks/bench_host_overhead.py --out benchmarks/results/host_overhead_<gpu>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import gpu_slug, host_profile, write_results  # noqa: E402
from kernels import flash_attention  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402


def per_call_ms(fn, calls: int, sync_each: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1000 * elapsed / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/host_overhead_<gpu>.json)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_host_overhead.py measures CUDA launches; no CUDA device is visible")
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"host_overhead_{gpu_slug()}.json")
    shape = (1, args.seqlen, 16, args.headdim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    layout = butterfly_layout(args.seqlen, 128).cuda()
    paths = {
        "block_sparse": lambda: block_sparse_attention(q, k, v, layout),
        "dense": lambda: flash_attention(q, k, v),
    }
    rows = []
    for name, forward in paths.items():
        fwdbwd = lambda forward=forward: torch.autograd.grad(forward(), (q, k, v), do)  # noqa: E731
        for _ in range(10):  # compile, autotune, warm up
            fwdbwd()
        row = dict(path=name, seqlen=args.seqlen, headdim=args.headdim, nheads=16, batch=1)
        row["fwdbwd_host_ms"] = per_call_ms(fwdbwd, args.calls, sync_each=False)
        row["fwdbwd_synced_ms"] = per_call_ms(fwdbwd, args.calls, sync_each=True)
        with torch.no_grad():
            row["fwd_host_ms"] = per_call_ms(forward, args.calls, sync_each=False)
        row["host_top"] = host_profile(fwdbwd, steps=100, top=22)
        rows.append(row)
        print({key: val for key, val in row.items() if key != "host_top"}, flush=True)
        for entry in row["host_top"]:
            print(f"  {entry['own_ms']:8.3f} ms own  {entry['cum_ms']:8.3f} ms cum  {entry['function']}")
    write_results(out, rows, extra=dict(dtype="bfloat16"))


if __name__ == "__main__":
    main()
