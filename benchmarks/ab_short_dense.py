"""Dense attention below 1k queries: the Gluon Hopper kernels against the portable ones (until session 40
their `faster_here` rules started at 1k queries because nothing shorter had been timed).

Variants, alternating in one process (GPU only), each at every point; from 1k queries all three follow
the kernels' own rules:
- `portable`: below 1k queries every kernel is the portable one (the rules before session 40);
- `gluon_fwd`: the Gluon forward at every length, the portable backward below 1k;
- `gluon_all`: the Gluon forward, dq (head dims 128 and 256) and dK/dV kernels at every length.
SDPA's cuDNN and flash kernels are timed beside them as anchors. Shapes as bench_attention's (batch x
seqlen = 16k tokens, nheads x headdim = 2048, bf16). Each point: fwd and fwd+bwd as the kernels' summed
device time (torch.profiler), replayed from a CUDA graph, and eager; each setting timed twice
round-robin and the lower kept (a call that cannot be captured in a graph is recorded as such). `gluon_all`'s
out and gradients are checked against `portable`'s (max abs difference, relative to the largest value).

    python benchmarks/ab_short_dense.py --seqlens 256 512 --out ab.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import issue_shape, make_impl  # noqa: E402
from benchmarks.common import (  # noqa: E402
    device_profile,
    error_note,
    graph_time_ms,
    markdown_table,
    time_ms,
    write_results,
)
from kernels import _flash_dkdv_hopper, _flash_dq_hopper, _flash_fwd_hopper  # noqa: E402

RULES = {  # the rules as imported: (forward's `usable` default, dq's and dK/dV's `faster_here`)
    "fwd": _flash_fwd_hopper.usable.__kwdefaults__["rule"],
    "dq": _flash_dq_hopper.faster_here,
    "dkdv": _flash_dkdv_hopper.faster_here,
}


def _any_length(rule):
    """rule's answer at 1k queries, for every length (the head-dim and causal parts of the rule stay)."""
    return lambda headdim, seqlen_q, causal: rule(headdim, max(seqlen_q, 1024), causal)


def _from_1k(rule):
    """rule from 1k queries, the portable kernel below."""
    return lambda headdim, seqlen_q, causal: seqlen_q >= 1024 and rule(headdim, seqlen_q, causal)


def install_rules(rules: dict) -> None:
    _flash_fwd_hopper.usable.__kwdefaults__["rule"] = rules["fwd"]
    _flash_dq_hopper.faster_here = rules["dq"]
    _flash_dkdv_hopper.faster_here = rules["dkdv"]


def set_variant(name: str) -> None:
    gluon = {"portable": (), "gluon_fwd": ("fwd",), "gluon_all": ("fwd", "dq", "dkdv")}[name]
    install_rules(
        {kernel: (_any_length if kernel in gluon else _from_1k)(rule) for kernel, rule in RULES.items()}
    )


VARIANTS = ["portable", "gluon_fwd", "gluon_all"]
ANCHORS = ["sdpa_cudnn", "sdpa_flash"]


