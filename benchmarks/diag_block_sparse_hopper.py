"""Per-output errors of the Hopper block-sparse path against the float64 reference (a diagnosis aid:
which of out, lse, dq, dk, dv is off, for which shapes), with the reference-in-dtype error beside."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels import block_sparse_attention  # noqa: E402
from kernels.layouts import butterfly_layout, random_layout  # noqa: E402
from kernels.reference import block_sparse_reference  # noqa: E402


def grads(fn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = fn(q, k, v)
    out.backward(do.to(out.dtype))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def main():
    cases = [
        (1, 1000, 1000, 2, 2, False, torch.bfloat16, "butterfly"),
        (2, 1000, 1000, 2, 2, False, torch.bfloat16, "butterfly"),
        (1, 1000, 1000, 4, 2, False, torch.bfloat16, "butterfly"),
        (1, 1024, 1024, 2, 2, False, torch.bfloat16, "butterfly"),
        (1, 1024, 1024, 2, 2, True, torch.bfloat16, "butterfly"),
        (1, 1024, 1024, 2, 2, False, torch.float16, "butterfly"),
        (1, 1024, 1024, 2, 2, False, torch.bfloat16, "random"),
    ]
    for b, sq, sk, h, hk, causal, dtype, kind in cases:
        torch.manual_seed(0)
        q = torch.randn(b, sq, h, 128, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, sk, hk, 128, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        n = max(sq, sk)
        lay = (
            butterfly_layout(n, 128) if kind == "butterfly" else random_layout(n, 128, 0.3, nheads=h, seed=1)
        ).cuda()

        def ours(q, k, v, lay=lay, causal=causal):
            return block_sparse_attention(q, k, v, lay, causal=causal, return_lse=True)

        def ref(q, k, v, lay=lay, causal=causal):
            return block_sparse_reference(q, k, v, lay.mask, 128, 128, causal=causal, return_lse=True)

        got = grads(ours, q, k, v, do)
        truth = grads(ref, q.double(), k.double(), v.double(), do.double())
        low = grads(ref, q, k, v, do)
        errs = []
        for name, g, t, lo in zip(("out", "lse", "dq", "dk", "dv"), got, truth, low, strict=True):
            fin = torch.isfinite(t)
            e = (g.double() - t)[fin].abs().max().item()
            r = (lo.double() - t)[fin].abs().max().item()
            errs.append(f"{name} {e:.3g}/{r:.3g}")
        print(b, sq, sk, h, hk, causal, dtype, kind, " ".join(errs), flush=True)


if __name__ == "__main__":
    main()
