"""A block-sparse model's generation through its KV caches against running the whole sequence again.

Since session 69 a block-sparse model generates as a dense one does, through one KV cache per layer:
each new token attends through its row of the model's one layout (`flashtrain.generate.BlockSparseKVCache`:
`flash_decode` given the layout, which finds the row on the device, so the step is replayed from a CUDA
graph as a dense model's is). Before, it ran a forward over the whole sequence so far for every token
(`recompute` here).

GPT-2 medium's shape (24 layers, width 1024 in heads of each --headdims), bf16, random weights, butterfly
on 128-blocks (all factors, a band of one block; `--layout random`: 10% of the tiles, a pattern per head,
with `--kv-heads` under GQA): a prompt of `prompt` tokens, then `new_tokens` greedy
tokens. In alternating rounds, one whole call each way: `cache_ms` (`generate`, its steps replayed from a
CUDA graph), `cache_eager_ms` (the same steps run eagerly), `recompute_ms`, and `dense_ms`: the same weights
with dense attention (`attention=auto`, graph-replayed steps), what the layout's model gives up or gains
against the model it thins out. Those four time whole calls (prefill, capture and sampling included);
`cache_step` / `dense_step` time the new tokens' steps alone (`bench_generate.steps_ms`: ms a token, replayed
from the captured graph; on CPU eagerly), where the decode kernels' share shows. Each row also says whether the
cache and recompute gave the same tokens (bf16: the two ways add in different orders, so a near tie can
go either way; `first_difference` is the first new token where they part) and how far apart the two
ways' logits are after the prompt.

    python benchmarks/bench_generate_block_sparse.py --out benchmarks/results/generate_block_sparse_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_generate import steps_ms  # noqa: E402
from benchmarks.common import markdown_table, print_summary, rotated, wall_ms, write_results  # noqa: E402
from flashtrain.generate import generate, new_caches  # noqa: E402
from flashtrain.models.block_sparse import model_layout  # noqa: E402
from flashtrain.models.gpt import GPT, GPTConfig  # noqa: E402


@torch.no_grad()
def recompute(model: GPT, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy tokens from a forward over the whole sequence so far for each one (no cache)."""
    seq = prompt
    for _ in range(new_tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


# --layout: GPTConfig's block_sparse_* fields for each layout the benchmark takes
LAYOUTS = {
    "butterfly": dict(block_sparse_kind="butterfly", block_sparse_local=1),  # one pattern for every head
    "random": dict(block_sparse_kind="random", block_sparse_density=0.1),  # a pattern per head
}


def models(
    headdim: int, max_seq_len: int, device, dtype, n_layer=24, d_model=1024, vocab_size=50304, block=128,
    layout="butterfly", kv_heads=None,
):  # fmt: skip
    """(block-sparse model, the same weights with dense attention), eval mode; kv_heads: GQA's key/value
    heads (None: one a query head)."""
    shape = dict(n_layer=n_layer, n_head=d_model // headdim, n_kv_head=kv_heads, d_model=d_model,
                 vocab_size=vocab_size, max_seq_len=max_seq_len)  # fmt: skip
    torch.manual_seed(0)
    sparse = GPT(GPTConfig(**shape, attention="block_sparse", block_sparse_block=block,
                           **LAYOUTS[layout])).to(device, dtype).eval()  # fmt: skip
    dense = GPT(GPTConfig(**shape, attention="auto")).to(device, dtype).eval()
    dense.load_state_dict(sparse.state_dict())
    return sparse, dense


def measure(sparse: GPT, dense: GPT, batch: int, prompt_len: int, new_tokens: int, rounds: int) -> dict:
    cfg = sparse.cfg
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=next(sparse.parameters()).device)
    calls = {
        "cache": lambda: generate(sparse, prompt, new_tokens, temperature=0),
        "cache_eager": lambda: generate(sparse, prompt, new_tokens, temperature=0, cuda_graph=False),
        "recompute": lambda: recompute(sparse, prompt, new_tokens),
        "dense": lambda: generate(dense, prompt, new_tokens, temperature=0),
    }
    graph = prompt.is_cuda
    steps = {  # (each a prefill and a capture, untimed, then new_tokens steps timed: ms a token)
        "cache_step": lambda: steps_ms(sparse, prompt, new_tokens, graph)[0],
        "dense_step": lambda: steps_ms(dense, prompt, new_tokens, graph)[0],
    }
    with torch.no_grad():
        tokens = {name: fn() for name, fn in calls.items()}  # compile and warm everything once
        for fn in steps.values():
            fn()
        times = {name: [] for name in [*calls, *steps]}
        for r in range(rounds):
            for name in rotated([*calls, *steps], r):
                times[name].append(steps[name]() if name in steps else wall_ms(calls[name]))
        cached_logits = sparse(prompt, caches=new_caches(sparse, batch, prompt_len)).float()
        whole_logits = sparse(prompt).float()
    layout = model_layout(sparse).for_sequence(prompt_len + new_tokens, "cpu")
    row = dict(n_layer=cfg.n_layer, d_model=cfg.d_model, nheads=cfg.n_head, kv_heads=cfg.kv_heads,
               headdim=cfg.head_dim, batch=batch, prompt=prompt_len, new_tokens=new_tokens,
               layout=f"{cfg.block_sparse_kind}, {cfg.block_sparse_block}-blocks",
               density=round(layout.density, 4), dtype=str(next(sparse.parameters()).dtype).split(".")[-1])  # fmt: skip
    for name, vals in times.items():
        row[name] = statistics.median(vals)
        row[f"{name}_ms"] = vals  # every round, for the spread
        if name in calls:
            row[f"{name}_per_token"] = row[name] / new_tokens
    row["speedup"] = row["recompute"] / row["cache"]
    row["eager_speedup"] = row["recompute"] / row["cache_eager"]
    row["dense_over_cache"] = row["dense"] / row["cache"]
    row["dense_step_over_cache_step"] = row["dense_step"] / row["cache_step"]
    row["graph_same_as_eager"] = torch.equal(tokens["cache"], tokens["cache_eager"])
    new = tokens["cache"][:, prompt_len:] != tokens["recompute"][:, prompt_len:]
    row["same_tokens"] = not bool(new.any())
    row["first_difference"] = int(new.any(0).nonzero()[0]) if new.any() else None
    row["prompt_logits_max_diff"] = (cached_logits - whole_logits).abs().max().item()
    row["prompt_logits_max"] = whole_logits.abs().max().item()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--prompts", nargs="+", type=int, default=[512, 4096, 16384])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layout", choices=list(LAYOUTS), default="butterfly")
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA's key/value heads (default: MHA)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("this benchmark times the CUDA kernels; run it on a GPU (`device`)")
    rows = []
    for headdim in args.headdims:
        sparse, dense = models(headdim, max(args.prompts) + args.new_tokens, "cuda", torch.bfloat16,
                               layout=args.layout, kv_heads=args.kv_heads)  # fmt: skip
        for batch in args.batches:
            for prompt in args.prompts:
                rows.append(measure(sparse, dense, batch, prompt, args.new_tokens, args.rounds))
                print_summary(rows[-1])
        del sparse, dense
    columns = ["headdim", "batch", "prompt", "density", "cache_per_token", "cache_eager_per_token",
               "recompute_per_token", "speedup", "eager_speedup", "dense_per_token", "dense_over_cache",
               "cache_step", "dense_step", "dense_step_over_cache_step", "graph_same_as_eager", "same_tokens",
               "first_difference"]  # fmt: skip
    print(markdown_table(rows, columns, floatfmt="{:.3f}"))
    if args.out:
        write_results(args.out, rows)


if __name__ == "__main__":
    main()
