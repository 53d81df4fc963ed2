"""Generation speed: eager decode steps against one captured CUDA graph replayed per token, and the
prompt's prefill through the training kernel against the decode kernel.

GPT-2 shapes in bf16 with random weights (speed does not depend on the weights): a prompt of `prompt`
tokens, then `new_tokens` greedy tokens. Per configuration, in alternating rounds:

- `eager_step_ms` / `graph_step_ms`: one new token's step (milliseconds a token, over `new_tokens` steps
  timed together with a sync at each end), eagerly or replaying `flashtrain.generate.DecodeStep`'s graph;
  `capture_ms`: building that graph (two warm-up steps and the capture);
- `eager_generate_ms` / `graph_generate_ms`: one whole `generate` call (prefill, capture, sampling);
- `prefill_flash_ms` / `prefill_decode_ms`: the prompt through the model, its attention through
  `flash_attention` or through `flash_decode` (`KVCache` takes the first from PREFILL_FLASH_TOKENS
  tokens; before session 65 it always took the second).

Each row also says whether both ways gave the same tokens, and the peak memory of a generate call each way.
`--decode-ab NAME` adds the steps with one of `ab_decode_launch.VARIANTS`' settings of `kernels.decode`
(`*_NAME`), and their time over the defaults' (`*_NAME_speedup`): e.g. `ordinary` launches its kernels the
ordinary way instead of as programmatic dependent launches (`--pdl-ab`; session 66's rows called that ratio
`*_pdl_speedup`), `min_tiles_4` splits the cache into no fewer than 4 key tiles, as before session 67.

    python benchmarks/bench_generate.py --out benchmarks/results/generate_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashtrain.generate as gen  # noqa: E402
from benchmarks.ab_decode_launch import VARIANTS  # noqa: E402
from benchmarks.common import markdown_table, print_summary, rotated, wall_ms, with_settings, write_results  # noqa: E402
from flashtrain.generate import DecodeStep, generate, new_caches  # noqa: E402
from flashtrain.models.gpt import GPT, GPTConfig  # noqa: E402
from kernels import decode  # noqa: E402

DECODE_AB = {
    name: settings for name, settings in VARIANTS.items() if settings
}  # (ab_decode_launch's, less its base)
MODELS = {  # name -> (n_layer, d_model, n_head)
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-medium-d128": (24, 1024, 8),
}


def prefill_ms(model: GPT, prompt: torch.Tensor, capacity: int, through_flash: bool) -> float:
    """One prefill of the prompt, its attention through `flash_attention` or `flash_decode` whatever the
    prompt's size (`flashtrain.generate.PREFILL_FLASH_TOKENS` set for the call)."""

    def prefill():
        return wall_ms(lambda: model(prompt, caches=new_caches(model, prompt.shape[0], capacity)))

    return with_settings(prefill, gen, PREFILL_FLASH_TOKENS=0 if through_flash else sys.maxsize)()


def steps_ms(model: GPT, prompt: torch.Tensor, new_tokens: int, graph: bool) -> tuple[float, float]:
    """(ms a token over new_tokens steps after the prompt's prefill, ms of the capture or 0)."""
    caches = new_caches(model, prompt.shape[0], prompt.shape[1] + new_tokens)
    logits = model(prompt, caches=caches)
    step = None
    capture = 0.0
    if graph:
        built = []
        capture = wall_ms(lambda: built.append(DecodeStep(model, caches, capture=True)))
        step = built[0]

    def run():
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new_tokens):
            out = step(nxt) if step is not None else model(nxt, caches=caches)
            nxt = out[:, -1].argmax(-1, keepdim=True)

    return wall_ms(run) / new_tokens, capture


