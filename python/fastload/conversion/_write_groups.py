"""The grouped shuffle of a conversion's write order: sources permuted, cut into groups, each group permuted.

Position ``p`` of a dataset written in the shuffled order holds the source-order sample
``GroupedOrder(seed, counts, n, G).samples(p, p + 1)``:

1. the sources are permuted: rank ``r`` of the *stream* is source ``EpochOrder(seed, WRITE_EPOCH,
   m).at(r)`` of the ``m`` sources, each with its samples in its own order;
2. the stream is cut into *groups* of ``G`` consecutive samples (the last one shorter): a group
   holds consecutive samples (a *chunk*) of each source it touches, at most ``G`` of one;
3. within group ``g`` (stream positions ``g*G .. g*G + size - 1``), position ``g*G + o`` holds
   stream position ``g*G + EpochOrder(group_seed(seed, g), WRITE_EPOCH, size).at(o)``.

``G`` is ``GROUP_BYTES`` divided by a sample's decoded size (at least 1): a constant of the format,
never the machine's or the worker count's. A writer's task is a group: it reads each source of
the group once, so a source is read once per group it spans (about once). Everything is computed
on demand from a few arrays of one entry per source (none at all when every source is one
sample: ``counts`` None); nothing holds the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import ArgumentError
from ..sampling._order import EpochOrder, mix64

GROUP_BYTES = 64 << 20  # decoded bytes of samples per group of the shuffled order (recorded in the manifest)
WRITE_EPOCH = 0x5752495445  # "WRITE": the epoch of the write order's permutations (a loader never runs this many)
_MASK64 = (1 << 64) - 1


def group_samples_for(sample_bytes: int) -> int:
    """Return G, the samples per group of the shuffled order for samples of ``sample_bytes`` decoded bytes (>= 1)."""
    return max(1, GROUP_BYTES // max(1, int(sample_bytes)))


def group_seed(seed: int, group: int) -> int:
    """Return the seed of the permutation within group ``group`` of a shuffled write of ``seed`` (docs/FORMAT.md)."""
    return mix64((mix64(int(seed) & _MASK64) + int(group) + 1) & _MASK64)


class GroupedOrder:
    """The shuffled write order of ``n`` samples of sources of ``counts`` samples each, in groups of ``group`` samples.

    ``counts`` None: ``n`` sources of one sample each (a map-style dataset read by index, arrays).
    ``samples(a, b)`` are the source-order samples at positions ``a:b``; ``locate(a, b)`` the same
    as (source, sample within it); ``chunks(g)`` the sources a group reads.
    """

    def __init__(self, seed: int, counts: Sequence[int] | np.ndarray | None, n: int, group: int) -> None:
        if group < 1:
            raise ArgumentError(f"group_samples must be positive, not {group}")
        self.seed, self.group = int(seed), int(group)
        if counts is None:
            self.n, self.sources = int(n), int(n)
            self._rank_source: np.ndarray | None = None
        else:
            sizes = np.asarray(counts, dtype=np.int64)
            if sizes.size and int(sizes.min()) < 0:
                raise ArgumentError("a source cannot have a negative sample count")
            self.n, self.sources = int(sizes.sum()), len(sizes)
            if self.n != n:
                raise ArgumentError(f"the sources hold {self.n} samples, not {n}")
            self._first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # source order
            self._rank_source = EpochOrder(self.seed, WRITE_EPOCH, len(sizes)).positions(0, len(sizes)).astype(np.int64)
            ranked = sizes[self._rank_source]
            self._rank_first = np.concatenate([[0], np.cumsum(ranked)]).astype(np.int64)  # stream order
            self._rank_used = np.cumsum(ranked > 0)  # sources with samples among ranks 0..r
        self.groups = -(-self.n // self.group)

    def group_span(self, g: int) -> tuple[int, int]:
        """Return the positions ``a:b`` of group ``g``."""
        if not 0 <= g < self.groups:
            raise ArgumentError(f"group {g} outside [0, {self.groups})")
        return g * self.group, min(self.n, (g + 1) * self.group)

    def spans(self, start: int = 0) -> Iterator[tuple[int, int]]:
        """Yield the positions ``a:b`` of each group from position ``start`` on (the first from ``start``)."""
        for g in range(start // self.group, self.groups):
            a, b = self.group_span(g)
            yield max(a, start), b

    def _stream(self, a: int, b: int) -> np.ndarray:
        """Return the stream positions at positions ``a:b`` (int64)."""
        if not 0 <= a <= b <= self.n:
            raise ArgumentError(f"positions [{a}, {b}) outside [0, {self.n})")
        parts = []
        for g in range(a // self.group, -(-b // self.group)):
            lo, hi = self.group_span(g)
            within = EpochOrder(group_seed(self.seed, g), WRITE_EPOCH, hi - lo)
            offsets = np.arange(max(a, lo) - lo, min(b, hi) - lo, dtype=np.uint64)
            parts.append(within.at(offsets).astype(np.int64) + lo)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def locate(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (source index, sample within that source) of the samples at positions ``a:b``, as int64 arrays."""
        stream = self._stream(a, b)
        if self._rank_source is None:
            sources = EpochOrder(self.seed, WRITE_EPOCH, self.n).at(stream.astype(np.uint64)).astype(np.int64)
            return sources, np.zeros(len(stream), np.int64)
        rank = np.searchsorted(self._rank_first, stream, side="right") - 1
        return self._rank_source[rank], stream - self._rank_first[rank]

    def samples(self, a: int, b: int) -> np.ndarray:
        """Return the source-order sample indices at positions ``a:b`` (int64)."""
        sources, within = self.locate(a, b)
        return sources if self._rank_source is None else self._first[sources] + within

    def chunks(self, g: int) -> list[tuple[int, int, int]]:
        """Return the chunks of group ``g``: (source, first sample, stop) in stream order, each source once."""
        a, b = self.group_span(g)
        if self._rank_source is None:
            sources = EpochOrder(self.seed, WRITE_EPOCH, self.n).positions(a, b).astype(np.int64)
            return [(int(s), 0, 1) for s in sources]
        out = []
        first_rank = int(np.searchsorted(self._rank_first, a, side="right")) - 1
        last_rank = int(np.searchsorted(self._rank_first, b - 1, side="right")) - 1
        for r in range(first_rank, last_rank + 1):
            lo, hi = max(a, int(self._rank_first[r])), min(b, int(self._rank_first[r + 1]))
            if hi > lo:
                out.append((int(self._rank_source[r]), lo - int(self._rank_first[r]), hi - int(self._rank_first[r])))
        return out

    def reads(self) -> int:
        """Return how many source reads a write of one task per group makes: its number of chunks, in all."""
        if self._rank_source is None or self.n == 0:
            return self.n
        starts = np.arange(0, self.n, self.group, dtype=np.int64)
        stops = np.minimum(starts + self.group, self.n)
        first = np.searchsorted(self._rank_first, starts, side="right") - 1
        last = np.searchsorted(self._rank_first, stops - 1, side="right") - 1
        return int((self._rank_used[last] - self._rank_used[first] + 1).sum())

    def reads_per_source(self) -> float:
        """Return the reads of each source that has samples, on average (1.0: each read once, as the source order)."""
        used = self.n if self._rank_source is None else int(self._rank_used[-1]) if self.sources else 0
        return self.reads() / used if used else 1.0
