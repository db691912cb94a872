"""Reproducible, platform-aware ``DataLoader`` set-up for any torch Dataset, and determinism checks."""

from __future__ import annotations

import os
import platform
import random
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ._distributed import resolve_distributed
from ._loader import Auto
from ._torch_backend import seed_worker


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` (CPU and CUDA); optionally ask torch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False


def default_num_workers(force_workers_on_windows: bool = False) -> int:
    """Return min(CPU count, 8), or 0 on Windows (spawned workers re-import everything) unless forced."""
    if platform.system() == "Windows" and not force_workers_on_windows:
        return 0
    return min(os.cpu_count() or 1, 8)


class _PrivateRandomState:
    """Runs each step of an in-process loader with its own seeded random, numpy and torch streams.

    What a worker process gets from ``seed_worker``, without touching the
    training loop's global random state: the global states are swapped out
    around every batch and restored after it.
    """

    def __init__(self, inner: Iterator[Any], seed: int) -> None:
        self._inner = inner
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self._state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self._restore(saved)

    @staticmethod
    def _restore(state: tuple[Any, Any, Any]) -> None:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])

    def __iter__(self) -> _PrivateRandomState:
        return self

    def __next__(self) -> Any:
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self._restore(self._state)
        try:
            return next(self._inner)
        finally:
            self._state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
            self._restore(saved)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]


class EpochDataLoader(DataLoader):
    """A DataLoader whose ``set_epoch`` reaches its DistributedSampler, and whose in-process loading is seeded.

    With ``num_workers=0`` each pass draws from its own random, numpy and torch
    streams, seeded from the loader's generator, as a worker would: the same
    batches every run, whatever the training loop does with the global state.
    """

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of ``epoch`` for the distributed sampler."""
        if isinstance(self.sampler, DistributedSampler):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        inner = super().__iter__()
        if self.num_workers > 0:
            return inner
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        return _PrivateRandomState(inner, seed)


def create_dataloader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = False,
    seed: int | None = None,
    num_workers: Union[int, Auto] = "auto",
    pin_memory: Union[bool, Auto] = "auto",
    persistent_workers: Union[bool, Auto] = "auto",
    prefetch_factor: Union[int, Auto, None] = "auto",
    drop_last: bool = False,
    world_size: int | None = None,
    rank: int | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    force_workers_on_windows: bool = False,
    multiprocessing_context: str | None = None,
) -> EpochDataLoader:
    """Return a ``DataLoader`` set up the way careful training code does it, for any map-style Dataset.

    A seeded ``torch.Generator`` drives the shuffle; each worker seeds ``random``
    and ``numpy``; with ``world_size > 1`` (or an initialised torch.distributed)
    a seeded ``DistributedSampler`` splits the data (call ``set_epoch``);
    ``pin_memory`` only with CUDA; ``persistent_workers`` and
    ``prefetch_factor`` only with workers; on Windows no workers unless forced.
    ``multiprocessing_context`` (e.g. ``"spawn"``, as on Windows) is the
    workers' start method; ``None`` keeps the platform's default.
    """
    if seed is None:
        seed = int(torch.initial_seed() % 2**63)
    if num_workers == "auto":
        num_workers = default_num_workers(force_workers_on_windows)
    elif platform.system() == "Windows" and num_workers > 0 and not force_workers_on_windows:
        warnings.warn(f"fastload: num_workers={num_workers} ignored on Windows: each spawned worker re-imports "
                      "torch and your script (seconds per epoch); pass force_workers_on_windows=True to keep them",
                      RuntimeWarning, stacklevel=2)
        num_workers = 0
    pin = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
    generator = torch.Generator()
    generator.manual_seed(seed)
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["persistent_workers"] = True if persistent_workers == "auto" else bool(persistent_workers)
        kwargs["prefetch_factor"] = 2 if prefetch_factor in ("auto", None) else prefetch_factor
        if multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = multiprocessing_context
    rank, world_size = resolve_distributed(rank, world_size)
    sampler: DistributedSampler | None = None
    if world_size > 1:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last)
        shuffle = False
    return EpochDataLoader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                           num_workers=num_workers, pin_memory=pin, drop_last=drop_last, collate_fn=collate_fn,
                           worker_init_fn=seed_worker, generator=generator, **kwargs)


def _first_difference(a: Any, b: Any, where: str) -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if not torch.equal(a, b):
            index = (a != b).nonzero()[0].tolist()
            return f"{where}{index}: {a[tuple(index)].item()} vs {b[tuple(index)].item()}"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a)} vs {sorted(b)}"
        return next((d for k in a if (d := _first_difference(a[k], b[k], f"{where}[{k!r}]"))), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _first_difference(x, y, f"{where}[{i}]"))),
                    None)
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def check_determinism(make_loader: Callable[[], Iterable[Any]], num_batches: int | None = 10) -> str | None:
    """Build two loaders with ``make_loader`` and compare their first batches.

    Returns None when they agree, else a line naming the first difference
    (batch, field, element and both values).
    """
    first, second = iter(make_loader()), iter(make_loader())
    index = 0
    while num_batches is None or index < num_batches:
        a, b = next(first, StopIteration), next(second, StopIteration)
        if a is StopIteration or b is StopIteration:
            return None if a is b else f"batch {index}: one loader ended before the other"
        diff = _first_difference(a, b, f"batch {index}")
        if diff:
            return diff
        index += 1
    return None
