"""Class-balanced sample weights: read one field of every sample through a loader and weigh by class."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError
from ._compose import ConcatShardDataset, MixedShardDataset
from ._dataset import ShardDataset
from ._loader import ShardLoader
from ._subset import ShardSubset


def class_balanced_weights(dataset: ShardDataset | ConcatShardDataset | ShardSubset, field: str = "label"
                           ) -> np.ndarray:
    """Return per-sample weights ``1 / count(class)`` so that every class is drawn equally often.

    ``field`` is a scalar integer field (read once through the dataset). Use
    with ``ShardLoader(..., sample_weights=w)``; for a subset, pass the subset.
    """
    names = [f.name for f in dataset.fields] if not isinstance(dataset, ShardSubset) else [
        f.name for f in dataset.dataset.fields]
    if field not in names:
        raise ArgumentError(f"class_balanced_weights: no field {field!r}; the dataset has {names}")
    labels = read_field(dataset, field)
    if labels.ndim != 1 or labels.dtype.kind not in "iub":
        raise ArgumentError(f"class_balanced_weights: field {field!r} must be a scalar integer, "
                         f"not {labels.dtype}{list(labels.shape[1:])}")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].astype(np.float64)


def read_field(dataset: ShardDataset | ConcatShardDataset | ShardSubset, field: str) -> np.ndarray:
    """Return one field of every sample, stacked (read in storage order with a one-field loader)."""
    base = dataset.dataset if isinstance(dataset, ShardSubset) else dataset
    source: Any = base.with_fields([field]) if isinstance(base, ConcatShardDataset) else base
    if isinstance(base, MixedShardDataset):
        source = ConcatShardDataset(source.datasets)
    loader = ShardLoader(source, batch_size=4096, fields=None if isinstance(base, ConcatShardDataset) else [field],
                         backend="torch", num_workers=0)
    parts = [b[field].numpy() for b in loader]
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values[dataset.indices.astype(np.int64)] if isinstance(dataset, ShardSubset) else values
