"""Text generation with a KV cache.

Prefill runs the prompt through the model once, filling one cache per layer (its attention through
`kernels.flash_attention` on CUDA); each new token then attends to the cache through
`kernels.flash_decode` (Flash-Decoding) on CUDA, or the torch reference on CPU. On CUDA the new tokens'
steps replay one captured CUDA graph (`DecodeStep`). A block-sparse model's prompt attends through its
layout's rows (`kernels.block_sparse_attention`) and each new token through `flash_decode` given the
layout (`BlockSparseKVCache`).

    python -m flashtrain.generate --run runs/default --prompt "def main(" --max-new-tokens 200
"""

from __future__ import annotations

import argparse
import numbers

import torch

from flashtrain.models.attention import triton_runs_on
from flashtrain.models.block_sparse import model_layout, refuse_window
from flashtrain.models.gpt import GPT
from kernels._common import is_int

# A prompt of at least this many tokens (batch x length) into an empty cache takes the training kernel
# (`flash_attention`, tiles for many queries) rather than `flash_decode`. Measured on an H200 in GPT-2
# medium's shape (benchmarks/results/s65/call3/): from 8192 tokens up to 64k, 1.14-1.46x faster
# prefill (at 4 x 2048, still host-bound, 1.27 once and 0.92 in a second run, s65/call9/); at 2048-4096
# tokens, where a prefill is bound by the host, 0.70-0.96x (one point 1.18). With flash_attention's inference
# calls skipping autograd (session 67, 1.45-1.51x less host time a call): 1.01 / 0.90 / 1.11 at 2048 / 4096 /
# 8192 tokens (s67/call8/), so the threshold stays.
PREFILL_FLASH_TOKENS = 8192


class KVCache:
    """Keys and values of one layer for `batch` sequences of at most `max_len` tokens."""

    def __init__(self, batch, max_len, n_kv_head, head_dim, *, dtype, device):
        self.k = torch.empty(
            batch, max_len, n_kv_head, head_dim, dtype=dtype, device=device
        )  # (B, S, Hkv, D)
        self.v = torch.empty_like(self.k)
        self.seqlen = 0  # tokens cached, counted on the host
        # Set by DecodeStep: the slots of a step's tokens (T,) int64 and the caches' lengths after it (B,)
        # int32, both on the device, so that one captured CUDA graph serves every position.
        self.slots: torch.Tensor | None = None
        self.lengths: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def append(self, k, v) -> int:
        """Write this step's k/v (B, T, Hkv, D) after what is cached (counted on the host); returns the
        position of its first token."""
        new, start = k.shape[1], self.seqlen
        if start + new > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; cannot add {new} to {start}")
        self.k[:, start : start + new] = k
        self.v[:, start : start + new] = v
        self.seqlen += new
        return start

    def write(self, k, v) -> torch.Tensor:
        """Write this step's k/v (B, T, Hkv, D) into the cache; returns the caches' lengths after it, int32
        (B,) on the device: counted on the host, or DecodeStep's (which places the step by its slots and
        counts seqlen itself, having checked the capacity)."""
        if self.slots is None:
            self.append(k, v)
            return torch.full((k.shape[0],), self.seqlen, dtype=torch.int32, device=k.device)
        self.k.index_copy_(1, self.slots, k)
        self.v.index_copy_(1, self.slots, v)
        return self.lengths

    def attend(self, q, k, v, *, window=None):
        """Append this step's k/v (B, T, Hkv, D) and attend q (B, T, H, D) to everything cached so far."""
        # a prompt of many queries: the training kernel's tiles fit it better than flash_decode's
        if (
            self.slots is None
            and self.seqlen == 0
            and q.is_cuda
            and q.shape[0] * q.shape[1] >= PREFILL_FLASH_TOKENS
        ):
            from kernels import flash_attention

            self.append(k, v)
            return flash_attention(q, k, v, causal=True, window=window)
        lengths = self.write(k, v)
        if q.is_cuda:
            from kernels import flash_decode

            return flash_decode(q, self.k, self.v, lengths, causal=True, window=window)
        from kernels.reference import decode_reference

        return decode_reference(q, self.k, self.v, lengths, causal=True, window=window)


