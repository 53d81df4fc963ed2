"""One decode call of ours and one of SDPA cuDNN inside a profiler range, for Nsight Compute.

    ncu --profile-from-start off --section SpeedOfLight --csv python benchmarks/ncu_decode.py \\
        --headdim 64 --nheads 16 --nheads-kv 16 --cache-len 65536

Both calls run (and compile) once before the range, so that ncu sees only the measured kernels: ours
(the split kernel, and the merge kernel where there are splits), then cuDNN's.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_decode import make_call  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cache-len", type=int, default=65536)
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--nheads-kv", type=int, default=16)
    parser.add_argument("--headdim", type=int, default=64)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: Nsight Compute profiles GPU kernels")
    if args.nheads % args.nheads_kv:
        raise SystemExit(f"--nheads-kv {args.nheads_kv} must divide --nheads {args.nheads}")
    shape = (args.batch, args.cache_len, args.nheads_kv, args.headdim)
    q = torch.randn(args.batch, 1, args.nheads, args.headdim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((args.batch,), args.cache_len, device="cuda", dtype=torch.int32)
    calls = [make_call(impl, q, k, v, seqlens) for impl in ("triton", "sdpa_cudnn")]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
