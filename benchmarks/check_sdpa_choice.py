"""Which kernel PyTorch's SDPA runs when nothing pins it, per attention shape, and how fast.

`auto` (flashtrain/models/attention.py) chooses between our kernel and unpinned SDPA, so what matters
is the backend PyTorch itself picks (`torch._fused_sdp_choice`, the function SDPA dispatches through)
and its speed next to ours. For each shape: the choice, and fwd+bwd times of unpinned SDPA, SDPA
pinned to flash and to cuDNN, and ours (`triton.testing.do_bench` medians, bf16). Needs a CUDA GPU.

    python benchmarks/check_sdpa_choice.py --out sdpa_choice.json
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# (batch, seqlen, nheads, nheads_kv, headdim, causal, dropout_p): GPT-2 small/medium training
# shapes (16k tokens per step), a long-context d128 shape, GQA, and attention dropout.
SHAPES = [
    (16, 1024, 16, 16, 64, True, 0.0),
    (4, 4096, 16, 16, 64, True, 0.0),
    (2, 8192, 16, 16, 64, True, 0.0),
    (1, 16384, 16, 16, 64, True, 0.0),
    (16, 1024, 12, 12, 64, True, 0.0),
    (2, 8192, 12, 12, 64, True, 0.0),
    (1, 16384, 16, 16, 128, True, 0.0),
    (1, 16384, 16, 16, 128, False, 0.0),
    (1, 16384, 32, 8, 128, True, 0.0),
    (2, 8192, 16, 16, 64, True, 0.1),
    (1, 16384, 16, 16, 128, True, 0.1),
    (1, 16384, 8, 8, 256, True, 0.0),
]
NAMES = {int(b.value): name for name, b in SDPBackend.__members__.items()}


def fwd_bwd_ms(fn, q, k, v) -> float | dict:
    from triton.testing import do_bench

    grad = torch.randn_like(q)

    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(grad)

    try:
        step()
    except RuntimeError as e:  # a pinned backend that cannot run this shape
        return {"error": str(e).splitlines()[0][:200]}
    return do_bench(step, warmup=10, rep=50)


def measure_shape(b, n, h, hkv, d, causal, dropout_p) -> dict:
    from flashtrain.models.attention import sdpa_attention
    from kernels import flash_attention

    q, k, v = (
        torch.randn(b, n, heads, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for heads in (h, hkv, hkv)
    )

    def sdpa(q, k, v):  # the model's `sdpa` backend: (B, H, T, D) views of these (B, T, H, D) tensors
        return sdpa_attention(q, k, v, causal=causal, dropout_p=dropout_p)

    def pinned(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return sdpa(q, k, v)

        return fn

    def ours(q, k, v):
        return flash_attention(q, k, v, causal=causal, dropout_p=dropout_p)

    qh, kh, vh = (t.detach().transpose(1, 2) for t in (q, k, v))
    gqa = h != hkv
    choice = torch._fused_sdp_choice(qh, kh, vh, None, dropout_p, causal, scale=None, enable_gqa=gqa)
    flops = 4 * b * h * n * n * d * 3.5 / (2 if causal else 1)
    row = dict(batch=b, seqlen=n, nheads=h, nheads_kv=hkv, headdim=d, causal=causal, dropout_p=dropout_p,
               unpinned_choice=NAMES.get(int(choice), str(choice)))  # fmt: skip
    impls = [("sdpa_default", sdpa), ("sdpa_flash", pinned(SDPBackend.FLASH_ATTENTION)),
             ("sdpa_cudnn", pinned(SDPBackend.CUDNN_ATTENTION)), ("triton", ours)]  # fmt: skip
    for name, fn in impls:
        ms = fwd_bwd_ms(fn, q, k, v)
        row[f"{name}_fwdbwd_ms"] = ms
        if isinstance(ms, float):
            row[f"{name}_fwdbwd_tflops"] = round(flops / ms / 1e9, 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", type=int, nargs="+", help="indices into SHAPES (default: all)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("check_sdpa_choice.py needs a CUDA GPU")
    rows = []
    for shape in [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES:
        rows.append(measure_shape(*shape))
        print(json.dumps(rows[-1]), flush=True)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    result = dict(
        device=torch.cuda.get_device_name(),
        capability=".".join(map(str, torch.cuda.get_device_capability())),
        torch=torch.__version__,
        cudnn=cudnn,
        triton=__import__("triton").__version__,
        date=datetime.date.today().isoformat(),
        sdp_priority_order=[NAMES.get(i, str(i)) for i in torch._C._get_sdp_priority_order()],
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
