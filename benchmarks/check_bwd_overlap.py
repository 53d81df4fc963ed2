"""Would the backward gain from running its dq kernel beside the dk/dv kernel (on a second stream)?

The two kernels read the same inputs and write different gradients. Launched one after the other, each
ends with a partial last wave of thread blocks (about half a wave of ~15 at n = 8k) while SMs idle;
FlexAttention launches both roles in one grid, which fills those tails. This measures the same effect
without touching the kernels: the launcher's dq launch is moved to a side stream that waits only for
what dk/dv waits for, and the main stream waits for it before the gradients are used. Tuning runs
first without the side stream (the autotuners time one kernel at a time).

    python benchmarks/check_bwd_overlap.py --shape 2,8192,16,128 --shape 2,8192,16,64,causal --out o.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import time_ms, write_results  # noqa: E402
from benchmarks.sweep_tiles import parse_shape  # noqa: E402
from kernels import _flash_bwd, flash_attention  # noqa: E402


class _SideStreamDq:
    """Stands in for the two tuned kernels in `_flash_bwd`: dk/dv records an event on the main stream
    before its launch; dq waits for that event on a side stream, and the main stream for dq."""

    def __init__(self):
        self.dkdv, self.dq = _flash_bwd._bwd_dkdv_tuned, _flash_bwd._bwd_dq_tuned
        self.side = torch.cuda.Stream()
        self.ready = None

    def install(self, on: bool) -> None:
        _flash_bwd._bwd_dkdv_tuned = _Launcher(self, "dkdv") if on else self.dkdv
        _flash_bwd._bwd_dq_tuned = _Launcher(self, "dq") if on else self.dq


class _Launcher:
    def __init__(self, owner: _SideStreamDq, role: str):
        self.owner, self.role = owner, role

    def __getitem__(self, grid):
        owner = self.owner

        def launch(*args, **kwargs):
            main = torch.cuda.current_stream()
            if self.role == "dkdv":
                owner.ready = torch.cuda.Event()
                owner.ready.record(main)
                return owner.dkdv[grid](*args, **kwargs)
            owner.side.wait_event(owner.ready)
            with torch.cuda.stream(owner.side):
                ret = owner.dq[grid](*args, **kwargs)
            done = torch.cuda.Event()
            done.record(owner.side)
            main.wait_event(done)
            return ret

        return launch


def measure(text: str, patch: _SideStreamDq, rounds: int) -> dict:
    """Median fwd+bwd ms of one shape with dq after dk/dv and beside it, alternated `rounds` times."""
    s = parse_shape(text)
    shape = (s["batch"], s["seqlen"], s["nheads"], s["headdim"])
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def fwdbwd():
        out = flash_attention(q, k, v, causal=s["causal"])
        return torch.autograd.grad(out, (q, k, v), do)

    patch.install(False)
    reference = fwdbwd()  # tunes every kernel for this shape, one at a time
    patch.install(True)
    overlapped = fwdbwd()
    same = all(torch.equal(a, b) for a, b in zip(reference, overlapped, strict=True))
    times = {"sequential": [], "overlapped": []}
    for _ in range(rounds):
        for mode in times:
            patch.install(mode == "overlapped")
            times[mode].append(time_ms(fwdbwd))
    patch.install(False)
    row = {**s, "grads_identical": same, **{f"{m}_ms": sorted(t)[len(t) // 2] for m, t in times.items()}}
    row["speedup"] = row["sequential_ms"] / row["overlapped_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape", action="append", required=True, help="batch,seqlen,nheads,headdim[,causal]"
    )
    parser.add_argument("--rounds", type=int, default=3, help="A/B alternations per shape")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    patch = _SideStreamDq()
    rows = []
    for text in args.shape:
        row = measure(text, patch, args.rounds)
        rows.append(row)
        print(f"{text}: sequential {row['sequential_ms']:.3f} ms, overlapped {row['overlapped_ms']:.3f} ms, "
              f"x{row['speedup']:.3f}, identical grads {row['grads_identical']}")  # fmt: skip
        write_results(args.out, rows, {"rounds": args.rounds})


if __name__ == "__main__":
    main()
