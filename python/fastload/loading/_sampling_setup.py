"""How a ``ShardLoader`` picks its sampling policy from its arguments, and the ``source`` field of native batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..format._manifest import shard_label_sets
from ..sampling._alias import real_weights
from ..sampling._class_mix import warn_if_sorted
from ..sampling._sampling import MAX_EPOCH_POSITIONS, Sampling, SubsetSampling, WeightedSampling
from ..sampling._windows import ShardWindowSampling, check_window
from ._compose import SOURCE_FIELD, ConcatShardDataset, MixedShardDataset, check_indices, parts_of
from ._dataset import ShardDataset


def make_sampling(dataset: ShardDataset | ConcatShardDataset, shuffle: bool, indices: Any, sample_weights: Any,
                  num_samples: int | None, replacement: bool, shuffle_window: Any = None) -> Sampling:
    """Return the policy of ``indices=`` / ``sample_weights=`` / a mixture / ``shuffle_window=`` (else plain).

    Mixed-up arguments are refused (ArgumentError).
    """
    n = len(dataset)
    if shuffle_window is not None:
        return window_sampling(dataset, shuffle, indices, sample_weights, check_window(shuffle_window))
    if sample_weights is None and (num_samples is not None or replacement is not True):
        raise ArgumentError("num_samples= and replacement= go with sample_weights=")
    chosen = [name for name, value in (("indices", indices), ("sample_weights", sample_weights)) if value is not None]
    if isinstance(dataset, MixedShardDataset):
        chosen.insert(0, "a mixture")
    if len(chosen) > 1:
        raise ArgumentError(f"choose one way of sampling: {' and '.join(chosen)} were given")
    if isinstance(dataset, MixedShardDataset):
        return dataset.sampling
    if indices is not None:
        return SubsetSampling(check_indices(indices, n))
    if sample_weights is not None:
        if shuffle:
            raise ArgumentError("sample_weights= draws its own random order; leave shuffle=False "
                             "(as DataLoader refuses shuffle=True with a sampler)")
        if isinstance(sample_weights, torch.Tensor):
            sample_weights = sample_weights.detach().cpu().numpy()
        weights = real_weights(sample_weights, "sample_weights")
        if weights.ndim != 1 or len(weights) != n:
            raise ArgumentError(f"sample_weights must hold one weight per sample ({n}), got shape {weights.shape}")
        if num_samples is None:
            num_samples = n
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
            raise ArgumentTypeError(f"num_samples must be a non-negative integer, not {num_samples!r}")
        if num_samples < 0:
            raise ArgumentError(f"num_samples must be a non-negative integer, not {num_samples!r}")
        if num_samples > MAX_EPOCH_POSITIONS:
            raise ArgumentError(f"num_samples={num_samples!r} is over the bound of {MAX_EPOCH_POSITIONS} positions "
                                "per epoch (a weighted epoch's order holds 8 bytes per position)")
        if not isinstance(replacement, bool):
            raise ArgumentError(f"replacement must be True or False, not {replacement!r}")
        return WeightedSampling(np.ascontiguousarray(weights), int(num_samples), replacement)
    return Sampling()


def window_sampling(dataset: ShardDataset | ConcatShardDataset, shuffle: bool, indices: Any, sample_weights: Any,
                    window: int) -> ShardWindowSampling:
    """Return the shard-window shuffle over ``dataset``'s shards, refusing the arguments it does not combine with."""
    others = [name for name, value in (("indices", indices), ("sample_weights", sample_weights)) if value is not None]
    if isinstance(dataset, MixedShardDataset):
        others.insert(0, "a mixture")
    if others:
        raise ArgumentError(f"shuffle_window= orders whole shards; it does not combine with {' or '.join(others)}")
    if not shuffle:
        raise ArgumentError(f"shuffle_window={window} shuffles within windows of shards; pass shuffle=True with it")
    if len(dataset) > MAX_EPOCH_POSITIONS:
        raise ArgumentError(f"shuffle_window= computes each epoch's order (8 bytes per sample); {len(dataset)} "
                            f"samples are over the bound of {MAX_EPOCH_POSITIONS}")
    parts = parts_of(dataset)
    sizes = [shard.count for part in parts for shard in part.manifest.shards]
    sampling = ShardWindowSampling(sizes, window)
    sampling.check(len(dataset))
    warn_sorted_labels(parts, sizes, window)
    return sampling


def warn_sorted_labels(parts: list[ShardDataset], sizes: list[int], window: int) -> None:
    """Warn when windows of ``window`` shards hold few classes (``sampling._class_mix``), from the manifests alone.

    ``sizes``: the samples of each shard of ``parts``, laid end to end.

    Datasets whose manifests record no per-shard labels (older ones, no integer ``label`` field) give no warning.
    """
    found = [shard_label_sets(part.manifest) for part in parts]
    if not found or any(f is None for f in found):
        return
    labelled = [f for f in found if f is not None]
    classes = max(len(counts) for counts, _ in labelled)
    counts = [sum(c[k] for c, _ in labelled if k < len(c)) for k in range(classes)]
    masks = [m for _, part_masks in labelled for m in part_masks]
    # stacklevel: warn_if_sorted, here, window_sampling, make_sampling, OrderSpec.build, ShardLoader, its caller
    warn_if_sorted(counts, masks, sizes, window, stacklevel=6)


def dataset_fingerprint(dataset: ShardDataset | ConcatShardDataset) -> str:
    """Return the fingerprint a saved state records for the loader's dataset."""
    if isinstance(dataset, ConcatShardDataset):
        return dataset.fingerprint
    return dataset.manifest.fingerprint


class WithSource:
    """Native batches plus ``source`` (int64, each sample's dataset number), computed from their indices.

    ``close()`` and ``stats()`` reach the wrapped epoch.
    """

    def __init__(self, batches: Any, dataset: ConcatShardDataset, batch_indices: Callable[[int], np.ndarray]) -> None:
        self._batches, self._dataset, self._batch_indices = batches, dataset, batch_indices
        self._next = 0

    @property
    def _reader(self) -> Any:
        return getattr(self._batches, "_reader", None)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self._batches)
        indices = np.asarray(self._batch_indices(self._next), dtype=np.uint64)
        self._next += 1
        batch[SOURCE_FIELD] = torch.from_numpy(self._dataset.source_of(indices))
        return batch

    def stats(self) -> dict[str, Any]:
        """Return the wrapped epoch's counters."""
        return dict(self._batches.stats())

    def close(self) -> None:
        """Close the wrapped epoch (joins its threads)."""
        self._batches.close()
