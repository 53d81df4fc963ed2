"""Host time of one attention layer's calls in a compiled GPT step, ours against SDPA cuDNN.

GPT-2 small at 1k trains host-bound with our attention (0.76-0.81x cuDNN's tokens/s, README ‡), and the step's
cProfile put our attention's operators among the causes (session 82). A compiled block calls, per layer, our
`flashtrain::flash_attn_fwd` on the packed qkv's views and `flash_attn_bwd_qkvpacked` (cuDNN's row:
`aten::_scaled_dot_product_cudnn_attention` and its backward through autograd). Per call, host ms of:

- `fwd_op`: the forward operator, called directly (both);
- `bwd_autograd`: the backward of one retained graph, `torch.autograd.grad(out, inputs, dout,
  retain_graph=True)` (both: the engine's cost is in each; cuDNN's backward operator takes an attention bias
  that cannot be left out from Python);
- `bwd_op`: our backward operator called directly;
- `fwdbwd_api`: the public eager call and its backward (`flash_attention_qkvpacked`; SDPA on the views under
  the cuDNN backend).

Calls go back to back without a sync, ours and cuDNN's alternating in rounds (host speed drifts within a
process and between processes, results/s56/call1-2). Keep the batch small, so that the GPU never sets the pace
(GPT-2 small's attention at batch 2 x 1k is ~0.04 ms of GPU work a fwd+bwd). Then cProfile of our two
operators (`common.host_profile`), by own and by cumulative time.

    python benchmarks/profile_layer_host.py --batch 2 --seqlen 1024 --nheads 12 --headdim 64 \
        --out benchmarks/results/layer_host_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_host_overhead import per_call_ms  # noqa: E402
from benchmarks.common import host_profile, write_results  # noqa: E402
from kernels import flash_attention_qkvpacked  # noqa: E402
from kernels.reference import split_qkv  # noqa: E402


def layer_calls(batch: int, seqlen: int, nheads: int, headdim: int) -> dict[str, dict]:
    """{impl: {part: fn}}: one causal layer's calls on a packed (batch, seqlen, 3 * nheads, headdim) qkv."""
    qkv = torch.randn(batch, seqlen, 3 * nheads, headdim, device="cuda", dtype=torch.bfloat16)
    q, k, v = split_qkv(qkv, nheads)
    scale = headdim**-0.5
    fwd, bwd = (
        torch.ops.flashtrain.flash_attn_fwd.default,
        torch.ops.flashtrain.flash_attn_bwd_qkvpacked.default,
    )
    fwd_call = lambda: fwd(q, k, v, None, None, None, 0, 0, scale, None, 0, 0.0)  # noqa: E731
    out, lse2, seed = fwd_call()
    dout = torch.randn_like(out)
    leaf = qkv.clone().requires_grad_()
    ours_out = flash_attention_qkvpacked(leaf, causal=True)
    # cuDNN on (batch, heads, seqlen, headdim) views, as SDPA gives them to it
    views = [t.transpose(1, 2) for t in (q, k, v)]
    leaves = [t.detach().requires_grad_() for t in views]
    cudnn_fwd = torch.ops.aten._scaled_dot_product_cudnn_attention.default
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cudnn_out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    if "cudnn" not in str(cudnn_out.grad_fn).lower():
        raise SystemExit(f"SDPA did not run cuDNN here (grad_fn {cudnn_out.grad_fn}): no like-for-like row")
    dout_t = dout.transpose(1, 2)

    def sdpa_cudnn_fwdbwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(*leaves, is_causal=True)
        return torch.autograd.grad(o, leaves, dout_t)

    return {
        "ours": {
            "fwd_op": fwd_call,
            "bwd_autograd": lambda: torch.autograd.grad(ours_out, leaf, dout, retain_graph=True),
            "bwd_op": lambda: bwd(dout, qkv, nheads, out, lse2, None, scale, None, 0, 0.0, seed, False, None),
            "fwdbwd_api": lambda: torch.autograd.grad(
                flash_attention_qkvpacked(leaf, causal=True), leaf, dout
            ),
        },
        "sdpa_cudnn": {
            "fwd_op": lambda: cudnn_fwd(*views, None, True, 0.0, True, False, scale=scale),
            "bwd_autograd": lambda: torch.autograd.grad(cudnn_out, leaves, dout_t, retain_graph=True),
            "fwdbwd_api": sdpa_cudnn_fwdbwd,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--nheads", type=int, default=12)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200, help="calls a timing")
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds of every part each way, the order reversed"
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_layer_host.py times CUDA launches; no CUDA device is visible")
    calls = layer_calls(args.batch, args.seqlen, args.nheads, args.headdim)
    with torch.autograd.set_multithreading_enabled(False):  # (the backward on this thread, as it is profiled)
        for parts in calls.values():
            for fn in parts.values():
                for _ in range(10):  # compile, tune, warm up
                    fn()
        times = {(impl, part): [] for impl, parts in calls.items() for part in parts}
        for r in range(args.rounds):
            for impl in list(calls) if r % 2 == 0 else list(calls)[::-1]:
                for part, fn in calls[impl].items():
                    times[impl, part].append(round(per_call_ms(fn, args.calls, sync_each=False), 4))
        rows = []
        for (impl, part), ms in times.items():
            rows.append(dict(impl=impl, part=part, host_ms=statistics.median(ms), rounds_ms=ms))
            print(
                f"{impl:10s} {part:13s} {statistics.median(ms):.4f} ms  (rounds {min(ms):.4f}-{max(ms):.4f})"
            )
        profiles = {
            part: {
                f"by_{key}": host_profile(calls["ours"][part], 100, args.top, key) for key in ("own", "cum")
            }
            for part in ("fwd_op", "bwd_op")
        }
    for part, prof in profiles.items():
        print(f"profile of our {part}, by cumulative time (ms a call, cProfile-inflated):")
        for entry in prof["by_cum"]:
            print(
                f"  {entry['cum_ms']:8.4f} cum {entry['own_ms']:8.4f} own {entry['calls']:3d}  {entry['function']}"
            )
    shape = dict(batch=args.batch, seqlen=args.seqlen, nheads=args.nheads, headdim=args.headdim, causal=True)
    write_results(
        args.out, rows, extra=dict(shape=shape, dtype="bfloat16", calls=args.calls, profiles=profiles)
    )


if __name__ == "__main__":
    main()
