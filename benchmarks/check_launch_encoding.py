"""Host time of eager attention calls with the compiled launches' TMA descriptors encoded once
(`kernels._launch`, C launcher) against Triton's launcher encoding them on every launch (`run` path),
the two alternating in one process (GPU only).

Host time varies by a third between processes on the same machine (results/s35/call1: Flex's n4k
fwd+bwd took 0.56 to 1.05 ms), so both ways run in the same process, in alternating batches of calls,
and each reports the median over the batches. Per case, (1, seqlen, 16, headdim) bf16:

- `fwdbwd_ms`: one eager fwd+bwd, calls issued back to back (the host's pace; the GPU needs less);
- `fwd_ms`: the forward alone under no_grad.

    python benchmarks/check_launch_encoding.py --out launch_encoding.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_host_overhead import alternating_host_ms  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from kernels import _launch, block_sparse_attention, flash_attention  # noqa: E402
from kernels.layouts import butterfly_layout  # noqa: E402

WAYS = {"encoded_once": True, "run_path": False}


def case_fns(path: str, seqlen: int, headdim: int):
    q, k, v, do = (torch.randn(1, seqlen, 16, headdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if path.startswith("block_sparse"):
        # (block_sparse_long: lists long enough for d128's one-kernel backward, ~56% at n4k)
        factors, local = (5, 8) if path == "block_sparse_long" else (2, 0)
        layout = butterfly_layout(seqlen, 128, n_factors=factors, local_blocks=local).cuda()
        forward = lambda: block_sparse_attention(q, k, v, layout)  # noqa: E731
    elif path == "dense_window":  # (a sliding window: the portable kernels, forward and backward)
        forward = lambda: flash_attention(q, k, v, causal=True, window=(seqlen // 4, 0))  # noqa: E731
    else:
        forward = lambda: flash_attention(q, k, v, causal=True)  # noqa: E731
    fwdbwd = lambda: torch.autograd.grad(forward(), (q, k, v), do)  # noqa: E731
    fwd = lambda: torch.no_grad()(forward)()  # noqa: E731
    return fwdbwd, fwd


def measure(path: str, seqlen: int, headdim: int, batches: int, calls: int) -> dict:
    fns = dict(zip(("fwdbwd_ms", "fwd_ms"), case_fns(path, seqlen, headdim), strict=True))
    switches = {way: (lambda on=on: setattr(_launch, "ENCODE_ONCE", on)) for way, on in WAYS.items()}
    times = alternating_host_ms(switches, fns, batches, calls)
    _launch.ENCODE_ONCE = True
    row = dict(path=path, seqlen=seqlen, headdim=headdim, nheads=16, batch=1, batches=batches, calls=calls)
    for (way, name), values in times.items():
        row[f"{way}_{name}"] = round(statistics.median(values), 4)
        row[f"{way}_{name}_range"] = [round(min(values), 4), round(max(values), 4)]
    for name in fns:  # run path / encoded once: above 1 where encoding once saves host time
        row[f"{name.removesuffix('_ms')}_ratio"] = round(
            row[f"run_path_{name}"] / row[f"encoded_once_{name}"], 3
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096])
    parser.add_argument("--headdims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for seqlen in args.seqlens:
        for headdim in args.headdims:
            for path in ("block_sparse", "dense"):
                row = measure(path, seqlen, headdim, args.batches, args.calls)
                rows.append(row)
                print(
                    f"{path:12s} n{seqlen} d{headdim}: fwd+bwd {row['encoded_once_fwdbwd_ms']:.3f} ms encoded once, "
                    f"{row['run_path_fwdbwd_ms']:.3f} run path ({row['fwdbwd_ratio']:.3f}x); fwd "
                    f"{row['encoded_once_fwd_ms']:.3f} / {row['run_path_fwd_ms']:.3f} ({row['fwd_ratio']:.3f}x)",
                    flush=True,
                )
    write_results(args.out, rows, extra=dict(dtype="bfloat16"))


if __name__ == "__main__":
    main()
