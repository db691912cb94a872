"""Concatenations and mixtures of shard datasets (subsets: ``_subset.py``; class weights: ``_weights.py``).

These are map-style datasets (usable with a plain ``DataLoader``) that a
:class:`~fastload.ShardLoader` also understands: it reads a subset through
its base dataset with ``indices=``, a concatenation as one index space (the
native backend opens all their shards as one shard set), and a mixture with
the mixture's sampling policy (``_sampling.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Union

import numpy as np
import torch
import xxhash

from ..errors import ArgumentError, ArgumentTypeError, SchemaMismatchError
from ..sampling._alias import real_weights
from ..sampling._sampling import MAX_EPOCH_POSITIONS, STOP_MODES, MixSampling, Stop
from ._dataset import ShardDataset, empty_batch, locate_in_parts
from ._subset import ShardSubset, check_indices

__all__ = ["SOURCE_FIELD", "ConcatShardDataset", "MixedShardDataset", "ShardSubset", "check_indices", "concat", "mix"]

SOURCE_FIELD = "source"
DatasetLike = Union[str, os.PathLike, ShardDataset]


def _open(item: DatasetLike, fields: Sequence[str] | None) -> ShardDataset:
    if isinstance(item, ShardDataset):
        return item if fields is None else item.with_fields(fields, item.verify_checksums)
    if isinstance(item, (str, os.PathLike)):
        return ShardDataset(item, fields)
    raise ArgumentTypeError(f"expected a dataset directory or a ShardDataset, not {type(item).__name__}")


def _schema_key(ds: ShardDataset) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(f.name, f.dtype, f.shape) for f in ds.fields]


def parts_of(dataset: ShardDataset | ConcatShardDataset) -> list[ShardDataset]:
    """Return the datasets laid end to end in ``dataset``'s index space (itself, unless it is a concat)."""
    return list(dataset.datasets) if isinstance(dataset, ConcatShardDataset) else [dataset]


