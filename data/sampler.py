"""Deterministic, resumable windows over a 1-D token array.

A window is `seq_len + 1` consecutive tokens; the input is its first `seq_len` tokens and the target
its last `seq_len` (the input shifted by one). Window starts are `offset + i * seq_len`, so consecutive
windows share one token. Each epoch draws a new offset in [0, seq_len) (windows are not always aligned
to the same positions) and a new permutation of the windows, both from `(seed, epoch)`. No token is a
target twice within an epoch; the tail too short for a whole window is skipped that epoch.

The windows form one infinite stream that depends only on the seed and the token count. Global batch
`s` is stream positions [s*G, (s+1)*G) with G = batch_size * world_size, crossing epoch boundaries when
needed so every batch is full; rank r takes rows [r*batch_size, (r+1)*batch_size). A data-parallel run
on 2 ranks therefore sees exactly the data of a 1-rank run with twice the batch size, and the state to
resume from (epoch and position in the stream) is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def _check_shape(tokens: np.ndarray, seq_len: int, batch_size: int, rank: int, world_size: int) -> None:
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
    if seq_len < 1 or batch_size < 1:
        raise ValueError(
            f"seq_len and batch_size must be >= 1, got seq_len={seq_len}, batch_size={batch_size}"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"corpus has {len(tokens)} tokens, need at least seq_len+1 = {seq_len + 1}; "
            "lower seq_len or add data"
        )


def _gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    windows = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))  # (B, T+1), reads from the memmap
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # x, y: (B, T) each


class WindowSampler:
    """Shuffled training batches of windows, reproducible from `seed` and resumable mid-epoch.

    `next_batch()` returns `(x, y)`, int64 CPU tensors of shape (batch_size, seq_len) with
    `y[:, t] == x[:, t + 1]` for t < seq_len - 1. `state_dict()` is JSON-able and identical on all ranks.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        _check_shape(tokens, seq_len, batch_size, rank, world_size)
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0  # epoch of the next unread window in the global stream
        self.pos = 0  # index of that window in the epoch's permutation
        self.step = 0  # global batches drawn so far (for logging; resume only needs epoch and pos)
        self._windows: tuple[int, int, np.ndarray] | None = None  # (epoch, offset, permutation)

    def _epoch_windows(self, epoch: int) -> tuple[int, np.ndarray]:
        """(offset, permutation of window indices) for `epoch`, a pure function of (seed, epoch)."""
        if self._windows is None or self._windows[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            n = len(self.tokens)
            offset = int(rng.integers(0, min(self.seq_len - 1, n - self.seq_len - 1) + 1))
            num_windows = (n - offset - 1) // self.seq_len  # >= 1 by the offset bound above
            self._windows = (epoch, offset, rng.permutation(num_windows))
        return self._windows[1], self._windows[2]

    def _advance(self, epoch: int, pos: int, count: int, take: bool) -> tuple[int, int, list[np.ndarray]]:
        """Move `count` windows along the stream from (epoch, pos); collect their starts if `take`."""
        starts = []
        while count > 0:
            offset, perm = self._epoch_windows(epoch)
            n = min(count, len(perm) - pos)
            if take:
                starts.append(offset + perm[pos : pos + n] * self.seq_len)
            pos, count = pos + n, count - n
            if pos == len(perm):
                epoch, pos = epoch + 1, 0
        return epoch, pos, starts

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, r, w = self.batch_size, self.rank, self.world_size
        epoch, pos, _ = self._advance(self.epoch, self.pos, r * b, take=False)
        epoch, pos, starts = self._advance(epoch, pos, b, take=True)
        self.epoch, self.pos, _ = self._advance(epoch, pos, (w - 1 - r) * b, take=False)
        self.step += 1
        return _gather(self.tokens, np.concatenate(starts), self.seq_len)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "step": self.step,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_tokens": len(self.tokens),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved stream position. batch_size and world_size may differ from the saved run."""
        mine = {"seed": self.seed, "seq_len": self.seq_len, "num_tokens": len(self.tokens)}
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in diff.items())
            raise ValueError(
                f"sampler state does not match this data ({detail}); resume with the same data settings, "
                "seed and seq_len, or start the data stream afresh"
            )
        self.epoch, self.pos, self.step = int(state["epoch"]), int(state["pos"]), int(state["step"])


def val_batches(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    num_batches: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same evaluation batches every call: `num_batches` global batches of non-overlapping windows
    spread evenly over `tokens`, each rank taking its rows as in `WindowSampler`.

    Yields (x, y) int64 tensors of shape (batch_size, seq_len). When the split holds fewer than
    `num_batches` global batches of windows, it yields as many as fit (the same count on every rank, so
    collectives around evaluation stay matched).
    """
    _check_shape(tokens, seq_len, batch_size, rank, world_size)
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    global_batch = batch_size * world_size
    num_windows = (len(tokens) - 1) // seq_len  # non-overlapping targets, starting at token 0
    if num_windows < global_batch:
        raise ValueError(
            f"split has {len(tokens)} tokens = {num_windows} windows of seq_len+1 = {seq_len + 1}, fewer "
            f"than one global batch of {global_batch}; lower seq_len or batch size, or raise val_fraction"
        )
    num_batches = min(num_batches, num_windows // global_batch)
    total = num_batches * global_batch
    window_ids = (np.arange(total) * num_windows) // total  # evenly spread, strictly increasing
    starts = window_ids * seq_len  # (num_batches * G,)
    for g in range(num_batches):
        lo = g * global_batch + rank * batch_size
        yield _gather(tokens, starts[lo : lo + batch_size], seq_len)
