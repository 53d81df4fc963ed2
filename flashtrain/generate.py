"""Text generation with a KV cache.

Prefill runs the prompt through the model once, filling one cache per layer; each new token then
attends to the cache through `kernels.flash_decode` (Flash-Decoding) on CUDA, or the torch reference
on CPU.

    python -m flashtrain.generate --run runs/default --prompt "def main(" --max-new-tokens 200
"""

from __future__ import annotations

import argparse

import torch

from flashtrain.models.gpt import GPT


class KVCache:
    """Keys and values of one layer for `batch` sequences of at most `max_len` tokens."""

    def __init__(self, batch, max_len, n_kv_head, head_dim, *, dtype, device):
        self.k = torch.empty(
            batch, max_len, n_kv_head, head_dim, dtype=dtype, device=device
        )  # (B, S, Hkv, D)
        self.v = torch.empty_like(self.k)
        self.seqlen = 0

    def attend(self, q, k, v, *, window=None):
        """Append this step's k/v (B, T, Hkv, D) and attend q (B, T, H, D) to everything cached so far."""
        new = q.shape[1]
        if self.seqlen + new > self.k.shape[1]:
            raise ValueError(f"KV cache holds {self.k.shape[1]} tokens; cannot add {new} to {self.seqlen}")
        self.k[:, self.seqlen : self.seqlen + new] = k
        self.v[:, self.seqlen : self.seqlen + new] = v
        self.seqlen += new
        lengths = torch.full((q.shape[0],), self.seqlen, dtype=torch.int32, device=q.device)
        if q.is_cuda:
            from kernels import flash_decode

            return flash_decode(q, self.k, self.v, lengths, causal=True, window=window)
        from kernels.reference import decode_reference

        return decode_reference(q, self.k, self.v, lengths, causal=True, window=window)


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Continue idx (B, T) by max_new_tokens sampled tokens; temperature 0 means greedy; top_k keeps the
    k most likely tokens before sampling (None: all)."""
    cfg = model.cfg
    if idx.dim() != 2 or idx.shape[1] < 1 or idx.is_floating_point():
        raise ValueError(
            f"idx must be token ids (batch, T >= 1), got {idx.dtype} {tuple(idx.shape)}: an empty prompt "
            "encodes to no token, so give at least one character (the command line's default is a newline)"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    if not (temperature >= 0 and temperature != float("inf")):
        raise ValueError(f"temperature={temperature} must be finite and >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1, or None to sample from every token")
    total = idx.shape[1] + max_new_tokens
    if total > cfg.max_seq_len:
        raise ValueError(f"prompt + new tokens = {total} exceeds the model's max_seq_len={cfg.max_seq_len}")
    model.eval()
    dtype = next(model.parameters()).dtype
    caches = [
        KVCache(idx.shape[0], total, cfg.kv_heads, cfg.head_dim, dtype=dtype, device=idx.device)
        for _ in range(cfg.n_layer)
    ]
    logits = model(idx, caches=caches)  # prefill: (B, 1, V)
    out = [idx]
    for _ in range(max_new_tokens):
        logits = logits[:, -1, :].float()
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        out.append(nxt)
        logits = model(nxt, caches=caches)
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
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num-samples {args.num_samples}: need at least 1")
    if args.top_k < 0:
        parser.error(f"--top-k {args.top_k}: need k >= 1, or 0 for every token")

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
    )
    for row in tokens.tolist():
        print(tokenizer.decode([t for t in row if t < tokenizer.vocab_size]))
        print("-" * 40)


if __name__ == "__main__":
    main()
