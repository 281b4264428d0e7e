"""The distributed sampler: seeded permutations of a split's sequences, sharded over ranks, resumable."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_samples)
    perm.flags.writeable = False
    return perm


@functools.lru_cache(maxsize=4)
def _window_permutation(shard_sizes: tuple[int, ...], window: int, seed: int, epoch: int) -> np.ndarray:
    """The shards permuted (PCG64 of (seed, epoch)), taken ``window`` at a time in that order, and the
    sequences of each window ``k`` permuted together (PCG64 of (seed, epoch, k + 1))."""
    starts = np.cumsum((0,) + shard_sizes)
    order = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(len(shard_sizes))
    parts = []
    for k, w in enumerate(range(0, len(shard_sizes), window)):
        idx = np.concatenate([np.arange(starts[i], starts[i + 1], dtype=np.int64) for i in order[w : w + window]])
        parts.append(np.random.Generator(np.random.PCG64([seed, epoch, k + 1])).permutation(idx))
    perm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    perm.flags.writeable = False
    return perm


@dataclass
class DistributedSampler:
    """Which sequences a rank reads, as a pure function of (seed, epoch, consumed_samples, rank, world_size).

    The global sample stream is epoch after epoch of a seeded permutation of ``num_samples``
    (numpy PCG64 seeded with ``(seed, epoch)``). Global stream position ``p`` lies in epoch
    ``p // num_samples``. A micro-step with ``consumed_samples`` samples already consumed across
    all ranks gives rank ``r`` positions ``consumed + r * micro_batch + [0, micro_batch)``, so the
    ranks together read each epoch exactly once. Nothing is dropped: there is no drop_last
    remainder, since a micro-step that crosses an epoch boundary takes the end of one permutation
    and the start of the next. Resuming from any ``consumed_samples`` costs one permutation of
    ``num_samples`` (cached), however far into the epoch.

    ``window_shards`` > 0 (with ``shard_sizes``: TokenShards.shard_sizes, the sequences per shard in
    order) shuffles by windows of shards instead, as streaming loaders do (MosaicML Streaming's
    shuffle blocks): each epoch the shards are permuted and taken ``window_shards`` at a time, the
    sequences of each window permuted together (:func:`_window_permutation`). The ranks then read from
    about ``window_shards`` shards at a time, so a shard cache holding twice as many fetches each shard
    once per epoch; with 0 (the default) any sequence may follow any other, and a cache smaller than
    the split fetches shards again and again. Either way the order is a pure function of the seed and
    the epoch.

    Used as an iterator it yields this rank's micro-batches (int64 arrays of shape
    ``(micro_batch_size,)``) and advances ``consumed_samples`` by ``micro_batch_size * world_size``;
    ``state_dict``/``load_state_dict`` save and restore that position.
    """

    num_samples: int
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    micro_batch_size: int = 1
    consumed_samples: int = 0
    shard_sizes: tuple[int, ...] | None = None
    window_shards: int = 0

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.window_shards < 0:
            raise ValueError(f"window_shards must be >= 0, got {self.window_shards}")
        if self.window_shards and (self.shard_sizes is None or sum(self.shard_sizes) != self.num_samples):
            raise ValueError(f"window_shards needs shard_sizes summing to num_samples={self.num_samples}")

    def permutation(self, epoch: int) -> np.ndarray:
        """The read-only order of epoch ``epoch``: int64 array of shape (num_samples,)."""
        if self.window_shards:
            return _window_permutation(tuple(int(n) for n in self.shard_sizes), self.window_shards, self.seed, epoch)
        return _permutation(self.num_samples, self.seed, epoch)

    def indices(self, consumed_samples: int, micro_batch: int) -> np.ndarray:
        """Sequence indices (int64, shape (micro_batch,), read-only) for this rank's micro-batch after ``consumed_samples``."""
        if self.num_samples <= 0:
            raise ValueError("cannot sample from an empty split")
        start = consumed_samples + self.rank * micro_batch
        epoch, offset = divmod(start, self.num_samples)
        if offset + micro_batch <= self.num_samples:  # the common case: inside one epoch, a slice
            return self.permutation(epoch)[offset : offset + micro_batch]
        pos = start + np.arange(micro_batch, dtype=np.int64)
        epochs = pos // self.num_samples
        out = np.empty(micro_batch, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.permutation(int(e))[pos[sel] % self.num_samples]
        return out

    @property
    def epoch(self) -> int:
        return self.consumed_samples // self.num_samples if self.num_samples else 0

    def __iter__(self):
        while True:
            idx = self.indices(self.consumed_samples, self.micro_batch_size)
            self.consumed_samples += self.micro_batch_size * self.world_size
            yield idx

    def state_dict(self) -> dict:
        return {
            "num_samples": self.num_samples,
            "seed": self.seed,
            "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size,
            "consumed_samples": self.consumed_samples,
            "epoch": self.epoch,
            "window_shards": self.window_shards,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the position. Raises ValueError when the state belongs to other data or another seed."""
        for key in ("num_samples", "seed", "window_shards"):
            if state.get(key, 0) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]}, this sampler {getattr(self, key)}: "
                    "resuming would read a different sample order"
                )
        self.consumed_samples = int(state["consumed_samples"])
