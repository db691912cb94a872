"""``loader.sampler`` and ``loader.batch_sampler``: the objects trainers look for to call ``set_epoch``.

PyTorch Lightning, Accelerate and hand-written loops select the epoch with
``loader.sampler.set_epoch(e)`` (or ``loader.batch_sampler.sampler``), as for
a ``DistributedSampler``. Here both reach the loader's own ``set_epoch``, and
iterating them lists the sample indices (or batches of indices) that the
loader's next pass will read on this rank, without reading any data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """The sample indices of the loader's next pass on this rank; ``set_epoch`` selects the loader's epoch.

    ``len()`` is the number of samples this rank reads in one full epoch
    (padding included), as ``len(DistributedSampler)``.
    """

    def __init__(self, set_epoch: Callable[[int], None], batches: Callable[[], Iterator[list[int]]],
                 num_samples: Callable[[], int]) -> None:
        self._set_epoch, self._batches, self._num_samples = set_epoch, batches, num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the loader's next pass (``ShardLoader.set_epoch``)."""
        self._set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for batch in self._batches():
            yield from batch

    def __len__(self) -> int:
        return self._num_samples()


class EpochBatchSampler(Sampler[list[int]]):
    """The batches of sample indices of the loader's next pass on this rank, with ``.sampler`` as trainers expect."""

    def __init__(self, sampler: EpochSampler, batch_size: int, drop_last: bool,
                 batches: Callable[[], Iterator[list[int]]], num_batches: Callable[[], int]) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self._batches, self._num_batches = batches, num_batches

    def __iter__(self) -> Iterator[list[int]]:
        return self._batches()

    def __len__(self) -> int:
        return self._num_batches()
