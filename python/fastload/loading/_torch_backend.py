"""The torch backend: ``torch.utils.data.DataLoader`` over ``ShardDataset`` in the same order."""

from __future__ import annotations

import multiprocessing
import platform
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from ..errors import FastloadWarning
from ..sampling._sampling import IndexOrder
from ..storage._heal import set_warning_sink
from ._augment import Augment
from ._compose import ConcatShardDataset, parts_of
from ._dataset import ShardDataset
from ._plan import EpochPlan
from ._remote_shards import is_remote_dataset


class IndexBatch(list):
    """A batch's sample indices, carrying the epoch that keys their transforms' random draws."""

    epoch: int = 0


class OrderBatchSampler(Sampler[list[int]]):
    """Yields one rank's batches of an epoch (docs/ORDER.md, ``_plan.py``) as lists of sample indices.

    ``configure(order, plan, epoch)`` selects the epoch before each iteration; each
    batch of indices carries its epoch (``IndexBatch``) for the transforms' draws.
    """

    def __init__(self, order: IndexOrder, plan: EpochPlan) -> None:
        self.configure(order, plan)

    def configure(self, order: IndexOrder, plan: EpochPlan, epoch: int = 0) -> None:
        """Select the epoch order, this rank's plan and the epoch number for the next iteration."""
        self.order, self.plan, self.epoch = order, plan, epoch

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[list[int]]:
        order, plan = self.order, self.plan
        for b in range(len(plan)):
            batch = IndexBatch(order.at(plan.batch_positions(b)).tolist())
            batch.epoch = self.epoch
            yield batch


class BatchFetch(torch.utils.data.Dataset):
    """``ShardDataset`` as the torch backend's DataLoader sees it: ``__getitems__`` reads a whole batch.

    DataLoader hands a batch's indices to ``__getitems__`` (``ShardDataset.read_batch``:
    one array per field, allocated in shared memory inside a worker) and the
    batch passes through ``collate_batch`` untouched: no tensor per sample, no
    ``default_collate`` stacking, one shared-memory block per field to send.
    """

    def __init__(self, dataset: ShardDataset | ConcatShardDataset, augment: Augment | None = None) -> None:
        self.dataset = dataset
        self.augment = augment
        # Workers' warnings about damaged cache files they healed, for the main process to warn (relay_notices).
        self.notices: Any = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        shared = torch.utils.data.get_worker_info() is not None
        if self.augment is None or not self.augment.transforms:
            return self.dataset.read_batch(indices, shared=shared)
        batch = self.augment.reference(self.dataset.read_batch(indices), getattr(indices, "epoch", 0), indices)
        return {k: v.share_memory_() if shared else v for k, v in batch.items()}


def collate_batch(batch: Any) -> Any:
    """``collate_fn`` of the torch backend: the batch is already collated by ``BatchFetch``."""
    return batch


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random`` and ``numpy`` from the worker's torch seed (base seed + worker id).

    A worker over a remote dataset also hands its heal warnings (``storage/_heal.py``) to the main process.
    """
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    info = torch.utils.data.get_worker_info()
    notices = getattr(info.dataset, "notices", None) if info is not None else None
    if notices is not None:
        set_warning_sink(notices.put)


def relay_notices(batches: Iterator[Any], notices: Any) -> Iterator[Any]:
    """Yield ``batches``; warn, in this process, what the DataLoader workers reported (``seed_worker``).

    A worker reports a heal before it sends the batch that read the healed file, so the warning comes
    by the time that batch is delivered (and at the end of the pass, however it ends).
    """
    try:
        for batch in batches:
            _warn_notices(notices)
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        _warn_notices(notices)


def _warn_notices(notices: Any) -> None:
    while not notices.empty():
        warnings.warn(notices.get(), FastloadWarning, stacklevel=3)


def workers_for_platform(num_workers: int | str) -> int:
    """Resolve ``num_workers="auto"``: none on Windows and macOS (spawn start-up), else up to 8."""
    if num_workers != "auto":
        return int(num_workers)
    if platform.system() in ("Windows", "Darwin"):
        warnings.warn(
            "fastload: backend='torch' loads in-process on Windows and macOS, where DataLoader workers are "
            "spawned and re-import everything (seconds of start-up per epoch); pass num_workers=N to force them.",
            RuntimeWarning, stacklevel=4)
        return 0
    import os

    return min(os.cpu_count() or 1, 8)


def make_dataloader(dataset: ShardDataset | ConcatShardDataset, sampler: OrderBatchSampler, num_workers: int,
                    pin_memory: bool, seed: int, prefetch_factor: int | None, persistent_workers: bool,
                    augment: Augment | None = None, multiprocessing_context: str | None = None) -> DataLoader:
    """Return the DataLoader that serves ``backend="torch"``.

    Workers start with ``multiprocessing_context`` when given, else by fork on
    Linux and the platform's default (spawn) elsewhere.
    """
    kwargs: dict = {}
    if num_workers > 0:
        kwargs = {"prefetch_factor": prefetch_factor or 2, "persistent_workers": persistent_workers,
                  "worker_init_fn": seed_worker}
        if multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = multiprocessing_context
        elif platform.system() == "Linux":
            kwargs["multiprocessing_context"] = "fork"
    generator = torch.Generator()
    generator.manual_seed(seed & (2**63 - 1))
    fetch = BatchFetch(dataset, augment)
    # Workers heal damaged cache files (storage/_heal.py): their warnings come to this process.
    if num_workers > 0 and any(is_remote_dataset(ds) for ds in parts_of(dataset)):
        fetch.notices = multiprocessing.get_context(kwargs.get("multiprocessing_context")).SimpleQueue()
    return DataLoader(fetch, batch_sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory, generator=generator, collate_fn=collate_batch, **kwargs)
