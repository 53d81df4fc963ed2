"""kernels.flash_attention fwd+bwd at head dims 16 and 32 on a GPU, for the tree given as argv[1]
(the one whose `kernels` to import): prints ok with the error against fp32 SDPA, or the exception."""

import sys

import torch

sys.path.insert(0, sys.argv[1])
import kernels  # noqa: E402 - from the tree named on the command line

torch.manual_seed(0)
for d in (16, 32):
    for nq, nk in ((128, 16), (128, 32), (8, 8), (4096, 4096)):
        q = torch.randn(1, nq, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (
            torch.randn(1, nk, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2)
        )
        try:
            out = kernels.flash_attention(q, k, v)
            out.sum().backward()
            ref = torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2).float() for t in (q, k, v))
            )
            err = (out.float() - ref.transpose(1, 2)).abs().max().item()
            print(f"d{d} q{nq} k{nk}: ok, max err vs fp32 SDPA {err:.4f}", flush=True)
        except Exception as e:  # noqa: BLE001 - the failure is the result
            print(f"d{d} q{nq} k{nk}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
