"""Is compiled FlexAttention slower once dynamo has recompiled it for a second sequence length?

torch.compile marks a dimension dynamic when a call with a new size recompiles (automatic dynamic
shapes), and the dynamic-shape kernel can differ from the one compiled for a single shape. The benchmarks
call Flex at many lengths in one process, so this times one shape three ways: compiled for it alone;
compiled after a first call at another length (the benchmarks' old default); and with dynamic=False
after the same other call (what the benchmarks use now).

    python benchmarks/check_flex_dynamic.py --seqlen 16384 --headdim 128 --out flex_dynamic.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import time_ms, write_results  # noqa: E402


def _inputs(n, d, heads):
    shape = (1, heads, n, d)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


def _time_flex(fn, n, d, heads):
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda")
    q, k, v = _inputs(n, d, heads)
    grad = torch.randn_like(q)

    def fwdbwd():
        fn(q, k, v, block_mask=mask).backward(grad)

    def fwd():
        with torch.no_grad():
            fn(q, k, v, block_mask=mask)

    fwdbwd()  # compile outside the timed region
    return {"fwd_ms": time_ms(fwd), "fwdbwd_ms": time_ms(fwdbwd)}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--first-seqlen", type=int, default=4096, help="the other length called first")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("check_flex_dynamic needs a CUDA device")
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    heads = 2048 // args.headdim
    base = dict(
        seqlen=args.seqlen, headdim=args.headdim, nheads=heads, batch=1, causal=True, dtype="bfloat16"
    )
    rows = []
    for how in ("alone", "after_other_length", "after_other_length_dynamic_false"):
        torch._dynamo.reset()
        fn = torch.compile(flex_attention, dynamic=False if how.endswith("dynamic_false") else None)
        if how != "alone":
            _time_flex(fn, args.first_seqlen, args.headdim, heads)
        row = dict(base, compiled=how, **_time_flex(fn, args.seqlen, args.headdim, heads))
        print(row, flush=True)
        rows.append(row)
    write_results(args.out, rows, dict(first_seqlen=args.first_seqlen))


if __name__ == "__main__":
    main()