class BlockSparseKVCache(KVCache):
    """A block-sparse model's cache: each new query attends to the cached keys its row of the model's
    layout keeps (`ModelLayout`, one layout over max_seq_len whatever the length), so generation gives
    what a forward over the whole sequence gives, reading only the kept blocks. A decode step (one new
    token a sequence) goes through `flash_decode` given the layout, which finds the row on the device, so
    `DecodeStep` can capture it; the prompt goes through `block_sparse_attention` with the rows its
    tokens fall in, picked on the host (`attend_through_layout`)."""

    def __init__(self, *args, layout, **kwargs):
        super().__init__(*args, **kwargs)
        self.layout = layout
        self.step_layout = layout.for_sequence(self.capacity, self.k.device)

    def attend(self, q, k, v, *, window=None):
        refuse_window(window)
        if q.shape[1] == 1:  # (DecodeStep's steps, one token a sequence, always come here)
            from kernels import flash_decode

            lengths = self.write(k, v)
            return flash_decode(q, self.k, self.v, lengths, causal=True, layout=self.step_layout)
        return attend_through_layout(q, self.k, self.v, self.append(k, v), self.layout)


def attend_through_layout(q, k_cache, v_cache, start: int, layout) -> torch.Tensor:
    """Causal attention of queries q (B, T, H, D) at positions [start, start + T) to the first start + T
    cached keys, through the rows of `layout` (a `ModelLayout`) those positions fall in. The kernel's
    row blocks begin at its first query, so a start inside a row block takes a call of its own up to
    the next block (one row), and the rest, aligned, one call. A call of one query, at the last key, goes
    without the causal flag, which hides nothing from it: the tile lists of calls without it are shared
    by every length inside a key tile (`kernels.layouts.lists_key`)."""
    from kernels import block_sparse_attention

    block, end, outs = layout.block_size, start + q.shape[1], []
    lo = start
    while lo < end:
        hi = end if lo % block == 0 else min(end, (lo // block + 1) * block)
        rows = layout.rows(lo // block, -(-hi // block), hi, q.device)
        outs.append(block_sparse_attention(
            q[:, lo - start : hi - start], k_cache[:, :hi], v_cache[:, :hi], rows, causal=hi - lo > 1
        ))  # fmt: skip
        lo = hi
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def new_caches(model: GPT, batch: int, capacity: int) -> list[KVCache]:
    """One empty KV cache per layer of the model, for batch sequences of at most capacity tokens, in the
    model's dtype and on its device (a block-sparse model's attend through its layout)."""
    cfg, param = model.cfg, next(model.parameters())
    shape = (batch, capacity, cfg.kv_heads, cfg.head_dim)
    if cfg.attention == "block_sparse":
        if not triton_runs_on(param.device):
            raise ValueError(
                f"a block-sparse model generates through our Triton kernels, which need a CUDA device; "
                f"it is on {param.device}: load it on a GPU (--device cuda)"
            )
        layout = model_layout(model)
        return [BlockSparseKVCache(*shape, dtype=param.dtype, device=param.device, layout=layout)
                for _ in range(cfg.n_layer)]  # fmt: skip
    return [KVCache(*shape, dtype=param.dtype, device=param.device) for _ in range(cfg.n_layer)]


class DecodeStep:
    """The model on one new token per sequence, with that token's position kept on the device, so that
    the step can be captured once as a CUDA graph and replayed at every position (`capture=True`).

    Eagerly, a step of a GPT-2 medium-sized model is ~350 small kernel launches, which the host issues
    more slowly than the GPU runs them; a replay issues them all at once. What changes between steps
    lives on the device: the token, its slot in every cache (which is also its position) and the caches'
    lengths. `flash_decode`'s grid depends only on the caches' capacity, so one capture serves every
    length. Without `capture` the same step runs eagerly (what the CPU tests check).
    """

    def __init__(self, model: GPT, caches: list[KVCache], *, capture: bool):
        first = caches[0]
        device = first.k.device
        if capture and device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need the model on a CUDA device, not {device}; pass cuda_graph=False"
            )
        self.model, self.caches = model, caches
        self.token = torch.zeros(first.k.shape[0], 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(first.k.shape[0], dtype=torch.int32, device=device)
        for cache in caches:
            cache.slots, cache.lengths = self.slot, self.lengths
        self.graph = None
        if capture:
            self._capture()

    def _forward(self) -> torch.Tensor:
        self.lengths.copy_(self.slot + 1)
        return self.model(self.token, positions=self.slot, caches=self.caches)

    def _capture(self, warmup: int = 2) -> None:
        # Warm-up writes go to the next free slot, which the first real step overwrites. It runs on a side
        # stream, as torch.cuda.graphs asks: Triton compiles there, the compiled launches set themselves up
        # on their second call, cuBLAS picks its kernels. The model's device is made current, as a capture
        # records the current device's work only.
        device = self.slot.device
        self.slot.fill_(self.caches[0].seqlen)
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._forward()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._forward()  # overwritten by every replay

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) after token (B, 1); with a graph, its output buffer, valid until the next call."""
        seqlen = self.caches[0].seqlen
        if seqlen >= self.caches[0].capacity:
            raise ValueError(f"KV cache holds {self.caches[0].capacity} tokens; cannot add one more")
        self.token.copy_(token)
        self.slot.fill_(seqlen)
        if self.graph is None:
            logits = self._forward()
        else:
            self.graph.replay()
            logits = self.logits
        for cache in self.caches:
            cache.seqlen += 1
        return logits


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """Next tokens (B, 1) from last-position logits (B, V): greedy at temperature 0."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


# Decode steps from which generation captures its step as a CUDA graph by default (cuda_graph=None). On an
# H200 (benchmarks/results/s65/call2/, call4/: GPT-2 and GPT-2 medium shapes, batch 1 and 8, prompts of 512
# to 16k tokens) the capture took 13-44 ms and paid back after 3-5 replayed steps, 6-8 at batch 8 x 16k
# (where the steps are bound by the caches' reads, so a replay saves less).
GRAPH_MIN_STEPS = 8


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    cuda_graph: bool | None = None,
) -> torch.Tensor:
    """Continue idx (B, T) by max_new_tokens sampled tokens; temperature 0 means greedy; top_k keeps the
    k most likely tokens before sampling (None: all). cuda_graph: replay each new token's step as one
    captured CUDA graph (`DecodeStep`); None = on a CUDA device when at least GRAPH_MIN_STEPS steps follow
    the prompt (a block-sparse model's too: `BlockSparseKVCache`). The tokens are the same either way."""
    cfg = model.cfg
    if idx.dim() != 2 or idx.shape[1] < 1 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"idx must be int64 or int32 token ids (batch, T >= 1), got {idx.dtype} {tuple(idx.shape)}: an empty "
            "prompt encodes to no token, so give at least one character (the command line's default is a newline)"
        )
    # (a host-device sync, once a call: the token loop syncs at every token anyway)
    if ((idx < 0) | (idx >= cfg.vocab_size)).any():
        raise ValueError(f"idx holds token ids outside the model's vocabulary [0, {cfg.vocab_size})")
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
    real = isinstance(temperature, numbers.Real) and not isinstance(temperature, bool)
    if not (real and 0 <= temperature < float("inf")):
        raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} must be an int >= 1, or None to sample from every token")
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise ValueError(
            f"cuda_graph must be True, False or None (on a CUDA device when it pays), got {cuda_graph!r}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if cuda_graph and not idx.is_cuda:
        raise ValueError(f"cuda_graph=True needs the prompt and model on a CUDA device, not {idx.device}")
    total = idx.shape[1] + max_new_tokens
    if total > cfg.max_seq_len:
        raise ValueError(f"prompt + new tokens = {total} exceeds the model's max_seq_len={cfg.max_seq_len}")
    if not cfg.causal:
        raise ValueError(
            "generation continues a sequence left to right, which needs a causal model (model.causal=true); "
            "this one attends both ways"
        )
    was_training = model.training
    model.eval()
    try:
        return _generate_with_cache(model, idx, max_new_tokens, temperature, top_k, generator, cuda_graph)
    finally:
        model.train(was_training)  # a caller sampling in the middle of training keeps its dropout


def _generate_with_cache(
    model, idx, max_new_tokens, temperature, top_k, generator, cuda_graph
) -> torch.Tensor:
    """The prompt's prefill fills one KV cache per layer; each new token's step then attends to them."""
    caches = new_caches(model, idx.shape[0], idx.shape[1] + max_new_tokens)
    logits = model(idx, caches=caches)  # prefill: (B, 1, V)
    steps = max_new_tokens - 1  # the last sampled token is not run through the model
    if cuda_graph is None:
        cuda_graph = idx.is_cuda and steps >= GRAPH_MIN_STEPS
    step = DecodeStep(model, caches, capture=True) if cuda_graph and steps > 0 else None
    out = [idx]
    for i in range(max_new_tokens):
        nxt = sample(logits[:, -1, :], temperature, top_k, generator)
        out.append(nxt)
        if i < steps:
            logits = step(nxt) if step is not None else model(nxt, caches=caches)
    return torch.cat(out, dim=1)


def language_model_checkpoint(run_or_checkpoint: str) -> str:
    """The checkpoint directory of a run (its latest) or the checkpoint itself, refused unless a
    language-model run wrote it: an LRA classifier has no language-model head to sample from."""
    from flashtrain.checkpoint import checkpoint_of, read_meta

    path = checkpoint_of(run_or_checkpoint)
    if path is None:
        raise ValueError(
            f"no checkpoint in {run_or_checkpoint}; pass a run directory or a checkpoint directory"
        )
    meta = read_meta(path)
    kind = (meta.get("config", {}).get("task") or {}).get("kind", "lm")  # no task section: an LM run's
    tokenizer = str(meta.get("tokenizer", ""))
    if kind != "lm" or tokenizer.startswith("lra-"):
        raise ValueError(
            f"{path} was written by a task.kind={kind} run (tokenizer {tokenizer}), a sequence classifier: "
            "generation needs a language-model run (task.kind=lm)"
        )
    return path


def main(argv=None):
    from data.tokenizers import get_tokenizer
    from flashtrain.checkpoint import load_model_for_inference

    parser = argparse.ArgumentParser(description="Sample text from a flashtrain checkpoint.")
    parser.add_argument(
        "--run", required=True, help="run directory (its latest checkpoint) or a checkpoint directory"
    )
    parser.add_argument("--prompt", default="\n", help="text to continue (at least one token)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument(
        "--top-k", type=int, default=200, help="sample among the k likeliest tokens (0 = all)"
    )
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--cuda-graph",
        choices=["auto", "on", "off"],
        default="auto",
        help="replay each new token's step as a captured CUDA graph (auto: on CUDA, from "
        f"{GRAPH_MIN_STEPS + 1} new tokens)",
    )
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num-samples {args.num_samples}: need at least 1")
    if args.top_k < 0:
        parser.error(f"--top-k {args.top_k}: need k >= 1, or 0 for every token")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r}: not a device; use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is visible here; use --device cpu")

    try:  # refused before a model is built from the run's config
        path = language_model_checkpoint(args.run)
    except ValueError as e:
        parser.error(str(e))
    model, tokenizer_name = load_model_for_inference(path, device=args.device)
    tokenizer = get_tokenizer(tokenizer_name)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        parser.error("--prompt encodes to no token; give at least one character")
    prompt = torch.tensor([ids] * args.num_samples, device=args.device)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    tokens = generate(
        model,
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        generator=generator,
        cuda_graph={"auto": None, "on": True, "off": False}[args.cuda_graph],
    )
    for row in tokens.tolist():
        print(tokenizer.decode([t for t in row if t < tokenizer.vocab_size]))
        print("-" * 40)


if __name__ == "__main__":
    main()
