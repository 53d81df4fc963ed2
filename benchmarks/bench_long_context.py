"""Long-context training: step time and peak memory of GPT-2 small at 64k-1M+ tokens of context, and
the longest context each GPU count trains, with the sequence split over the GPUs (sequence parallelism).

Every run is the real trainer step (forward, backward, AdamW) of GPT-2 small with rotary positions,
activation checkpointing per block, the chunked loss and the Triton kernels, one sequence per step,
`parallel.sp` = the GPU count (ring attention, zigzag). Contexts are tried in ascending order per GPU
count; the first that fails (out of memory, or --timeout) ends that count's search.

    python benchmarks/bench_long_context.py --gpus 1 2 4                       # 64k ... 1M tokens
    python benchmarks/bench_long_context.py --device cpu --model gpt_tiny --contexts 256 512 --gpus 1 2  # smoke

Writes benchmarks/results/long_context_<gpu>.json (and .md) unless --out names another path.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_scaling import _run  # noqa: E402
from benchmarks.common import gpu_slug, markdown_table, write_results  # noqa: E402

CONTEXTS = [65536, 131072, 262144, 524288, 1048576, 2097152]


def run_args(a, context: int, gpus: int) -> argparse.Namespace:
    """bench_scaling's worker options for one (context, GPU count) run."""
    overrides = [
        f"parallel.sp={gpus}",
        f"parallel.sp_mode={a.sp_mode}",
        "model.pos_embedding=rotary",
        f"model.loss_chunk={min(a.loss_chunk, context)}",
        "data.max_documents=null",  # the whole offline corpus, so even 2M-token windows exist
        "trainer.eval_interval=0",
        *a.override,  # last, so they win
    ]
    return argparse.Namespace(
        strategy="ddp" if gpus > 1 else "none", model=a.model, seq_len=context, batch_size=1,
        device=a.device, attention=a.attention, zero_stage=2, steps=a.steps, warmup=a.warmup,
        run_root=a.run_root, activation_checkpointing=True, compile=False, timeout=a.timeout,
        override=overrides, profile=None, phases=False,
    )  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument(
        "--contexts", type=int, nargs="+", default=CONTEXTS, help="tokens, tried in ascending order"
    )
    p.add_argument("--model", default="gpt2_small")
    p.add_argument("--sp-mode", default="ring", choices=["ring", "ulysses"])
    p.add_argument(
        "--attention", default=None, help="model.attention (default: triton on cuda, reference on cpu)"
    )
    p.add_argument("--loss-chunk", type=int, default=8192)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600, help="seconds per launched run")
    p.add_argument("--run-root", default=os.path.join(tempfile.gettempdir(), "flashtrain-bench-long"))
    p.add_argument("--out", default=None)
    p.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    a = p.parse_args(argv)
    a.attention = a.attention or ("triton" if a.device == "cuda" else "reference")

    out = a.out or os.path.join(ROOT, "benchmarks", "results", f"long_context_{gpu_slug()}.json")

    def extra(longest: dict) -> dict:
        return dict(benchmark="bench_long_context", model=a.model, sp_mode=a.sp_mode, attention=a.attention,
                    activation_checkpointing=True, loss_chunk=a.loss_chunk, steps=a.steps, warmup=a.warmup,
                    longest_context=longest)  # fmt: skip

    rows, longest = [], {}
    for gpus in sorted(set(a.gpus)):
        for context in sorted(set(a.contexts)):
            if context % (2 * gpus):
                continue  # zigzag needs 2 * gpus chunks
            row = {**_run(run_args(a, context, gpus), "ddp" if gpus > 1 else "none", gpus, a.model),
                   "context": context, "sp": gpus}  # fmt: skip
            rows.append(row)
            if row.get("status") == "ok":
                longest[gpus] = context
            write_results(out, rows, extra(longest))  # after every run: a killed search keeps its rows
            if row.get("status") != "ok":
                break
    table = markdown_table(rows, ["gpus", "context", "status", "step_ms", "tokens_per_s", "max_mem_gib"],
                           floatfmt="{:.4g}")  # fmt: skip
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(table + "\n\nlongest context trained, per GPU count: " + str(longest) + "\n")
    print(table)
    print(f"longest context trained, per GPU count: {longest}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
