"""Copying batches to a device one batch ahead, on a side stream, with a bounded number of copies in flight.

``DevicePrefetcher`` starts the copy of batch k+1 before it hands batch k
over, so the copy overlaps the training step. The user gets batch k only after
the current stream has been told to wait for its copy (a CUDA event). The
pinned host batch stays referenced until its copy has finished, and at most
``max_copies_in_flight`` copies are queued: with a GPU that lags, the loader
waits for the oldest copy instead of allocating more page-locked memory. The
host batches are views of torch pinned allocations (``_pinned.py``), so torch's
caching host allocator also keeps each block until the copies recorded on it
are done. The CUDA calls sit behind ``TransferOps`` so the logic is tested
without a GPU (``tests/test_device.py``) and on one by ``tests/test_cuda.py``.

Page-locked memory held by a loader with ``device=``: at most ``prefetch``
batches submitted to the workers plus ``max_copies_in_flight`` batches being
copied; blocks freed while later copies were still queued on the side stream
become reusable once those copies finish (fewer than ``max_copies_in_flight``
more: a block is freed only after its own copy finished, when at most
``max_copies_in_flight - 1`` later ones are queued). Each batch is one block of
``pinned_block_bytes(slot bytes)``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from ..errors import ArgumentError

Batch = dict[str, torch.Tensor]


class TransferOps(Protocol):
    """The device operations the transfer needs."""

    def copy(self, batch: Batch) -> tuple[Batch, Any]:
        """Start copying ``batch``; return the device batch and an event marking the copy's end."""

    def hand_over(self, batch: Batch, event: Any) -> None:
        """Make the user's (current) stream wait for ``event`` before it uses ``batch``."""

    def finished(self, event: Any) -> bool:
        """Return whether the copy marked by ``event`` is complete."""

    def wait(self, event: Any) -> None:
        """Block until the copy marked by ``event`` is complete."""

    def elapsed_s(self, event: Any) -> float:
        """Return the device time the completed copy marked by ``event`` took."""


def shared_span(batch: Batch) -> tuple[torch.Tensor, int] | None:
    """Return a uint8 view of the bytes all of ``batch``'s tensors span in their one storage, and its start.

    None when they do not all view one storage contiguously at offsets aligned to their item
    sizes (then each tensor is copied by itself).
    """
    tensors = list(batch.values())
    if not tensors:
        return None
    storage = tensors[0].untyped_storage()
    ptr = storage.data_ptr()
    lo: int | None = None
    hi = 0
    for t in tensors:
        size = t.element_size()
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != ptr:
            return None
        begin = int(t.storage_offset()) * size
        lo = begin if lo is None else min(lo, begin)
        hi = max(hi, begin + t.numel() * size)
    assert lo is not None
    if any((t.storage_offset() * t.element_size() - lo) % t.element_size() for t in tensors):
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, lo, (hi - lo,), (1,)), lo


def rebase(batch: Batch, flat: torch.Tensor, start: int) -> Batch:
    """Return ``batch``'s tensors as views of ``flat``, a copy of the span beginning at byte ``start``."""
    storage = flat.untyped_storage()
    base = flat.storage_offset()
    out = {}
    for name, t in batch.items():
        offset = (base + t.storage_offset() * t.element_size() - start) // t.element_size()
        out[name] = torch.empty(0, dtype=t.dtype, device=flat.device).set_(storage, offset, t.shape, t.stride())
    return out


class CudaOps:
    """TransferOps on a CUDA device with one side stream.

    A batch whose tensors view one pinned buffer (the native backend's) is copied
    with a single ``non_blocking`` copy of the bytes they span, then viewed on
    the device: one host-to-device copy per batch, not one per field.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, batch: Batch) -> tuple[Batch, Any]:
        """Copy on the side stream with ``non_blocking=True``; return events before and after it."""
        with torch.cuda.stream(self.stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            span = shared_span(batch)
            if span is not None:
                out = rebase(batch, span[0].to(self.device, non_blocking=True), span[1])
            else:
                out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
        return out, (start, end)

    def hand_over(self, batch: Batch, event: Any) -> None:
        """Order the current stream after the copy and tell the allocator it uses the tensors."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event[1])
        for tensor in batch.values():
            tensor.record_stream(current)

    def finished(self, event: Any) -> bool:
        """Return whether the copy marked by ``event`` is complete."""
        return bool(event[1].query())

    def wait(self, event: Any) -> None:
        """Block until the copy marked by ``event`` is complete."""
        event[1].synchronize()

    def elapsed_s(self, event: Any) -> float:
        """Return the device time between the copy's start and end events (both complete)."""
        return float(event[0].elapsed_time(event[1])) * 1e-3


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """Return the target device, or None for CPU batches; raise ValueError when CUDA is asked for and absent."""
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ArgumentError(f"device {dev} is not supported; use 'cpu', None or a CUDA device")
    if not torch.cuda.is_available():
        raise ArgumentError(f"device={str(device)!r} needs CUDA, which is not available")
    return dev


