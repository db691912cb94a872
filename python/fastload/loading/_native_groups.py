"""Native batches of a concatenation whose datasets store their records differently (codecs, field sets).

One native shard set reads datasets that store records alike. When they differ
(another codec for a field, or ``fields=`` keeping the fields that datasets
with other schemas share), each group of alike datasets gets its own shard set
and reader, fed with its part of every batch; the parts are then copied into
the batch at their positions. That copy (and a batch tensor allocated per
batch, not pooled) is the price of mixing layouts; the order is the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ._compose import ConcatShardDataset
from ._native_backend import NativeEpoch, NativeSettings, open_shards, record_fingerprints
from ._remote_shards import RemoteShardSet


def layout_groups(concat: ConcatShardDataset) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Return the groups of alike datasets (dataset numbers), each dataset's group and its offset in that group."""
    keys: list[Any] = []
    groups: list[list[int]] = []
    group_of = np.zeros(len(concat.datasets), dtype=np.int64)
    offset_in_group = np.zeros(len(concat.datasets), dtype=np.uint64)
    sizes: list[int] = []
    for j, ds in enumerate(concat.datasets):
        key = (tuple(ds.manifest.fields), tuple(f.name for f in ds.fields), ds.manifest.format_version)
        if key not in keys:
            keys.append(key)
            groups.append([])
            sizes.append(0)
        g = keys.index(key)
        groups[g].append(j)
        group_of[j], offset_in_group[j] = g, sizes[g]
        sizes[g] += len(ds)
    return groups, group_of, offset_in_group


def open_groups(concat: ConcatShardDataset) -> list[Any]:
    """Open one native shard set per group of alike datasets."""
    groups, _, _ = layout_groups(concat)
    return [open_shards([concat.datasets[j] for j in g]) for g in groups]


def _fingerprints(concat: ConcatShardDataset, group: list[int]) -> list[int]:
    """Return what the records of each shard of one group's shard set carry, in its shards' order."""
    return record_fingerprints([concat.datasets[j] for j in group])


class GroupedNativeEpoch:
    """Iterates one epoch of a mixed-layout concatenation: a native epoch per group, parts copied into each batch."""

    def __init__(self, concat: ConcatShardDataset, shard_sets: list[Any], num_batches: int, batch_size: int,
                 batch_indices: Callable[[int], np.ndarray], settings: NativeSettings) -> None:
        groups, group_of, offset_in_group = layout_groups(concat)
        offsets = np.asarray(concat.offsets, dtype=np.uint64)
        self._fields = concat.fields
        self._num_batches = num_batches
        self._sizes: list[int] = []
        self._parts: list[list[tuple[int, np.ndarray]]] = []  # per batch: (group, positions in the batch)
        sub: list[list[np.ndarray]] = [[] for _ in groups]
        for b in range(num_batches):
            idx = np.asarray(batch_indices(b), dtype=np.uint64)
            j = concat.source_of(idx)
            g = group_of[j]
            local = offset_in_group[j] + (idx - offsets[j])
            parts = []
            for group in range(len(groups)):
                where = np.flatnonzero(g == group)
                if where.size:
                    parts.append((group, where))
                    sub[group].append(local[where])
            self._parts.append(parts)
            self._sizes.append(len(idx))
        for group, shard_set in enumerate(shard_sets):
            if isinstance(shard_set, RemoteShardSet) and sub[group]:  # fetch in the order the batches read
                shard_set.want(np.concatenate(sub[group]), len(sub[group][0]), [len(x) for x in sub[group]])
        # The groups' readers share the turns (threads decoding at once): together no more than one reader's.
        reading = [group for group in range(len(groups)) if sub[group]]
        shared = settings if not settings.max_running else dataclasses.replace(
            settings, max_running=max(1, settings.max_running // max(1, len(reading))))
        self._epochs: list[NativeEpoch | None] = [
            NativeEpoch(shard_sets[group], concat.datasets[groups[group][0]], len(sub[group]), batch_size,
                        sub[group].__getitem__, shared, fingerprints=_fingerprints(concat, groups[group]))
            if sub[group] else None
            for group in range(len(groups))]
        self._delivered = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._delivered >= self._num_batches:
            self.close()
            raise StopIteration
        b = self._delivered
        size = self._sizes[b]
        out = {f.name: np.empty((size, *f.shape), dtype=f.np_dtype) for f in self._fields}
        try:
            for group, where in self._parts[b]:
                epoch = self._epochs[group]
                assert epoch is not None
                part = next(epoch)
                for name, array in out.items():
                    array[where] = part[name].numpy()
        except BaseException:
            self.close()
            raise
        self._delivered += 1
        return {name: torch.from_numpy(array) for name, array in out.items()}

    def stats(self) -> dict[str, Any]:
        """Return the counters of the groups' readers, summed (max for wall time; peak_running: a sum of peaks)."""
        total: dict[str, Any] = {}
        for epoch in self._epochs:
            if epoch is None:
                continue
            for key, value in epoch.stats().items():
                if key == "wall_s":
                    total[key] = max(total.get(key, 0.0), value)
                elif isinstance(value, (int, float)):
                    total[key] = total.get(key, 0) + value
        return total

    def close(self) -> None:
        """Close every group's reader (joins their threads); idempotent."""
        for epoch in self._epochs:
            if epoch is not None:
                epoch.close()

