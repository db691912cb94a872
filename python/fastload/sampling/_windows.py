"""A shard-aware shuffle: ``shuffle_window=K`` (docs/ORDER.md, "Shard windows").

A global shuffle makes every batch read from many shards. That is free when
the whole dataset is on a local disk, and costly when shards come one by one
from object storage into a bounded cache, or when the page cache cannot hold
the dataset. This order keeps a window of ``K`` shards hot instead, as
Streaming's block shuffles and LitData's chunk-wise shuffle do:

1. the shards are permuted (the v1 order of ``S`` shards, keyed by the stream
   ``(seed, epoch, WINSHRD1)``);
2. consecutive groups of ``K`` shards of that permutation are the windows;
3. window ``w`` lists its shards' samples (shard after shard in the permuted
   order, each in storage order) and permutes them with the v1 order keyed by
   word ``w`` of the stream ``(seed, epoch, WINSMPL1)``;
4. the epoch is the windows one after another.

Every sample appears once per epoch, and the order is a pure function of
``(seed, epoch, shard sizes, K)``: like every policy, the epoch plan splits
its positions across ranks (rank ``r`` takes positions ``r, r + W, ...``), so
all ranks read the same window at the same time, and resume, elastic resume
and the two backends work unchanged. A position never depends on the world
size, the thread count or where the shards are stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ._alias import SAMPLING_VERSION, stream_base, word
from ._sampling import ArrayOrder, Sampling, digest, permutation_at

TAG_WINDOW_SHARDS = 0x57494E5348524431  # "WINSHRD1": the order of the shards
TAG_WINDOW_SAMPLES = 0x57494E534D504C31  # "WINSMPL1": the order of the samples inside each window


def check_window(window: Any) -> int:
    """Return ``shuffle_window`` as an int after checking it is a positive integer (typed errors)."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
        raise ArgumentTypeError(f"shuffle_window must be a positive number of shards, not {window!r}")
    if window < 1:
        raise ArgumentError(f"shuffle_window must be a positive number of shards, not {window!r}")
    return int(window)


class ShardWindowSampling(Sampling):
    """Every sample once per epoch, shuffled within windows of ``window`` shards taken in a shuffled order."""

    mode = "shard_window"

    def __init__(self, shard_sizes: Sequence[int], window: int) -> None:
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.int64)
        if self.shard_sizes.ndim != 1 or (self.shard_sizes < 0).any():
            raise ArgumentError("shard sizes must be a list of non-negative counts")
        self.window = check_window(window)
        self.offsets = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)

    @property
    def num_windows(self) -> int:
        """Return the number of windows of an epoch (the last one may hold fewer shards)."""
        return -(-len(self.shard_sizes) // self.window)

    def check(self, n: int) -> None:
        """Raise ArgumentError unless the shards hold exactly ``n`` samples."""
        if n != int(self.offsets[-1]):
            raise ArgumentError(f"shards of {int(self.offsets[-1])} samples for a dataset of {n}")

    def shard_order(self, seed: int, epoch: int) -> np.ndarray:
        """Return the shards in the order their windows are read in ``epoch`` (int64)."""
        count = len(self.shard_sizes)
        return permutation_at(stream_base(seed, epoch, TAG_WINDOW_SHARDS), 0, count).astype(np.int64)

    def epoch_order(self, seed: int, epoch: int, n: int, shuffle: bool) -> ArrayOrder:
        """Return the windowed order of ``epoch`` (``shuffle`` is always true: the loader refuses it false)."""
        total = int(self.offsets[-1])

        def compute() -> np.ndarray:
            shards = self.shard_order(seed, epoch)
            base = stream_base(seed, epoch, TAG_WINDOW_SAMPLES)
            out = np.empty(total, dtype=np.uint64)
            done = 0
            for w in range(self.num_windows):
                members = self._members(shards[w * self.window:(w + 1) * self.window])
                m = len(members)
                out[done:done + m] = members[permutation_at(word(base, w), 0, m)]
                done += m
            return out

        return ArrayOrder(total, compute)

    def _members(self, shards: np.ndarray) -> np.ndarray:
        """Return the sample indices of ``shards``, shard after shard, each in storage order (uint64)."""
        sizes = self.shard_sizes[shards]
        starts = self.offsets[shards]
        total = int(sizes.sum())
        # index k of the result lies in shard i = the one whose block holds k: starts[i] + (k - first[i])
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        block = np.repeat(np.arange(len(shards)), sizes)
        return (starts[block] + np.arange(total, dtype=np.int64) - first[block]).astype(np.uint64)

    def describe(self) -> dict[str, Any]:
        """Return the mode, the window and a digest of the shard sizes."""
        return {"mode": self.mode, "version": SAMPLING_VERSION, "window": self.window,
                "shards": len(self.shard_sizes), "digest": digest(self.shard_sizes)}
