"""Language modelling: next-token prediction over windows of a tokenised corpus (`data/`)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from data.lm import prepare_lm_data
from data.sampler import WindowSampler, val_batches
from flashtrain.distributed.context import current_sequence_parallel
from flashtrain.models.gpt import GPT


def rank_zero_first(rank: int, world_size: int, fn):
    """Run fn on rank 0, then on the others (which then read rank 0's cache instead of racing it)."""
    if world_size > 1 and rank != 0:
        dist.barrier()  # blocks until rank 0 has run fn
    result = fn()
    if world_size > 1 and rank == 0:
        dist.barrier()
    return result


def check_val_split(num_tokens: int, seq_len: int, batch_size: int, dp: int) -> None:
    """The validation split must hold one global batch of windows (what `val_batches` needs); said at
    set-up, not at the first evaluation after training, when no checkpoint may have been written yet."""
    num_windows = (num_tokens - 1) // seq_len  # as val_batches counts them
    global_batch = batch_size * dp
    if num_windows < global_batch:
        raise ValueError(
            f"the validation split has {num_tokens} tokens = {num_windows} windows of trainer.seq_len="
            f"{seq_len}, fewer than one global batch of trainer.batch_size={batch_size} x {dp} data-parallel "
            f"rank(s) = {global_batch}; lower trainer.batch_size or trainer.seq_len, or hold out more text "
            "(raise data.val_fraction or data.max_documents)"
        )


class LMTask:
    def __init__(self, cfg, *, rank: int, world_size: int, dp_rank: int, dp: int):
        self.cfg = cfg
        tc = cfg.trainer
        self.data = rank_zero_first(rank, world_size, lambda: prepare_lm_data(cfg.data))
        self.tokenizer_name = self.data.tokenizer_name
        self.seq_len = tc.seq_len
        self.dp_rank, self.dp = dp_rank, dp
        self.sampler = WindowSampler(
            self.data.train, tc.seq_len, tc.batch_size, seed=tc.seed, rank=dp_rank, world_size=dp
        )
        check_val_split(len(self.data.val), tc.seq_len, tc.batch_size, dp)

    def build_model(self) -> GPT:
        model_cfg, tc = self.cfg.model, self.cfg.trainer
        if model_cfg.vocab_size is None:
            model_cfg.vocab_size = 64 * math.ceil(self.data.vocab_size / 64)  # multiple of 64: faster matmuls
        if model_cfg.vocab_size < self.data.vocab_size:
            raise ValueError(
                f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's vocabulary "
                f"({self.data.vocab_size}, {self.data.tokenizer_name}); raise it or leave it unset"
            )
        if tc.seq_len > model_cfg.max_seq_len:
            raise ValueError(
                f"trainer.seq_len={tc.seq_len} is longer than model.max_seq_len={model_cfg.max_seq_len}; "
                "raise model.max_seq_len or lower trainer.seq_len"
            )
        return GPT(model_cfg)

    def next_batch(self):
        return self.sampler.next_batch()

    @staticmethod
    def loss(model, x, y):
        """Mean next-token loss. Under sequence parallelism each rank scores its shard of the sequence
        (equal token counts), so the mean over the sequence-parallel ranks is the full loss."""
        sp = current_sequence_parallel()
        if sp is None:
            return model(x, y)
        x, y, positions = sp.shard_batch(x, y)  # local: every sp rank holds the full batch
        return model(x, y, positions=positions)

    def eval_batches(self, max_batches: int):
        tc = self.cfg.trainer
        return val_batches(
            self.data.val, tc.seq_len, tc.batch_size, max_batches, rank=self.dp_rank, world_size=self.dp
        )

    def evaluate(
        self, model, device, autocast, max_batches: int, world_size: int, final: bool = False
    ) -> dict:
        total = torch.zeros((), device=device)
        batches = 0
        for x, y in self.eval_batches(max_batches):
            with autocast():
                total += self.loss(model, x.to(device), y.to(device))
            batches += 1
        if world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM)  # blocks
            total /= world_size
        return {"val/loss": total.item() / max(batches, 1)}  # host-device sync

    def tokens_per_batch(self) -> int:
        return self.cfg.trainer.batch_size * self.seq_len

    def flops_per_token(self, model) -> float:
        return model.flops_per_token(self.seq_len)
