"""Whether one attention fwd+bwd (ours dense, ours block-sparse, SDPA) can be captured in a CUDA graph
after what a user's code may have run before, and whether the replay gives eager's gradients.

Session 40's A/B (`ab_short_dense.py`) saw our fwd+bwd fail to capture ("operation would make the legacy
stream depend on a capturing blocking stream") where SDPA's did not. That harness kept the outputs of an
eager default-stream call, with their autograd graph, alive across the capture: a leaf's gradient
accumulator made by that call keeps the default stream as its stream (pytorch/pytorch#164302, #180090).
Each case here runs in a fresh process (a failed capture leaves its memory pool behind), one pattern:

- `side`: the usual recipe (`benchmarks.common.capture_graph`): warm-up on a side stream, capture;
- `default_kept`: first one eager call on the default stream whose outputs are kept (graph and all);
- `default_dropped`: first one eager call on the default stream whose outputs are dropped;
- `profiled`: first `device_profile` (torch.profiler, default stream), as the A/B did.

Then the side-stream warm-up and capture; where it captures: new inputs copied into the captured ones,
one replay, and its gradients against an eager call on the same inputs (max abs difference relative to
the largest eager value), and the replay's median time.

    python benchmarks/check_graph_capture.py --out benchmarks/results/graph_capture.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import capture_graph, device_profile, error_note, time_ms, write_results  # noqa: E402

PATTERNS = ("side", "default_kept", "default_dropped", "profiled")
# impl -> (batch, seqlen, nheads, headdim, causal); SDPA's take (batch, nheads, seqlen, headdim), ours
# (batch, seqlen, nheads, headdim)
SHAPES = {
    "triton_gluon": (32, 512, 16, 128, True),  # the A/B's first point: the Gluon kernels
    "triton_portable": (32, 512, 16, 128, True),  # the same call on the portable kernels (ENV)
    "triton_portable_d80": (4, 200, 8, 80, False),  # a head dim only the portable kernels take
    "block_sparse": (1, 4096, 16, 128, False),  # butterfly, all factors, 128-blocks
    "sdpa_cudnn": (32, 512, 16, 128, True),
    "sdpa_flash": (32, 512, 16, 128, True),
}

# the environment of an impl's process: triton_portable turns the Gluon kernels off
ENV = {"triton_portable": {f"FLASHTRAIN_HOPPER_{k}": "0" for k in ("FWD", "DQ", "DKDV")}}


def make_fwdbwd(impl: str):
    """(attend() -> out, fwdbwd() -> grads of the leaves, the leaves) on fresh random bf16 inputs."""
    batch, seqlen, nheads, headdim, causal = SHAPES[impl]
    sdpa = impl.startswith("sdpa")
    shape = (batch, nheads, seqlen, headdim) if sdpa else (batch, seqlen, nheads, headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if impl == "block_sparse":
        from kernels.block_sparse import block_sparse_attention
        from kernels.layouts import butterfly_layout

        layout = butterfly_layout(seqlen, 128).to("cuda")

        def attend():
            return block_sparse_attention(q, k, v, layout)
    else:
        from benchmarks.bench_attention import make_impl

        dense = make_impl(impl if sdpa else "triton")

        def attend():
            return dense(q, k, v, causal)

    def fwdbwd():
        return torch.autograd.grad(attend(), (q, k, v), dout)

    return attend, fwdbwd, (q, k, v)


def run_case(impl: str, pattern: str) -> dict:
    torch.manual_seed(0)
    attend, fwdbwd, leaves = make_fwdbwd(impl)
    row = dict(impl=impl, pattern=pattern, shape=SHAPES[impl])
    kept = None
    if pattern == "default_kept":  # as the A/B kept out.float(): its grad_fn holds the whole graph
        kept = (attend().float(), fwdbwd())
    elif pattern == "default_dropped":
        fwdbwd()
    elif pattern == "profiled":
        device_profile(fwdbwd, steps=3)
    torch.cuda.synchronize()
    try:
        graph, static_grads = capture_graph(fwdbwd)
    except Exception as exc:  # noqa: BLE001  (the finding: which case cannot be captured)
        row.update(captured=False, error=error_note(exc))
        return row
    with torch.no_grad():
        for leaf in leaves:
            leaf.copy_(torch.randn_like(leaf))
    graph.replay()
    eager = fwdbwd()
    scale = max(g.abs().max().item() for g in eager)
    row.update(
        captured=True,
        replay_max_rel_diff=max(
            (a.float() - b.float()).abs().max().item() / scale
            for a, b in zip(static_grads, eager, strict=True)
        ),
        replay_ms=time_ms(graph.replay, 10, 50),
        eager_ms=time_ms(fwdbwd, 10, 50),
    )
    del kept  # (alive until here: through the capture)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help="IMPL:PATTERN: run one case in this process, print its row as JSON")
    parser.add_argument("--impls", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per case (its own process)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("check_graph_capture needs a CUDA device")
    if args.case:
        impl, _, pattern = args.case.partition(":")
        print("ROW " + json.dumps(run_case(impl, pattern)), flush=True)
        return
    if not args.out:
        parser.error("--out is required unless --case is given")
    rows = []
    for impl in args.impls:
        for pattern in args.patterns:
            rows.append(case_in_process(impl, pattern, args.timeout))
            write_results(args.out, rows)  # case by case: a time-out keeps what was found
            r = rows[-1]
            print(
                f"{impl} {pattern}: "
                + (
                    f"captured, replay {r['replay_ms']:.3f} ms (eager {r['eager_ms']:.3f}), "
                    f"grads within {r['replay_max_rel_diff']:.1e}"
                    if r.get("captured")
                    else f"NOT captured: {r.get('error')}"
                ),
                flush=True,
            )


def case_in_process(impl: str, pattern: str, timeout: float) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--case", f"{impl}:{pattern}"]
    try:
        env = {**os.environ, **ENV.get(impl, {})}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(impl=impl, pattern=pattern, captured=None, error=f"no answer in {timeout:.0f} s")
    rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if rows:
        return json.loads(rows[-1])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return dict(impl=impl, pattern=pattern, captured=None, error=f"rc {done.returncode}: " + " | ".join(tail))


if __name__ == "__main__":
    main()