def measure(
    name: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    rounds: int,
    prefill_only: bool,
    decode_ab: str | None,
) -> dict:
    n_layer, d_model, n_head = MODELS[name]
    cfg = GPTConfig(n_layer=n_layer, n_head=n_head, d_model=d_model, vocab_size=50304,
                    max_seq_len=prompt_len + new_tokens, attention="triton")  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg).to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device="cuda")
    capacity = prompt_len + new_tokens
    calls = {
        "eager_step": lambda: steps_ms(model, prompt, new_tokens, graph=False),
        "graph_step": lambda: steps_ms(model, prompt, new_tokens, graph=True),
        "eager_generate": lambda: wall_ms(lambda: generate(model, prompt, new_tokens, temperature=0, cuda_graph=False)),
        "graph_generate": lambda: wall_ms(lambda: generate(model, prompt, new_tokens, temperature=0, cuda_graph=True)),
        "prefill_flash": lambda: prefill_ms(model, prompt, capacity, through_flash=True),
        "prefill_decode": lambda: prefill_ms(model, prompt, capacity, through_flash=False),
    }  # fmt: skip
    if prefill_only:
        calls = {key: fn for key, fn in calls.items() if key.startswith("prefill")}
    elif decode_ab:  # the decode steps with other settings of flash_decode's
        for key in ("eager_step", "graph_step"):
            calls[f"{key}_{decode_ab}"] = with_settings(calls[key], decode, **DECODE_AB[decode_ab])
    with torch.no_grad():
        for fn in calls.values():  # compile and warm everything once
            fn()
        times = {key: [] for key in calls}
        captures = []
        for r in range(rounds):
            for key in rotated(list(calls), r):
                got = calls[key]()
                if "_step" in key:
                    got, capture = got
                    if key == "graph_step":
                        captures.append(capture)
                times[key].append(got)
    row = dict(model=name, n_layer=n_layer, d_model=d_model, nheads=n_head, headdim=d_model // n_head,
               batch=batch, prompt=prompt_len, new_tokens=new_tokens, dtype="bfloat16")  # fmt: skip
    for key, vals in times.items():
        row[key] = statistics.median(vals)
        row[f"{key}_ms"] = vals  # every round, for the spread
    row["prefill_speedup"] = row["prefill_decode"] / row["prefill_flash"]
    if prefill_only:
        return row
    with torch.no_grad():
        row["same_tokens"] = torch.equal(
            generate(model, prompt, new_tokens, temperature=0, cuda_graph=False),
            generate(model, prompt, new_tokens, temperature=0, cuda_graph=True),
        )
        for graph in (False, True):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            generate(model, prompt, new_tokens, temperature=0, cuda_graph=graph)
            torch.cuda.synchronize()
            row["graph_peak_mib" if graph else "eager_peak_mib"] = (
                torch.cuda.max_memory_allocated() - base
            ) / 2**20
    row["capture"] = statistics.median(captures)
    row["capture_ms"] = captures
    row["step_speedup"] = row["eager_step"] / row["graph_step"]
    if decode_ab:
        for key in ("eager_step", "graph_step"):
            row[f"{key}_{decode_ab}_speedup"] = row[f"{key}_{decode_ab}"] / row[key]
    row["generate_speedup"] = row["eager_generate"] / row["graph_generate"]
    row["graph_tokens_per_s"] = 1e3 * batch / row["graph_step"]
    row["eager_tokens_per_s"] = 1e3 * batch / row["eager_step"]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "gpt2-medium"], choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompts", nargs="+", type=int, default=[512, 4096])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--prefill-only", action="store_true", help="time only the prompt's prefill both ways"
    )
    parser.add_argument(
        "--decode-ab", choices=list(DECODE_AB), default=None,
        help="also time the steps with these settings of kernels.decode (DECODE_AB)",
    )  # fmt: skip
    parser.add_argument("--pdl-ab", action="store_true", help="--decode-ab ordinary")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    decode_ab = "ordinary" if args.pdl_ab else args.decode_ab
    if not torch.cuda.is_available():
        parser.error("this benchmark times CUDA graphs and the CUDA kernels; run it on a GPU (`device`)")
    rows = []
    for name in args.models:
        for batch in args.batches:
            for prompt in args.prompts:
                rows.append(
                    measure(name, batch, prompt, args.new_tokens, args.rounds, args.prefill_only, decode_ab)
                )
                print_summary(rows[-1])
    columns = ["model", "batch", "prompt", "prefill_decode", "prefill_flash", "prefill_speedup"]
    if not args.prefill_only:
        columns += ["eager_step", "graph_step", "step_speedup", "capture",
               "eager_generate", "graph_generate", "generate_speedup", "same_tokens"]  # fmt: skip
        if decode_ab:
            columns += [f"eager_step_{decode_ab}_speedup", f"graph_step_{decode_ab}_speedup"]
    print(markdown_table(rows, columns, floatfmt="{:.2f}"))
    if args.out:
        write_results(args.out, rows)


if __name__ == "__main__":
    main()
