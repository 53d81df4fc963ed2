"""The Gluon forward's persistent variant (`kernels._flash_fwd_hopper._attn_fwd_hopper_persistent`)
against the one-program-per-row-tile kernel on block-sparse calls: forward milliseconds of ours with
either config (eager, and replayed from a CUDA graph: device time) and of FlexAttention on the same
block mask, for butterfly layouts from ~1% to ~50% density (`bench_block_sparse.butterfly_points`).

    python benchmarks/check_persistent_fwd.py --seqlen 16384 --headdim 128 --out persistent_bs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_block_sparse import butterfly_points, flex_block_mask, flex_fn  # noqa: E402
from benchmarks.common import graph_time_ms, time_ms, write_results  # noqa: E402
from kernels import _block_sparse_hopper  # noqa: E402
from kernels.block_sparse import block_sparse_attention  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    n, d, h = args.seqlen, args.headdim, args.nheads
    q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    configs = _block_sparse_hopper.CONFIGS[d]
    variants = {
        name: (dataclasses.replace(configs[0], persistent=persistent), *configs[1:])
        for name, persistent in (("rowtile", False), ("persistent", True))
    }
    rows = []
    for cfg, layout in butterfly_points(n):
        layout = layout.cuda()
        row = dict(seqlen=n, headdim=d, nheads=h, density=layout.density, **cfg)
        outs = {}
        for name, cfgs in variants.items():
            _block_sparse_hopper.CONFIGS[d] = cfgs

            def fwd(layout=layout):
                with torch.no_grad():
                    return block_sparse_attention(q, k, v, layout)

            outs[name] = fwd()
            row[f"{name}_ms"] = time_ms(fwd, warmup_ms=10, rep_ms=50)
            row[f"{name}_graph_ms"] = graph_time_ms(fwd)
        _block_sparse_hopper.CONFIGS[d] = configs
        row["max_diff"] = float((outs["rowtile"].float() - outs["persistent"].float()).abs().max())
        mask, flex = flex_block_mask(layout, n), flex_fn()

        def flex_fwd(mask=mask, flex=flex):
            return flex(qt, kt, vt, block_mask=mask)

        row["flex_ms"] = time_ms(flex_fwd, warmup_ms=10, rep_ms=50)
        row["flex_graph_ms"] = graph_time_ms(flex_fwd)
        rows.append(row)
        print(
            f"n{n} d{d} density {layout.density:.4f}: row-tile {row['rowtile_ms']:.3f} ({row['rowtile_graph_ms']:.3f}) "
            f"persistent {row['persistent_ms']:.3f} ({row['persistent_graph_ms']:.3f}) flex {row['flex_ms']:.3f} "
            f"({row['flex_graph_ms']:.3f}) ms; max diff {row['max_diff']:.2e}",
            flush=True,
        )
        write_results(args.out, rows)


if __name__ == "__main__":
    main()
