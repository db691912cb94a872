"""Reading datasets in object storage while their shards download: fetching in the order of the epoch.

Policy only, in Python: which shards this rank's epoch needs and in which order
(``shard_need_order``), handed to each remote dataset's fetcher (``fetch_ahead``); and for the
native backend a :class:`RemoteShardSet`, a lazy native shard set whose shards are attached as
their downloads complete, with the gate the native epoch passes before it submits a batch (every
shard the batch reads attached). The bytes (downloads, validation, reads) are the storage layer's
and the C++ core's.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._extension import require as native_core
from ._dataset import ShardDataset


def is_remote_dataset(dataset: ShardDataset) -> bool:
    """Return whether ``dataset`` reads a version of a remote dataset through the cache."""
    return getattr(dataset, "_cached", None) is not None


def shard_starts(datasets: Sequence[ShardDataset]) -> np.ndarray:
    """Return the first global index of every shard of ``datasets`` laid end to end, plus the total (int64)."""
    counts = [s.count for ds in datasets for s in ds.manifest.shards]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def shard_need_order(starts: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Return the shards that ``indices`` read, in the order each is first read (int64)."""
    if len(indices) == 0:
        return np.zeros(0, dtype=np.int64)
    shards = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
    unique, first = np.unique(shards, return_index=True)
    return unique[np.argsort(first, kind="stable")]


def shards_missing(datasets: Sequence[ShardDataset]) -> bool:
    """Return whether a remote dataset among ``datasets`` lacks shards in the cache (a pass then fetches ahead)."""
    return any(is_remote_dataset(ds) and ds._cached.fetcher.missing() > 0  # type: ignore[union-attr]
               for ds in datasets)


def fetch_ahead(datasets: Sequence[ShardDataset], indices: np.ndarray, batch_size: int) -> None:
    """Have each remote dataset fetch the shards ``indices`` read (global over ``datasets``), first needed first.

    The shards of the first batch (``indices[:batch_size]``) get the link to themselves until one
    of them is whole (``ShardFetcher.want``'s ``first``).
    """
    if not any(is_remote_dataset(ds) for ds in datasets):
        return
    starts = shard_starts(datasets)
    order = shard_need_order(starts, indices)
    urgent = set(shard_need_order(starts, indices[:batch_size]).tolist())
    offset = 0
    for ds in datasets:
        count = len(ds.manifest.shards)
        if is_remote_dataset(ds):
            mine = order[(order >= offset) & (order < offset + count)] - offset
            first = sum(1 for s in range(offset, offset + count) if s in urgent)
            ds._cached.fetcher.want(mine.tolist(), first)  # type: ignore[union-attr]
        offset += count


class RemoteShardSet:
    """A native shard set over datasets some of which are remote: shards attached as their downloads complete.

    ``native`` is the lazy ``_native.ShardSet`` the reader reads; local datasets' shards are attached
    at once (opened and validated now, as an eager set would), remote ones by their fetcher's
    download threads. ``ready``/``wait`` gate a batch's submission on its shards.
    """

    def __init__(self, datasets: Sequence[ShardDataset]) -> None:
        self.datasets = list(datasets)
        self.starts = shard_starts(self.datasets)
        self.native = native_core().ShardSet.lazy([int(c) for c in np.diff(self.starts)])
        self._parts: list[tuple[int, Any]] = []  # per shard: (index in its dataset, its fetcher or None)
        self._all_attached = False
        first = 0
        me = weakref.ref(self)
        for ds in self.datasets:
            if is_remote_dataset(ds):
                fetcher = ds._cached.fetcher  # type: ignore[union-attr]
                self._parts += [(i, fetcher) for i in range(len(ds.manifest.shards))]
                fetcher.on_fetched(functools.partial(_attach, me, first))
            else:
                for i, shard in enumerate(ds.manifest.shards):
                    self.native.attach(first + i, str(ds.path / shard.file))
                    self._parts.append((i, None))
            first += len(ds.manifest.shards)

    def want(self, indices: np.ndarray, batch_size: int) -> None:
        """Fetch the shards ``indices`` read, in the order of first need (the rank's epoch, in batches)."""
        fetch_ahead(self.datasets, indices, batch_size)

    def _missing(self, indices: np.ndarray) -> list[int]:
        if self._all_attached:
            return []
        shards = np.unique(np.searchsorted(self.starts, np.asarray(indices, dtype=np.int64), side="right") - 1)
        missing = [int(s) for s in shards if not self.native.attached(int(s))]
        if not missing and all(self.native.attached(s) for s in range(len(self._parts))):
            self._all_attached = True
        return missing

    def ready(self, indices: np.ndarray) -> bool:
        """Return whether every shard ``indices`` read is attached; raise a failed download's error."""
        ready = True
        for s in self._missing(indices):
            local, fetcher = self._parts[s]
            if fetcher.ready([local]):  # whole, its listener not run for this set: attach it here
                self.native.attach(s, str(fetcher.path(local)))
            else:  # (ready raises the download's error, if it failed)
                ready = False
        return ready

    def wait(self, indices: np.ndarray) -> None:
        """Return once every shard ``indices`` read is attached, fetching it first; raise a download's error."""
        for s in self._missing(indices):
            local, fetcher = self._parts[s]
            path = fetcher.ensure(local)
            self.native.attach(s, str(path))  # once: a no-op when its download thread attached it already


def _attach(owner: weakref.ref[RemoteShardSet], first: int, index: int, path: Path) -> None:
    """Attach shard ``index`` of a dataset whose shards start at ``first`` (nothing once the set is gone)."""
    shard_set = owner()
    if shard_set is not None:
        shard_set.native.attach(first + index, str(path))
