"""The torch backend: ``torch.utils.data.DataLoader`` over ``ShardDataset`` in the same order."""

from __future__ import annotations

import platform
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from ._compose import ConcatShardDataset
from ._dataset import ShardDataset
from ._plan import EpochPlan
from ._sampling import IndexOrder


class OrderBatchSampler(Sampler[list[int]]):
    """Yields one rank's batches of an epoch (docs/ORDER.md, ``_plan.py``) as lists of sample indices.

    ``configure(order, plan)`` selects the epoch before each iteration.
    """

    def __init__(self, order: IndexOrder, plan: EpochPlan) -> None:
        self.configure(order, plan)

    def configure(self, order: IndexOrder, plan: EpochPlan) -> None:
        """Select the epoch order and this rank's plan for the next iteration."""
        self.order, self.plan = order, plan

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[list[int]]:
        order, plan = self.order, self.plan
        for b in range(len(plan)):
            yield order.at(plan.batch_positions(b)).tolist()


class BatchFetch(torch.utils.data.Dataset):
    """``ShardDataset`` as the torch backend's DataLoader sees it: ``__getitems__`` reads a whole batch.

    DataLoader hands a batch's indices to ``__getitems__`` (``ShardDataset.read_batch``:
    one array per field, allocated in shared memory inside a worker) and the
    batch passes through ``collate_batch`` untouched: no tensor per sample, no
    ``default_collate`` stacking, one shared-memory block per field to send.
    """

    def __init__(self, dataset: ShardDataset | ConcatShardDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return self.dataset.read_batch(indices, shared=torch.utils.data.get_worker_info() is not None)


def collate_batch(batch: Any) -> Any:
    """``collate_fn`` of the torch backend: the batch is already collated by ``BatchFetch``."""
    return batch


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random`` and ``numpy`` from the worker's torch seed (base seed + worker id)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


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
                    pin_memory: bool, seed: int, prefetch_factor: int | None, persistent_workers: bool) -> DataLoader:
    """Return the DataLoader that serves ``backend="torch"``."""
    kwargs: dict = {}
    if num_workers > 0:
        kwargs = {"prefetch_factor": prefetch_factor or 2, "persistent_workers": persistent_workers,
                  "worker_init_fn": seed_worker}
        if platform.system() == "Linux":
            kwargs["multiprocessing_context"] = "fork"
    generator = torch.Generator()
    generator.manual_seed(seed & (2**63 - 1))
    return DataLoader(BatchFetch(dataset), batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory,
                      generator=generator, collate_fn=collate_batch, **kwargs)
