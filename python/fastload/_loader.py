"""``ShardLoader``: a drop-in replacement for ``DataLoader`` over a shard dataset."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import torch

from ._dataset import ShardDataset
from ._native_backend import NATIVE_IMPORT_ERROR, NativeEpoch, NativeSettings, open_shards
from ._order import EpochOrder, num_batches
from ._torch_backend import OrderBatchSampler, make_dataloader, workers_for_platform

BACKEND_ENV = "FASTLOAD_BACKEND"
Auto = Literal["auto"]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


def _resolve_backend(backend: str) -> str:
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    if backend not in ("auto", "native", "torch"):
        raise ValueError(f"backend must be 'auto', 'native' or 'torch', not {backend!r}")
    if backend == "native" and NATIVE_IMPORT_ERROR is not None:
        raise ImportError(f"backend='native' needs fastload._native, which failed to import: {NATIVE_IMPORT_ERROR}")
    if backend == "auto":
        if NATIVE_IMPORT_ERROR is None:
            return "native"
        warnings.warn(f"fastload: the native extension is not available ({NATIVE_IMPORT_ERROR}); "
                      "falling back to backend='torch'", RuntimeWarning, stacklevel=3)
        return "torch"
    return backend


def _resolve_pin_memory(pin_memory: bool | str) -> bool:
    if pin_memory == "auto":
        return torch.cuda.is_available()
    if not isinstance(pin_memory, bool):
        raise ValueError(f"pin_memory must be True, False or 'auto', not {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available; use pin_memory='auto' or False")
    return pin_memory


class ShardLoader:
    """Batches of a shard dataset in a seeded, deterministic order; a drop-in for ``DataLoader``.

    Each batch is a dict of field name to a tensor of shape ``[B, *field shape]``
    in the schema's dtype. The order of epoch ``e`` is a pure function of
    ``(seed, e, len(dataset))`` (docs/ORDER.md), identical for every thread
    count and backend. The epoch advances by one after each complete pass;
    ``set_epoch(e)`` selects it explicitly, as with ``DistributedSampler``.

    ``backend="native"`` decodes in C++ threads into pooled (pinned when CUDA
    is there) buffers; ``backend="torch"`` uses ``torch.utils.data.DataLoader``
    over :class:`ShardDataset`; ``"auto"`` (or the ``FASTLOAD_BACKEND``
    environment variable) picks native when the extension imports.
    """

    def __init__(
        self,
        path_or_dataset: str | os.PathLike | ShardDataset,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_threads: Union[int, Auto] = "auto",
        prefetch: Union[int, Auto] = "auto",
        fields: Sequence[str] | None = None,
        pin_memory: Union[bool, Auto] = "auto",
        backend: Literal["auto", "native", "torch"] = "auto",
        num_workers: Union[int, Auto] = "auto",
        verify_checksums: bool = True,
        prefetch_factor: int | None = None,
        persistent_workers: bool = True,
    ) -> None:
        self.batch_size = _positive_int("batch_size", batch_size)
        if isinstance(path_or_dataset, ShardDataset):
            self.dataset = path_or_dataset if fields is None else ShardDataset(path_or_dataset.path, fields,
                                                                                verify_checksums)
        elif isinstance(path_or_dataset, (str, os.PathLike)):
            self.dataset = ShardDataset(Path(path_or_dataset), fields, verify_checksums)
        else:
            raise TypeError(f"expected a dataset directory or a ShardDataset, not {type(path_or_dataset).__name__}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, not {seed!r}")
        self.shuffle, self.seed, self.drop_last = bool(shuffle), seed, bool(drop_last)
        self.num_threads = min(os.cpu_count() or 1, 8) if num_threads == "auto" else _positive_int(
            "num_threads", num_threads)
        self.prefetch = max(2, self.num_threads) if prefetch == "auto" else _positive_int("prefetch", prefetch)
        self.pin_memory = _resolve_pin_memory(pin_memory)
        self.backend = _resolve_backend(backend)
        self.verify_checksums = verify_checksums
        self._epoch = 0
        self._shards: Any = None
        self._sampler: OrderBatchSampler | None = None
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._sample_delay_us = 0
        if self.backend == "native":
            self._shards = open_shards(self.dataset)
        else:
            self.num_workers = workers_for_platform(num_workers)
            if self.num_workers < 0:
                raise ValueError(f"num_workers must be non-negative, not {self.num_workers}")
            self._sampler = OrderBatchSampler(len(self.dataset), self.batch_size, self.shuffle, seed, self.drop_last)
            self._dataloader = make_dataloader(self.dataset, self._sampler, self.num_workers, self.pin_memory, seed,
                                               prefetch_factor, persistent_workers)

    @property
    def epoch(self) -> int:
        """Return the epoch the next iteration will produce."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the permutation) of the next iteration."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, not {epoch!r}")
        self._epoch = epoch

    def __len__(self) -> int:
        return num_batches(len(self.dataset), self.batch_size, self.drop_last)

    def batch_bounds(self) -> list[tuple[int, int]]:
        """Return [start, stop) positions in the epoch order of every batch."""
        n = len(self.dataset)
        return [(b * self.batch_size, min((b + 1) * self.batch_size, n)) for b in range(len(self))]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch = self._epoch
        if self.backend == "native":
            iterator: Iterator[dict[str, torch.Tensor]] = self._iter_native(epoch)
        else:
            iterator = self._iter_torch(epoch)
        return _EpochCounter(self, iterator, epoch)

    def _iter_native(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        n = len(self.dataset)
        if len(self) == 0:
            return iter(())
        if self.shuffle:
            from . import _native

            seed = self.seed & (2**64 - 1)

            def indices(start: int, stop: int) -> Any:
                return _native.permutation(seed, epoch, n, start, stop - start)
        else:
            order = EpochOrder(self.seed, epoch, n, shuffle=False)
            indices = order.positions
        settings = NativeSettings(self.num_threads, self.prefetch, self.pin_memory, self.verify_checksums,
                                  self._sample_delay_us)
        return NativeEpoch(self._shards, self.dataset, self.batch_bounds(), self.batch_size, indices, settings)

    def _iter_torch(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        assert self._sampler is not None and self._dataloader is not None
        self._sampler.set_epoch(epoch)
        return iter(self._dataloader)

    def __repr__(self) -> str:
        return (f"ShardLoader({str(self.dataset.path)!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"seed={self.seed}, backend={self.backend!r}, num_threads={self.num_threads})")


class _EpochCounter:
    """Wraps one epoch's iterator; advances the loader's epoch when the pass completes."""

    def __init__(self, loader: ShardLoader, inner: Iterator[dict[str, torch.Tensor]], epoch: int) -> None:
        self._loader, self._inner, self._epoch = loader, inner, epoch

    def __iter__(self) -> _EpochCounter:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        try:
            return next(self._inner)
        except StopIteration:
            if self._loader._epoch == self._epoch:
                self._loader._epoch = self._epoch + 1
            raise

    def close(self) -> None:
        """Stop this epoch early and release its threads."""
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        return len(self._loader)
