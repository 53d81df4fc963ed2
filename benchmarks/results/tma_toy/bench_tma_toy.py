"""Times toy_tma.py's loops with pointers and with TMA descriptors on a GPU; one JSON of rows.

python bench_tma_toy.py OUT.json
"""

import functools
import json
import os
import sys
import time

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_tma as tk  # noqa: E402

LOG2E = 1.4426950408889634

PLANS = {  # kernel -> head dim -> (BM, BN, warps, stages)
    "dkdv": {64: [(64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 8, 3)], 128: [(64, 128, 8, 3), (64, 64, 4, 3)]},
    "dq": {64: [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)], 128: [(128, 64, 8, 3), (128, 32, 4, 3)]},
    "fwd": {
        64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3)],
        128: [(128, 128, 8, 3), (128, 64, 8, 3)],
    },
}
FLOPS = {"dkdv": 4, "dq": 3, "fwd": 2}  # matmuls of 2*n*n*d flops per head


def reference(q, k, v, do, scale):
    s = q.float() @ k.float().transpose(-1, -2) * scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    out = p @ v.float()
    delta = (out * do.float()).sum(-1)
    ds = p * (do.float() @ v.float().transpose(-1, -2) - delta[..., None])
    return dict(
        lse=lse,
        delta=delta,
        out=out,
        dq=ds @ k.float(),
        dk=ds.transpose(-1, -2) @ q.float(),
        dv=p.transpose(-1, -2) @ do.float(),
    )  # fmt: skip  (dq, dk unscaled, as the toys leave them)


def main():
    path = sys.argv[1]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}  # fmt: skip
    for d in (64, 128):
        for n, bh in ((1024, 256), (8192, 2048 // d * 2)):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(bh, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d**-0.5
            ref = reference(q, k, v, do, scale) if n <= 1024 else None
            lse2 = (ref["lse"] * LOG2E).contiguous() if ref else torch.full((bh, n), 10.0, device="cuda")
            delta = ref["delta"].contiguous() if ref else torch.zeros(bh, n, device="cuda")
            flat = {name: t.view(bh * n, d) for name, t in dict(q=q, k=k, v=v, do=do).items()}
            for kind, plans in PLANS.items():
                for bm, bn, warps, stages in plans[d]:
                    for use_desc in (False, True):
                        rows_per_load = bm if kind == "dkdv" else bn
                        descs = {
                            name: TensorDescriptor.from_tensor(t, [rows_per_load, d])
                            for name, t in flat.items()
                        }
                        if kind == "dkdv":
                            grads = [torch.empty_like(k), torch.empty_like(v)]
                            args = (q, k, v, do, *grads, lse2, delta, descs["q"], descs["do"])
                            grid = (n // bn, bh)
                        elif kind == "dq":
                            grads = [torch.empty_like(q)]
                            args = (q, k, v, do, *grads, lse2, delta, descs["k"], descs["v"])
                            grid = (n // bm, bh)
                        else:
                            grads = [torch.empty_like(q)]
                            args = (q, k, v, *grads, descs["k"], descs["v"])
                            grid = (n // bm, bh)
                        call = functools.partial(
                            getattr(tk, kind)[grid], *args, n, scale * LOG2E, D=d, BM=bm, BN=bn, DESC=use_desc,
                            num_warps=warps, num_stages=stages,
                        )  # fmt: skip
                        row = dict(
                            kernel=kind, desc=use_desc, d=d, n=n, bh=bh, config=[bm, bn, warps, stages]
                        )
                        try:
                            call()
                            torch.cuda.synchronize()
                            row["ms"] = triton.testing.do_bench(call, warmup=50, rep=300)
                            row["tflops"] = FLOPS[kind] * 2 * n * n * d * bh / row["ms"] / 1e9
                        except Exception as e:  # noqa: BLE001  (a config that does not build is a result too)
                            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        if "ms" in row and ref:
                            want = {"dkdv": ["dk", "dv"], "dq": ["dq"], "fwd": ["out"]}[kind]
                            row["rel_err"] = max(
                                ((g.float() - ref[w]).abs().max() / ref[w].abs().max()).item()
                                for g, w in zip(grads, want, strict=True)
                            )
                        out["rows"].append(row)
                        print(json.dumps(row), flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
