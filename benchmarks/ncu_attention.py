"""One attention fwd+bwd for Nsight Compute to profile: what binds each kernel (tensor pipe, shared
memory, issue, stalls), ours against SDPA cuDNN's. The profiled call is the one between
cudaProfilerStart and Stop, after warm-up calls (compiles, autotuning), so run ncu with
--profile-from-start off:

    ncu --profile-from-start off --set full -o bwd python benchmarks/ncu_attention.py --impl triton \\
        --seqlen 16384 --headdim 128 --causal full

Block-sparse impls (`bs:F:L` ours, `flexbs:F:L` FlexAttention: a butterfly layout on 128-blocks, as in
profile_attention.py) run the block-sparse benchmark's shape, batch 1 and 16 heads.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import issue_shape, native_shape  # noqa: E402
from benchmarks.profile_attention import attention_fn  # noqa: E402

BLOCK_SPARSE_HEADS = 16  # bench_block_sparse.py's shape: batch 1, 16 heads


def batch_and_heads(impl: str, seqlen: int, headdim: int) -> tuple[int, int]:
    """(batch, nheads) of the profiled call: the attention benchmark's (16k tokens, 2048 wide) for dense
    impls, the block-sparse benchmark's for `bs:`/`flexbs:` ones."""
    if ":" in impl:
        return 1, BLOCK_SPARSE_HEADS
    return issue_shape(seqlen, headdim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="triton", help="a bench_attention impl (triton, sdpa_cudnn, ...)")
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--causal", choices=["causal", "full"], default="full")
    parser.add_argument(
        "--causal-convoy-upto", type=int, default=None,
        help="the causal convoy's longest call (_flash_bwd_fused_hopper.ORDERED_CAUSAL_CONVOY_MAX_SEQLEN) for this run",
    )  # fmt: skip
    args = parser.parse_args()
    if args.causal_convoy_upto is not None:
        from kernels import _flash_bwd_fused_hopper

        _flash_bwd_fused_hopper.ORDERED_CAUSAL_CONVOY_MAX_SEQLEN = args.causal_convoy_upto
    if not torch.cuda.is_available():
        raise SystemExit("ncu_attention needs a CUDA device")
    (batch, nheads), causal = batch_and_heads(args.impl, args.seqlen, args.headdim), args.causal == "causal"
    shape = native_shape(args.impl, batch, args.seqlen, nheads, args.headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    attend = attention_fn(args.impl, args.seqlen, causal)

    def fwdbwd():
        return torch.autograd.grad(attend(q, k, v, causal), (q, k, v), do)

    for _ in range(3):
        fwdbwd()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fwdbwd()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
