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

from dataclasses import dataclass

import numpy as np

from ._order import num_batches


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
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not 0 <= self.start <= self.n:
            raise ValueError(f"start position {self.start} is outside [0, {self.n}]")

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
        if not 0 <= b < len(self):
            raise IndexError(f"batch {b} out of range for {len(self)} batches")
        j = np.arange(b * self.batch_size, min((b + 1) * self.batch_size, self.samples), dtype=np.uint64)
        offsets = np.uint64(self.rank) + j * np.uint64(self.world_size)
        return np.uint64(self.start) + offsets % np.uint64(self.remaining)

    def position_after(self, batches: int) -> int:
        """Return the global position once every rank has taken ``batches`` batches."""
        return min(self.n, self.start + batches * self.batch_size * self.world_size)
