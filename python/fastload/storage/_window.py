"""A windowed version's room: which of its shards to evict before one more is downloaded.

A version larger than the room ``cache_limit`` leaves it is *windowed* (``storage/_cache.py``): it
may hold ``window_bytes(version)`` bytes, and shards come and go as the epoch moves on. Before a
shard is downloaded, :func:`reserve_room` (under the cache-wide lock) evicts shards until it fits,
then creates its ``.part`` file at its full size, so downloads in flight count in every process's
sum. The eviction order is Belady's: the shard this process needs latest (or never again) first,
from a :class:`NeedPlan` of the epoch; without a plan (a dataset indexed directly, a forked reader)
the least recently used. A shard is evicted only when

- this process does not need it sooner than the shard being fetched (no thrashing: a shard needed
  later waits for room rather than pushing out one needed sooner),
- no batch in flight in this process reads it (``release`` detaches it from the native set, which
  refuses while a batch pins it), and
- no process holds it (its ``.<file>.readers`` lock is taken exclusively before it is deleted).

When nothing can go, there is no room yet: the fetcher tries again as the epoch moves on.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import ArgumentError
from ..format._manifest import MANIFEST_NAME, ShardInfo
from ._cache import cache_lock, is_whole, window_bytes
from ._cache_fs import open_new, unlink_in
from ._locks import FileLock


class NeedPlan:
    """When one epoch (this process's batches) reads each shard of a version: for eviction by next need."""

    def __init__(self, shard_of_sample: np.ndarray, batch_of_sample: np.ndarray, num_shards: int) -> None:
        """Index the epoch's reads: sample ``k`` reads shard ``shard_of_sample[k]`` in batch ``batch_of_sample[k]``.

        Batches are numbered as the reader submits them (non-decreasing); a shard of -1 marks another
        dataset's sample.
        """
        shards = np.asarray(shard_of_sample, dtype=np.int64)
        batches = np.asarray(batch_of_sample, dtype=np.int64)
        if batches.shape != shards.shape:
            raise ArgumentError("NeedPlan: one batch per sample")
        mine = shards >= 0
        width = int(batches[-1]) + 2 if len(batches) else 1
        pairs = np.unique(shards[mine] * width + batches[mine])
        self._shard = pairs // width
        self._batch = pairs % width
        self._starts = np.searchsorted(self._shard, np.arange(num_shards + 1))

    def bytes_needed_by(self, position: int, horizon: float, sizes: np.ndarray) -> int:
        """Return the bytes of the shards some batch in ``[position, horizon]`` reads (``sizes`` per shard)."""
        mask = (self._batch >= position) & (self._batch <= horizon)
        return int(sizes[np.unique(self._shard[mask])].sum())

    def next_need(self, shard: int, position: int) -> float:
        """Return the first batch at or after ``position`` that reads ``shard`` (inf: none)."""
        lo, hi = int(self._starts[shard]), int(self._starts[shard + 1])
        k = lo + int(np.searchsorted(self._batch[lo:hi], position))
        return float(self._batch[k]) if k < hi else math.inf

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (shard, batch) for every batch and each shard it reads, sorted by shard then batch (int64)."""
        return self._shard, self._batch


def reserve_room(version: Path, shards: Sequence[ShardInfo], index: int, part: Path,
                 next_need: Callable[[int], float], release: Callable[[int], bool],
                 busy: set[int]) -> list[int] | None:
    """Make room for shard ``index`` in ``version`` and create ``part`` at its size; return the shards evicted.

    Return None when there is no room yet (nothing that may go). A version not windowed (any more)
    needs no room: ``part`` is created empty. ``next_need(j)``: when this process reads shard ``j``
    next (inf: not again); ``release(j)``: let go of shard ``j`` in this process, False while a batch
    in flight reads it; ``busy``: shards this process is downloading (never evicted).
    """
    cache_dir = version.parent.parent
    with cache_lock(cache_dir):
        window = window_bytes(version)
        need = shards[index].bytes
        if window is None:
            open_new(part).close()
            return []
        by_file = {shard.file: j for j, shard in enumerate(shards)}
        used, present, parts = _held(version, shards, by_file)
        if used + need > window and parts - busy - {index}:
            _remove_stale_parts(version, shards, parts - busy - {index})
            used, present, parts = _held(version, shards, by_file)
        evicted: list[int] = []
        if used + need > window:
            mine = next_need(index)
            candidates = [j for j in present if j != index and j not in busy
                          and next_need(j) > mine and is_whole(version / shards[j].file, shards[j].bytes)]
            candidates.sort(key=lambda j: (-next_need(j), _mtime(version / shards[j].file)))
            for j in candidates:
                if used + need <= window:
                    break
                if not release(j):  # a batch in flight reads it
                    continue
                lock = FileLock.try_exclusive(version / f".{shards[j].file}.readers")
                if lock is None:  # another process reads it
                    continue
                with lock:
                    unlink_in(cache_dir, version / shards[j].file)
                evicted.append(j)
                if j not in parts:  # a .part of it (another download's) still holds its bytes
                    used -= shards[j].bytes
            if used + need > window:
                return None
        open_new(part, size=need).close()  # sparse: it counts at its full size from now on, in every process's sum
        return evicted


def _held(version: Path, shards: Sequence[ShardInfo], by_file: dict[str, int]) -> tuple[int, set[int], set[int]]:
    """Return (the bytes the version holds, the shards whole there, the shards with a ``.part`` there).

    Its manifest counts, and each shard whole or reserved (a ``.part``, created at full size) at its
    full size. Two listings of the directory, one after the other, united: a download renamed from
    its ``.part`` name meanwhile (no lock is held for the rename) may be missed by the listing it
    happens during, never by both. Costs a listing, not a ``stat`` per shard of the dataset.
    """
    present: set[int] = set()
    parts: set[int] = set()
    for _ in range(2):
        try:
            names = os.listdir(version)
        except OSError:
            names = []
        for name in names:
            base, dot_part, _ = name.partition(".part-")
            j = by_file.get(base)
            if j is not None:
                (parts if dot_part else present).add(j)
    total = sum(shards[j].bytes for j in present | parts)
    try:
        total += (version / MANIFEST_NAME).stat().st_size
    except OSError:
        pass
    return total, present, parts


def _remove_stale_parts(version: Path, shards: Sequence[ShardInfo], candidates: set[int]) -> None:
    """Delete the ``.part`` files of ``candidates`` whose download ended without cleaning up (their lock is free)."""
    for j in sorted(candidates):
        shard = shards[j]
        parts = list(version.glob(shard.file + ".part-*"))
        if not parts:
            continue
        try:
            lock = FileLock(version / f".{shard.file}.lock", exclusive=True, blocking=False)
        except (BlockingIOError, OSError):  # being downloaded
            continue
        with lock:
            for stale in parts:
                unlink_in(version.parent.parent, stale)


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
