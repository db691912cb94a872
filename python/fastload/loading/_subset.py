"""``ShardSubset`` (the samples ``indices`` of a dataset, in that order) and the index check it uses.

Below the datasets it subsets: ``ShardDataset.subset`` and ``ConcatShardDataset.subset``
return one, and a :class:`~fastload.ShardLoader` reads it through its base dataset with
``indices=``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentIndexError, ArgumentTypeError


def check_indices(indices: Any, n: int, what: str = "indices") -> np.ndarray:
    """Return ``indices`` as a uint64 array after checking they are integers in ``[0, n)``; quote a bad one."""
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__"):
        raise ArgumentTypeError(f"{what} must be a sequence or array of sample indices, "
                                f"not {type(indices).__name__}")
    try:
        arr = np.asarray(indices)
    except (ValueError, TypeError, OverflowError) as err:
        raise ArgumentTypeError(f"{what} must be integers: {err}") from None
    if arr.ndim != 1:
        raise ArgumentError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        bad = next((x for x in arr.tolist() if isinstance(x, bool) or not isinstance(x, int)), arr.flat[0])
        raise ArgumentTypeError(f"{what} must be integers; got {bad!r} ({arr.dtype})")
    if not arr.size:
        return np.zeros(0, np.uint64)
    # Compared in the array's own dtype, so a huge uint64 is quoted as itself, not wrapped to a negative.
    out_of_range = np.flatnonzero((arr < 0) | (arr >= n)) if arr.dtype.kind == "i" else np.flatnonzero(arr >= n)
    if out_of_range.size:
        i = int(out_of_range[0])
        raise ArgumentIndexError(f"{what}[{i}] = {int(arr[i])} is out of range for {n} samples")
    return arr.astype(np.uint64)


class ShardSubset(torch.utils.data.Dataset):
    """The samples ``indices`` of a dataset, in that order: ``subset[i]`` is ``dataset[indices[i]]``."""

    def __init__(self, dataset: Any, indices: Any) -> None:
        self.dataset = dataset
        self.indices = check_indices(indices, len(dataset))

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.dataset[int(self.indices[i])]

    def subset(self, indices: Any) -> ShardSubset:
        """Return the subset of this subset's positions ``indices``."""
        return ShardSubset(self.dataset, self.indices[check_indices(indices, len(self)).astype(np.int64)])

    def __repr__(self) -> str:
        return f"ShardSubset({self.dataset!r}, {len(self)} indices)"
