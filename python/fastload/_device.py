"""Copying batches to a device one batch ahead, on a side stream, without unsafe reuse of pinned memory.

``prefetch_to_device`` starts the copy of batch k+1 before it hands batch k
over, so the copy overlaps the training step. The user gets batch k only after
the current stream has been told to wait for its copy (a CUDA event), and the
pinned host batch stays referenced, keeping its pool slot out of reuse, until
that copy has finished. The CUDA calls sit behind ``CudaOps`` so the logic is
tested without a GPU (``tests/test_device.py``) and on one by
``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import torch

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


class CudaOps:
    """TransferOps on a CUDA device with one side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, batch: Batch) -> tuple[Batch, Any]:
        """Copy on the side stream with ``non_blocking=True``; record an event after it."""
        with torch.cuda.stream(self.stream):
            out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def hand_over(self, batch: Batch, event: Any) -> None:
        """Order the current stream after the copy and tell the allocator it uses the tensors."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for tensor in batch.values():
            tensor.record_stream(current)

    def finished(self, event: Any) -> bool:
        """Return whether the copy marked by ``event`` is complete."""
        return bool(event.query())

    def wait(self, event: Any) -> None:
        """Block until the copy marked by ``event`` is complete."""
        event.synchronize()


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """Return the target device, or None for CPU batches; raise ValueError when CUDA is asked for and absent."""
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"device {dev} is not supported; use 'cpu', None or a CUDA device")
    if not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} needs CUDA, which is not available")
    return dev


def prefetch_to_device(batches: Iterator[Batch], ops: TransferOps) -> Iterator[Batch]:
    """Yield device copies of ``batches``, one copy ahead; keep each host batch until its copy is done."""
    in_flight: deque[tuple[Batch, Any]] = deque()  # host batches whose copies may still run
    try:
        host = next(batches, None)
        if host is None:
            return
        device_batch, event = ops.copy(host)
        in_flight.append((host, event))
        while True:
            host = next(batches, None)
            following = None
            if host is not None:
                following = ops.copy(host)
                in_flight.append((host, following[1]))
            ops.hand_over(device_batch, event)
            while in_flight and ops.finished(in_flight[0][1]):
                in_flight.popleft()
            del host
            yield device_batch
            if following is None:
                return
            device_batch, event = following
    finally:
        for _, pending in in_flight:
            ops.wait(pending)
        in_flight.clear()
        close = getattr(batches, "close", None)
        if close is not None:
            close()
