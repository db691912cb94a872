"""``ShardLoader``: a drop-in replacement for ``DataLoader`` over a shard dataset."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import torch

from ._dataset import ShardDataset
from ._device import CudaOps, prefetch_to_device, resolve_device
from ._epoch import EpochIterator, summarize_stats
from ._native_backend import NATIVE_IMPORT_ERROR, NativeEpoch, NativeSettings, open_shards
from ._order import EpochOrder
from ._plan import EpochPlan
from ._state import check_state, make_state
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


def _resolve_pin_memory(pin_memory: bool | str, device: torch.device | None) -> bool:
    if pin_memory == "auto":
        return device is not None or torch.cuda.is_available()
    if not isinstance(pin_memory, bool):
        raise ValueError(f"pin_memory must be True, False or 'auto', not {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available; use pin_memory='auto' or False")
    return pin_memory


def resolve_distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return (rank, world_size): as given, else from an initialised torch.distributed, else (0, 1)."""
    dist = torch.distributed
    if rank is None and world_size is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = 1 if world_size is None else _positive_int("world_size", world_size)
    rank = 0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank must be an integer in [0, {world}), not {rank!r}")
    return rank, world


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

    With ``world_size > 1`` (taken from ``torch.distributed`` when initialised)
    each rank reads its disjoint part of every epoch (``_plan.py``); with
    ``device="cuda"`` batches arrive on the GPU, copied one batch ahead on a
    side stream. ``state_dict()`` / ``load_state_dict()`` resume exactly,
    also with another world size.
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
        rank: int | None = None,
        world_size: int | None = None,
        even_batches: bool = True,
        device: str | torch.device | None = None,
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
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        self.even_batches = bool(even_batches)
        self.device = resolve_device(device)
        self.num_threads = min(os.cpu_count() or 1, 8) if num_threads == "auto" else _positive_int(
            "num_threads", num_threads)
        self.prefetch = max(2, self.num_threads) if prefetch == "auto" else _positive_int("prefetch", prefetch)
        self.pin_memory = _resolve_pin_memory(pin_memory, self.device)
        self.backend = _resolve_backend(backend)
        self.verify_checksums = verify_checksums
        self._epoch = 0
        self._start = 0  # global position where the next pass of self._epoch begins
        self._active: weakref.ref[EpochIterator] | None = None
        self._last_stats: dict[str, Any] = {}
        self._shards: Any = None
        self._sampler: OrderBatchSampler | None = None
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._sample_delay_us = 0  # testing only: slows every native read
        if self.backend == "native":
            self._shards = open_shards(self.dataset)
        else:
            self.num_workers = workers_for_platform(num_workers)
            if self.num_workers < 0:
                raise ValueError(f"num_workers must be non-negative, not {self.num_workers}")
            self._sampler = OrderBatchSampler(self._order(0), self._plan())
            self._dataloader = make_dataloader(self.dataset, self._sampler, self.num_workers, self.pin_memory, seed,
                                               prefetch_factor, persistent_workers)

    # ---- epochs and order ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Return the epoch the next iteration will produce."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the permutation) of the next iteration, from its start."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, not {epoch!r}")
        self._epoch, self._start = epoch, 0

    def _order(self, epoch: int) -> EpochOrder:
        return EpochOrder(self.seed, epoch, len(self.dataset), self.shuffle)

    def _plan(self) -> EpochPlan:
        return EpochPlan(len(self.dataset), self.batch_size, self.drop_last, self.world_size, self.rank,
                         self._start, self.even_batches)

    def __len__(self) -> int:
        return len(self._plan())

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, plan = self._epoch, self._plan()
        order = self._order(epoch)
        if self.backend == "native":
            inner: Iterator[dict[str, torch.Tensor]] = self._iter_native(order, plan)
        else:
            assert self._sampler is not None and self._dataloader is not None
            self._sampler.configure(order, plan)
            inner = iter(self._dataloader) if len(plan) else iter(())
        if self.device is not None:
            inner = prefetch_to_device(inner, CudaOps(self.device))
        iterator = EpochIterator(self, inner, epoch, plan)
        self._active = weakref.ref(iterator)
        return iterator

    def _iter_native(self, order: EpochOrder, plan: EpochPlan) -> Iterator[dict[str, torch.Tensor]]:
        if len(plan) == 0:
            return iter(())
        if self.shuffle:
            from . import _native

            seed, epoch, n = order.seed, order.epoch, order.n

            def batch_indices(b: int) -> np.ndarray:
                return _native.permutation_at(seed, epoch, n, plan.batch_positions(b))
        else:
            batch_indices = plan.batch_positions
        settings = NativeSettings(self.num_threads, self.prefetch, self.pin_memory, self.verify_checksums,
                                  self._sample_delay_us)
        return NativeEpoch(self._shards, self.dataset, len(plan), self.batch_size, batch_indices, settings)

    def _epoch_done(self, iterator: EpochIterator) -> None:
        """Advance to the next epoch after a complete pass (called by the epoch's iterator)."""
        if self._epoch == iterator.epoch:
            self._epoch, self._start = iterator.epoch + 1, 0

    # ---- resumable state ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the loader's position as small JSON-able data (no pickle of the loader).

        Mid-epoch it records the global position after the batches delivered so
        far; loading it into a new loader (any world size) continues from there.
        """
        epoch, position = self._epoch, self._start
        active = self._active() if self._active is not None else None
        if active is not None and active.epoch == self._epoch and not active.finished:
            if active.delivered >= len(active.plan):
                epoch, position = active.epoch + 1, 0
            else:
                position = active.plan.position_after(active.delivered)
        return make_state(fingerprint=self.dataset.manifest.fingerprint, n=len(self.dataset), seed=self.seed,
                          shuffle=self.shuffle, epoch=epoch, position=position, batch_size=self.batch_size,
                          world_size=self.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state: the next iteration resumes its epoch at its position."""
        self._epoch, self._start = check_state(state, fingerprint=self.dataset.manifest.fingerprint,
                                               n=len(self.dataset), seed=self.seed, shuffle=self.shuffle)
        self._active = None

    # ---- observability ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Return counters of the current (or last) epoch and the stage that limits throughput.

        Keys: batches, samples, wait_s (time the consumer waited for data),
        wall_s, wait_share, and for the native backend bytes_read,
        bytes_decoded, read_s, decompress_s, copy_s (summed over threads),
        ready_batches; plus ``bottleneck``: "consumer" when the loop rarely
        waits, else the slowest loader stage.
        """
        active = self._active() if self._active is not None else None
        raw = active.raw_stats() if active is not None else dict(self._last_stats)
        return summarize_stats(raw, self.backend)

    def reset_stats(self) -> None:
        """Start the counters of the current epoch from zero."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.reset_stats()
        self._last_stats = {}

    def _remember_stats(self, stats: dict[str, Any]) -> None:
        self._last_stats = stats

    def __repr__(self) -> str:
        return (f"ShardLoader({str(self.dataset.path)!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"seed={self.seed}, backend={self.backend!r}, num_threads={self.num_threads}, "
                f"rank={self.rank}, world_size={self.world_size})")