def point(headdim: int, seqlen: int, causal: bool) -> dict:
    batch, nheads = issue_shape(seqlen, headdim)
    ours_shape, sdpa_shape = (batch, seqlen, nheads, headdim), (batch, nheads, seqlen, headdim)
    fns = {}
    for name in VARIANTS + ANCHORS:
        shape = ours_shape if name in VARIANTS else sdpa_shape
        impl = make_impl("triton" if name in VARIANTS else name)
        torch.manual_seed(0)  # the same inputs for every variant (the anchors' in their own layout)
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

        def fwd(impl=impl, q=q, k=k, v=v):
            with torch.no_grad():
                return impl(q, k, v, causal)

        def fwdbwd(impl=impl, q=q, k=k, v=v, do=do):
            out = impl(q, k, v, causal)
            return (out, *torch.autograd.grad(out, (q, k, v), do))

        fns[name] = (fwd, fwdbwd)

    row = dict(headdim=headdim, seqlen=seqlen, causal=causal, batch=batch, nheads=nheads)
    results = {}
    for name in VARIANTS:  # first calls (autotuning, compiles) outside the timings; the check
        set_variant(name)
        # detached: out.float() would keep this call's autograd graph alive through the CUDA-graph
        # captures below, and with it the leaves' gradient accumulators on the default stream, which
        # makes every capture fail (check_graph_capture.py)
        results[name] = [t.detach().float() for t in fns[name][1]()]
    scale = max(t.abs().max().item() for t in results["portable"])
    row["gluon_all_max_rel_diff"] = max(
        (a - b).abs().max().item() / scale
        for a, b in zip(results["gluon_all"], results["portable"], strict=True)
    )
    times = {}
    for _ in range(2):
        for name in VARIANTS + ANCHORS:
            if name in VARIANTS:  # (the anchors run SDPA whatever the rules)
                set_variant(name)
            fwd, fwdbwd = fns[name]  # (device_profile's first, unprofiled call warms the new route up)
            got = (*device_times(name, fwd, fwdbwd, row), time_ms(fwd), time_ms(fwdbwd))
            prev = times.get(name, got)
            times[name] = tuple(min(a, b) for a, b in zip(prev, got, strict=True))
    install_rules(RULES)
    for name, got in times.items():
        row.update({f"{name}_{kind}_ms": t for kind, t in zip(KINDS, got, strict=True)})
    for name in VARIANTS[1:] + ANCHORS:  # > 1: faster than the portable kernels
        for kind in KINDS:
            row[f"portable_over_{name}_{kind}"] = row[f"portable_{kind}_ms"] / row[f"{name}_{kind}_ms"]
    return row


# device: the kernels' summed time per call under torch.profiler (every call, also where graph capture
# fails); graph: replayed from a CUDA graph (inf where capture failed); eager: with the host's time
KINDS = ("fwd_device", "fwdbwd_device", "fwd_graph", "fwdbwd_graph", "fwd", "fwdbwd")


def device_times(name: str, fwd, fwdbwd, row: dict) -> tuple[float, ...]:
    """(fwd, fwd+bwd kernel ms from the profiler, fwd, fwd+bwd ms from CUDA graphs); a failed capture
    is recorded in row[f"{name}_{kind}_graph_error"] (kind fwd or fwdbwd) and times as inf."""
    profiled = tuple(device_profile(fn, steps=20)["kernels_ms"] for fn in (fwd, fwdbwd))
    graphs = []
    for kind, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
        try:
            graphs.append(graph_time_ms(fn))
        except Exception as exc:  # noqa: BLE001  (record which call cannot be captured, keep timing)
            row[f"{name}_{kind}_graph_error"] = error_note(exc)
            torch.cuda.synchronize()
            graphs.append(math.inf)
    return (*profiled, *graphs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--headdims", type=int, nargs="+", default=[128, 64, 256])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ab_short_dense needs a CUDA device")
    rows = []
    for headdim in args.headdims:
        for causal in (True, False):
            for seqlen in args.seqlens:
                rows.append(point(headdim, seqlen, causal))
                write_results(args.out, rows)  # row by row: a time-out keeps what was measured
                r = rows[-1]
                print(
                    f"d{headdim} {'causal' if causal else 'full'} n{seqlen}: fwd+bwd kernel ms "
                    + " / ".join(f"{n} {r[f'{n}_fwdbwd_device_ms']:.3f}" for n in VARIANTS + ANCHORS)
                    + f"; eager gluon_all {r['gluon_all_fwdbwd_ms']:.3f} vs portable {r['portable_fwdbwd_ms']:.3f}"
                    + f"; diff {r['gluon_all_max_rel_diff']:.1e}"
                    + "".join(f"; {k}: {v[:120]}" for k, v in r.items() if k.endswith("graph_error")),
                    flush=True,
                )
    cols = ["headdim", "causal", "seqlen"] + [
        f"portable_over_{n}_{k}"
        for n in ("gluon_fwd", "gluon_all")
        for k in ("fwd_device", "fwdbwd_device", "fwdbwd")
    ]
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(markdown_table(rows, cols, floatfmt="{:.2f}") + "\n")


if __name__ == "__main__":
    main()
