"""The native backend: one epoch of batches from the C++ worker pool, as torch tensors.

Python decides which samples make each batch (policy); ``fastload._native``
reads, decodes and copies them into pooled batch buffers (bytes). A buffer
goes back to the pool only when the last tensor viewing it is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._dataset import ShardDataset

_native: Any
try:
    from . import _native
except ImportError as _err:  # the torch backend still works
    _native = None
    NATIVE_IMPORT_ERROR: ImportError | None = _err
else:
    NATIVE_IMPORT_ERROR = None


@dataclass(frozen=True)
class NativeSettings:
    """How the native backend reads: threads, batches in flight, pinned buffers."""

    num_threads: int
    prefetch: int
    pin_memory: bool
    verify_checksums: bool = True
    sample_delay_us: int = 0  # testing only


def open_shards(dataset: ShardDataset) -> Any:
    """Open every shard of ``dataset`` in the native core (checks sizes and record counts)."""
    if _native is None:
        raise ImportError(f"fastload._native is not available: {NATIVE_IMPORT_ERROR}")
    paths = [str(dataset.path / s.file) for s in dataset.manifest.shards]
    return _native.ShardSet(paths, [s.count for s in dataset.manifest.shards])


def _new_slot(nbytes: int, pin_memory: bool) -> np.ndarray:
    if pin_memory:  # page-locked through torch's caching host allocator
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    return np.empty(nbytes, dtype=np.uint8)


class NativeEpoch:
    """Iterates one epoch: submits up to ``prefetch`` batches ahead and yields them in order.

    ``close()`` (also on ``del``, ``break`` and errors) joins every worker thread.
    """

    def __init__(self, shards: Any, dataset: ShardDataset, num_batches: int, batch_size: int,
                 batch_indices: Callable[[int], np.ndarray], settings: NativeSettings) -> None:
        assert _native is not None
        schema = dataset.manifest.fields
        wanted = {f.name for f in dataset.fields}
        self._names = [f.name for f in schema if f.name in wanted]
        self._num_batches = num_batches
        self._batch_indices = batch_indices
        self._started = time.perf_counter()
        self._final_stats: dict[str, Any] | None = None
        self._settings = settings
        self._next_submit = 0
        self._delivered = 0
        self._reader: Any = _native.BatchReader(
            shards, [(f.codec_id, f.itemsize, f.nbytes) for f in schema], [f.np_dtype for f in schema],
            [list(f.shape) for f in schema], [f.name in wanted for f in schema], batch_size,
            settings.num_threads, settings.verify_checksums, settings.sample_delay_us)

    def _submit_ahead(self) -> None:
        reader = self._reader
        while self._next_submit < self._num_batches and self._next_submit - self._delivered < self._settings.prefetch:
            if reader.free_slots == 0:
                reader.add_slot(_new_slot(reader.slot_bytes, self._settings.pin_memory))
            reader.submit(self._batch_indices(self._next_submit))
            self._next_submit += 1

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._reader is None or self._delivered >= self._num_batches:
            self.close()
            raise StopIteration
        try:
            self._submit_ahead()
            arrays = self._reader.next()
            self._delivered += 1
            self._submit_ahead()
        except BaseException:
            self.close()
            raise
        return {name: torch.from_numpy(a) for name, a in zip(self._names, arrays)}

    @property
    def pool_slots(self) -> int:
        """Return how many batch buffers the pool has allocated so far."""
        return 0 if self._reader is None else self._reader.total_slots

    def stats(self) -> dict[str, Any]:
        """Return the native reader's counters, plus wall time and batches ready, for this epoch."""
        if self._reader is None:
            return dict(self._final_stats or {})
        stats = self._reader.stats()
        stats["wall_s"] = time.perf_counter() - self._started
        stats["ready_batches"] = self._reader.ready
        stats["num_threads"] = self._reader.num_threads
        return stats

    def close(self) -> None:
        """Stop and join the worker threads; idempotent. The epoch's stats stay readable."""
        if self._reader is not None:
            self._final_stats = self.stats()
            self._final_stats["ready_batches"] = 0
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def __del__(self) -> None:
        self.close()