class ConcatShardDataset(torch.utils.data.Dataset):
    """Shard datasets laid end to end: index ``offsets[j] + i`` is sample i of dataset j.

    The datasets yield the same fields (names, dtypes, shapes; codecs may
    differ). With ``with_source`` each sample also holds ``source``, the
    number of its dataset (int64).
    """

    def __init__(self, datasets: Sequence[ShardDataset], with_source: bool = False) -> None:
        self.datasets = list(datasets)
        self.with_source = bool(with_source)
        self.offsets = [0]
        for ds in self.datasets:
            self.offsets.append(self.offsets[-1] + len(ds))

    @property
    def fields(self) -> list:
        """Return the fields each sample holds (without ``source``), as the first dataset's schema."""
        return list(self.datasets[0].fields)

    @property
    def verify_checksums(self) -> bool:
        """Return whether every dataset verifies record checksums."""
        return all(ds.verify_checksums for ds in self.datasets)

    @property
    def fingerprint(self) -> str:
        """Return a hash of the datasets' fingerprints, their selected fields and whether ``source`` is added."""
        h = xxhash.xxh3_64()
        for ds in self.datasets:
            h.update(f"{ds.manifest.fingerprint}:{[f.name for f in ds.fields]};".encode())
        h.update(b"source" if self.with_source else b"")
        return h.hexdigest()

    @property
    def target_fields(self) -> tuple[str, ...]:
        """Return the fields any part's conversion wrote as targets (resampled nearest by default)."""
        return tuple(dict.fromkeys(t for d in self.datasets for t in getattr(d, "target_fields", ())))

    @property
    def same_layout(self) -> bool:
        """Return whether every dataset stores its records alike (fields, codecs, format), as one shard set reads."""
        first = self.datasets[0]
        return all(ds.manifest.fields == first.manifest.fields and ds.fields == first.fields
                   and ds.manifest.format_version == first.manifest.format_version for ds in self.datasets)

    def with_fields(self, fields: Sequence[str]) -> ConcatShardDataset:
        """Return the same concatenation yielding only ``fields``."""
        return type(self)._rebuild(self, [_open(ds, fields) for ds in self.datasets])

    def _rebuild(self, datasets: list[ShardDataset]) -> ConcatShardDataset:
        return ConcatShardDataset(datasets, self.with_source)

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        """Return the dataset number of each global index (int64)."""
        return np.searchsorted(np.asarray(self.offsets[1:], dtype=np.uint64), indices, side="right").astype(np.int64)

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        j, local = locate_in_parts(self.offsets, index)
        sample = self.datasets[j][local]
        if self.with_source:
            sample[SOURCE_FIELD] = torch.tensor(j, dtype=torch.int64)
        return sample

    def read_batch(self, indices: Sequence[int], shared: bool = False) -> dict[str, torch.Tensor]:
        """Return samples ``indices`` as one batch (``ShardDataset.read_batch`` of each dataset, rows put in place).

        With ``with_source`` the batch also holds ``source`` (int64).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise IndexError(f"sample index out of range for {len(self)} samples")
        src = self.source_of(idx.astype(np.uint64))
        present = np.unique(src)
        if len(present) == 1:  # one dataset: its batch as it comes
            j = int(present[0])
            out = self.datasets[j].read_batch((idx - self.offsets[j]).tolist(), shared)
        else:
            out = {f.name: empty_batch(len(idx), f, shared) for f in self.fields}
            for j in present.tolist():
                where = np.flatnonzero(src == j)
                part = self.datasets[j].read_batch((idx[where] - self.offsets[j]).tolist())
                for name, tensor in out.items():
                    tensor.numpy()[where] = part[name].numpy()
        if self.with_source:
            source = torch.from_numpy(src)
            out[SOURCE_FIELD] = source.share_memory_() if shared else source
        return out

    def subset(self, indices: Any) -> ShardSubset:
        """Return the samples ``indices`` of the concatenation."""
        return ShardSubset(self, indices)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.datasets)} datasets, {len(self)} samples)"


class MixedShardDataset(ConcatShardDataset):
    """A weighted mixture of shard datasets (``fastload.mix``): a concatenation plus its sampling policy.

    Indexing it is indexing the concatenation; a :class:`~fastload.ShardLoader`
    over it reads the mixture's epochs (:class:`~fastload._sampling.MixSampling`).
    """

    def __init__(self, datasets: Sequence[ShardDataset], weights: Sequence[float], stop: Stop,
                 with_source: bool = False) -> None:
        super().__init__(datasets, with_source)
        self.weights = [float(w) for w in real_weights(weights, "mix weights")]
        self.stop = stop
        self.sampling = MixSampling([len(ds) for ds in self.datasets], self.weights, stop)

    def _rebuild(self, datasets: list[ShardDataset]) -> ConcatShardDataset:
        return MixedShardDataset(datasets, self.weights, self.stop, self.with_source)

    def subset(self, indices: Any) -> ShardSubset:
        """Refused: a mixture samples its own positions."""
        raise ArgumentTypeError("a mixture samples its own positions; take subsets of its datasets before mixing")


def _open_all(datasets: Sequence[DatasetLike], fields: Sequence[str] | None, what: str,
              with_source: bool) -> list[ShardDataset]:
    if isinstance(datasets, (str, os.PathLike, ShardDataset)) or len(datasets) == 0:
        raise ArgumentError(f"{what} takes a non-empty list of datasets")
    opened = [_open(d, fields) for d in datasets]
    first = _schema_key(opened[0])
    for j, ds in enumerate(opened[1:], 1):
        if _schema_key(ds) != first:
            hint = "" if fields is not None else "; pass fields=[...] to keep the fields they share"
            raise SchemaMismatchError(f"{what}: dataset {j} ({ds.path}) yields {_schema_key(ds)}, "
                                      f"dataset 0 ({opened[0].path}) yields {first}{hint}")
    if with_source and any(f.name == SOURCE_FIELD for f in opened[0].fields):
        raise SchemaMismatchError(f"{what}: with_source=True adds a field {SOURCE_FIELD!r}, which the data has")
    return opened


def concat(datasets: Sequence[DatasetLike], fields: Sequence[str] | None = None,
           with_source: bool = False) -> ConcatShardDataset:
    """Return the shard datasets laid end to end in one index space.

    They must yield the same fields (names, dtypes, shapes), or the shared
    ``fields``; with ``with_source`` each sample also holds ``source``, its
    dataset's number. Raises :class:`~fastload.SchemaMismatchError` otherwise.
    """
    return ConcatShardDataset(_open_all(datasets, fields, "concat", with_source), with_source)


def mix(datasets: Sequence[DatasetLike], weights: Sequence[float], stop: Stop = "first_exhausted",
        fields: Sequence[str] | None = None, with_source: bool = False) -> MixedShardDataset:
    """Return a weighted mixture of shard datasets for a :class:`~fastload.ShardLoader`.

    Each position of an epoch picks its dataset with probability proportional
    to ``weights``; each dataset is read in its own (shuffled when the loader
    shuffles) order, starting a new round when it runs out. The epoch ends
    when the first dataset is exhausted (``stop="first_exhausted"``), when the
    last one is (``"all_exhausted"``), or after ``stop`` samples (an int).
    Schemas as for :func:`concat`; ``with_source`` adds each sample's dataset number.
    """
    opened = _open_all(datasets, fields, "mix", with_source)
    if isinstance(weights, (str, bytes)) or len(weights) != len(opened):
        raise ArgumentError(f"mix: {len(opened)} datasets need as many weights, got {weights!r}")
    if isinstance(stop, bool) or not (stop in STOP_MODES or (isinstance(stop, (int, np.integer)) and stop >= 0)):
        raise ArgumentError(f"mix: stop must be 'first_exhausted', 'all_exhausted' or a number of samples, "
                            f"not {stop!r}")
    if not isinstance(stop, str) and stop > MAX_EPOCH_POSITIONS:
        raise ArgumentError(f"mix: stop={stop!r} is over the bound of {MAX_EPOCH_POSITIONS} positions per epoch "
                            "(a computed epoch order holds 8 bytes per position)")
    stop = stop if isinstance(stop, str) else int(stop)
    empty = [j for j, ds in enumerate(opened) if len(ds) == 0]
    if empty:
        raise ArgumentError(f"mix: dataset {empty[0]} ({opened[empty[0]].path}) has no samples")
    return MixedShardDataset(opened, weights, stop, with_source)
