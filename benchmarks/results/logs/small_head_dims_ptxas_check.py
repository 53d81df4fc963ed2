import sys, torch

sys.path.insert(0, sys.argv[1])
import kernels

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
            ).transpose(1, 2)
            print(
                f"d{d} q{nq} k{nk}: ok, max err vs fp32 SDPA {(out.float() - ref).abs().max().item():.4f}",
                flush=True,
            )
        except Exception as e:
            print(f"d{d} q{nq} k{nk}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
