"""Which epoch positions each rank reads, batch by batch: the distributed and resumable split.

The epoch order (``_order.py``) lists all n samples. An epoch that starts at
global position ``start`` (0, or where a saved state left off) splits the
remaining ``R = n - start`` positions across ``world_size`` ranks as
``DistributedSampler`` does: rank r takes positions ``start + r + j * W`` for
j = 0, 1, ... With ``even_batches`` (the default) every rank takes the same
number, ``ceil(R / W)``, wrapping around to the start of the remainder to pad
(or ``floor(R / W)`` with ``drop_last``); without it nothing is padded, so a
metric over all ranks equals the single-process one. Each rank cuts its
positions into batches of ``batch_size``.

After every rank has taken k batches, exactly the positions
``[start, start + k * batch_size * W)`` have been read: the global position a
saved state records. Resuming with another world size re-splits what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from ..sampling._order import num_batches


@dataclass(frozen=True)
class EpochPlan:
    """The batches of one rank in one epoch, as positions of the epoch order."""

    n: int
    batch_size: int
    drop_last: bool = False
    world_size: int = 1
    rank: int = 0
    start: int = 0
    even_batches: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not 0 <= self.start <= self.n:
            raise ArgumentError(f"start position {self.start} is outside [0, {self.n}]")

    @property
    def remaining(self) -> int:
        """Return the positions left in the epoch from ``start``."""
        return self.n - self.start

    @property
    def samples(self) -> int:
        """Return how many positions this rank takes (padding included)."""
        r, w = self.remaining, self.world_size
        if not self.even_batches:
            return max(0, -(-(r - self.rank) // w))
        return r // w if self.drop_last else -(-r // w)

    def __len__(self) -> int:
        return num_batches(self.samples, self.batch_size, self.drop_last)

    def batch_positions(self, b: int) -> np.ndarray:
        """Return the epoch positions of this rank's batch ``b`` (uint64)."""
        return self.positions_of_batches(b, b + 1)

    def positions_of_batches(self, first: int, stop: int) -> np.ndarray:
        """Return the epoch positions of this rank's batches ``first`` to ``stop - 1``, one after another (uint64)."""
        if not 0 <= first < stop <= len(self):
            raise IndexError(f"batches {first} to {stop - 1} out of range for {len(self)} batches")
        j = np.arange(first * self.batch_size, min(stop * self.batch_size, self.samples), dtype=np.uint64)
        offsets = np.uint64(self.rank) + j * np.uint64(self.world_size)
        return np.uint64(self.start) + offsets % np.uint64(self.remaining)

    def position_after(self, batches: int) -> int:
        """Return the global position once every rank has taken ``batches`` batches."""
        return min(self.n, self.start + batches * self.batch_size * self.world_size)


class BatchIndices:
    """The sample indices of a plan's batches, worked out a window of batches at a time.

    ``to_indices`` maps epoch positions to sample indices (the epoch order). One numpy pass
    and one call of ``to_indices`` per ``window`` batches, instead of per batch, keep the
    consumer thread's Python work per batch small; the values are those of
    ``to_indices(plan.batch_positions(b))``. The two most recent windows are kept, since the
    batch submitted and the batch delivered may fall in neighbouring windows.
    """

    def __init__(self, plan: EpochPlan, to_indices: Callable[[np.ndarray], np.ndarray], window: int = 32,
                 permutation: tuple[int, int, int] | None = None, identity: bool = False) -> None:
        self._plan, self._to_indices, self._window = plan, to_indices, max(1, window)
        # (seed, epoch, n) when to_indices is the native epoch permutation: a reader can then be handed positions
        # (span(..., positions=True)) and map them itself, on its worker threads.
        self.permutation = permutation
        self._identity = identity  # to_indices returns the positions unchanged (an unshuffled epoch order)
        self._num_batches = len(plan)
        self._windows: list[tuple[int, np.ndarray]] = []  # (first batch, indices), newest last

    def span(self, first: int, stop: int, positions: bool = False) -> tuple[np.ndarray, list[int]]:
        """Return the sample indices of batches ``first`` to ``stop - 1`` one after another, and each batch's size.

        With ``positions``, their epoch positions instead (what ``to_indices`` maps to the indices).
        """
        indices = self._plan.positions_of_batches(first, stop)
        if not positions:
            indices = self._to_indices(indices)
        size = self._plan.batch_size
        sizes = [size] * (stop - first)
        sizes[-1] = len(indices) - size * (stop - first - 1)  # the plan's last batch may be short
        return indices, sizes

    def rank_plan(self) -> tuple[int, int, int, int, int, int] | None:
        """Return the plan as ``(start, remaining, rank, world_size, samples, batch_size)`` for a native reader.

        The reader then works out each batch's positions itself (``BatchReader.plan_positions``) and maps
        them through ``permutation``, or reads them as sample indices. None when ``to_indices`` is neither
        that permutation nor the identity: the positions must be mapped here.
        """
        if self.permutation is None and not self._identity:
            return None
        p = self._plan
        return p.start, p.remaining, p.rank, p.world_size, p.samples, p.batch_size

    def __call__(self, b: int) -> np.ndarray:
        """Return the sample indices of batch ``b``."""
        if not 0 <= b < self._num_batches:
            raise IndexError(f"batch {b} out of range for {self._num_batches} batches")
        for first, indices in self._windows:
            if first <= b < first + self._window:
                lo = (b - first) * self._plan.batch_size
                return indices[lo:lo + self._plan.batch_size]
        stop = min(b + self._window, self._num_batches)
        indices = self._to_indices(self._plan.positions_of_batches(b, stop))
        self._windows = [*self._windows[-1:], (b, indices)]
        return indices[:self._plan.batch_size]