class DevicePrefetcher:
    """Yields device copies of ``batches``, one copy ahead, at most ``max_copies_in_flight`` copies queued.

    ``stats()`` adds to the inner iterator's counters ``h2d_s`` (GPU time of
    the copies that completed), ``h2d_bytes``, and ``copy_wait_s`` (time the
    consumer blocked on a copy, because the cap was reached or at close).
    """

    def __init__(self, batches: Iterator[Batch], ops: TransferOps, max_copies_in_flight: int = 2) -> None:
        if max_copies_in_flight < 1:
            raise ArgumentError(f"max_copies_in_flight must be at least 1, not {max_copies_in_flight}")
        self._batches: Iterator[Batch] | None = batches
        self._source = batches  # kept after close for its stats
        self._ops = ops
        self._cap = max_copies_in_flight
        self._in_flight: deque[tuple[Batch, Any]] = deque()  # host batches whose copies may still run
        self._ahead: tuple[Batch, Any] | None = None  # the device batch copied next, and its event
        self._started = False
        self._h2d_s = 0.0
        self._h2d_bytes = 0
        self._copy_wait_s = 0.0

    def __iter__(self) -> DevicePrefetcher:
        return self

    @property
    def copies_in_flight(self) -> int:
        """Return how many host batches are held because their copies may still run."""
        return len(self._in_flight)

    def _retire_oldest(self) -> None:
        host, event = self._in_flight.popleft()
        self._h2d_s += self._ops.elapsed_s(event)
        self._h2d_bytes += sum(t.nbytes for t in host.values())

    def _retire_finished(self) -> None:
        while self._in_flight and self._ops.finished(self._in_flight[0][1]):
            self._retire_oldest()

    def _wait_oldest(self) -> None:
        start = time.perf_counter()
        self._ops.wait(self._in_flight[0][1])
        self._copy_wait_s += time.perf_counter() - start
        self._retire_oldest()

    def _copy_next(self) -> tuple[Batch, Any] | None:
        self._retire_finished()
        while len(self._in_flight) >= self._cap:
            self._wait_oldest()
        host = next(self._batches, None) if self._batches is not None else None
        if host is None:
            return None
        device_batch, event = self._ops.copy(host)
        self._in_flight.append((host, event))
        return device_batch, event

    def __next__(self) -> Batch:
        try:
            if not self._started:
                self._started = True
                self._ahead = self._copy_next()
            current = self._ahead
            if current is None:
                raise StopIteration
            self._ahead = self._copy_next()
            self._ops.hand_over(*current)
            self._retire_finished()
        except BaseException:
            self.close()
            raise
        return current[0]

    def stats(self) -> dict[str, Any]:
        """Return the inner iterator's counters plus the copy counters."""
        inner = getattr(self._source, "stats", None)
        stats: dict[str, Any] = dict(inner()) if callable(inner) else {}
        stats.update({"h2d_s": self._h2d_s, "h2d_bytes": self._h2d_bytes, "copy_wait_s": self._copy_wait_s})
        return stats

    def reset_stats(self) -> None:
        """Zero the copy counters and the inner iterator's."""
        self._h2d_s, self._h2d_bytes, self._copy_wait_s = 0.0, 0, 0.0
        inner = getattr(self._source, "reset_stats", None)
        if callable(inner):
            inner()

    def close(self) -> None:
        """Wait for the copies in flight, release their host batches and close the inner iterator; idempotent."""
        while self._in_flight:
            self._wait_oldest()
        self._ahead = None
        batches, self._batches = self._batches, None
        close = getattr(batches, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: CUDA may be gone already
            pass
