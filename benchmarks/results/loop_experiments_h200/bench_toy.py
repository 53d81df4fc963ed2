"""Times the toy loops of toy_kernels.py on a GPU and writes one JSON (rows of ms and TFLOP/s).

python bench_toy.py bwd OUT.json        # dk/dv and dq: as they are vs next scores first
python bench_toy.py fwd-exp2 OUT.json   # share of exp2 on the FMA pipe: FRAC 0, 2, 4, 1 (all)
python bench_toy.py fwd-fold OUT.json   # MODE 0 (as ours then), 1 (scale folded), 2 (1 + lazy rescale)
"""

import functools
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy_kernels as tk  # noqa: E402

LOG2E = 1.4426950408889634


def bwd_reference(q, k, v, do, scale):
    """(lse, delta, dq, dk, dv) in fp32, for checking the toy backward at small n."""
    s = q.float() @ k.float().transpose(-1, -2) * scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    delta = ((p @ v.float()) * do.float()).sum(-1)
    ds = p * (do.float() @ v.float().transpose(-1, -2) - delta[..., None])
    return (
        lse,
        delta,
        ds @ k.float() * scale,
        ds.transpose(-1, -2) @ q.float() * scale,
        p.transpose(-1, -2) @ do.float(),
    )


def time_call(call):
    try:
        call()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (an out-of-resources config is a result too)
        return {"error": str(e)[:200]}
    return {"ms": triton.testing.do_bench(call, warmup=50, rep=300)}


def bench_bwd(rows):
    plans = [
        ("dkdv", 64, [(64, 64, 4, 3), (64, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2)]),
        ("dkdv", 128, [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 3)]),
        ("dq", 64, [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (128, 32, 4, 3)]),
        ("dq", 128, [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 8, 2)]),
    ]
    for kind, d, configs in plans:
        for n, bh in ((1024, 16), (8192, 2048 // d * 2)):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(bh, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d**-0.5
            ref = bwd_reference(q, k, v, do, scale) if n <= 2048 else None
            lse = ref[0] if ref else torch.full((bh, n), 10.0, device="cuda")
            delta = ref[1] if ref else torch.zeros(bh, n, device="cuda")
            lse2 = (lse * LOG2E).contiguous()
            for bm, bn, warps, stages in configs:
                for variant in ("base", "swp2"):
                    fn = getattr(tk, f"{kind}_{variant}")
                    grads = (
                        [torch.empty_like(q)] if kind == "dq" else [torch.empty_like(k), torch.empty_like(v)]
                    )
                    grid = (n // (bm if kind == "dq" else bn), bh)

                    call = functools.partial(
                        fn[grid], q, k, v, do, *grads, lse2, delta, n, scale * LOG2E, D=d, BM=bm, BN=bn,
                        num_warps=warps, num_stages=stages,
                    )  # fmt: skip

                    row = {
                        "kernel": f"{kind}_{variant}",
                        "d": d,
                        "n": n,
                        "bh": bh,
                        "config": [bm, bn, warps, stages],
                    }
                    row.update(time_call(call))
                    matmuls = 3 if kind == "dq" else 4
                    if "ms" in row:
                        row["tflops"] = matmuls * 2 * n * n * d * bh / row["ms"] / 1e9
                    if "ms" in row and ref:
                        got = [g.float() for g in grads]
                        want = [ref[2]] if kind == "dq" else [ref[3], ref[4]]
                        got[0] = got[0] * scale  # the toy kernels leave dq and dk unscaled
                        row["rel_err"] = max(
                            ((a - b).abs().max() / b.abs().max()).item()
                            for a, b in zip(got, want, strict=True)
                        )
                    rows.append(row)
                    print(json.dumps(row), flush=True)


def bench_fwd(rows, kernel, knob, values, configs):
    for d in (64, 128):
        for n, bh in ((1024, 4096 // d * 2), (8192, 2048 // d * 2)):
            torch.manual_seed(0)
            q, k, v = (torch.randn(bh, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ref = (
                torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
                if n <= 1024
                else None
            )
            for bm, bn, warps, stages in configs:
                for value in values:
                    out = torch.empty_like(q)

                    call = functools.partial(
                        kernel[(n // bm, bh)], q, k, v, out, n, d**-0.5 * LOG2E, D=d, BM=bm, BN=bn,
                        num_warps=warps, num_stages=stages, **{knob: value},
                    )  # fmt: skip

                    row = {"d": d, "n": n, "bh": bh, "config": [bm, bn, warps, stages], knob.lower(): value}
                    row.update(time_call(call))
                    if "ms" in row:
                        row["tflops"] = 4 * bh * n * n * d / row["ms"] / 1e9
                        row["max_err"] = (out.float() - ref).abs().max().item() if ref is not None else None
                    rows.append(row)
                    print(json.dumps(row), flush=True)


def main():
    what, path = sys.argv[1], sys.argv[2]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}  # fmt: skip
    if what == "bwd":
        bench_bwd(out["rows"])
    elif what == "fwd-exp2":
        configs = [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3), (128, 32, 4, 3)]
        bench_fwd(out["rows"], tk.fwd, "FRAC", (0, 2, 4, 1), configs)
    elif what == "fwd-fold":
        bench_fwd(
            out["rows"], tk.fwd2, "MODE", (0, 1, 2), [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3)]
        )
    else:
        raise SystemExit(f"unknown benchmark {what!r}: bwd, fwd-exp2 or fwd-fold")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
