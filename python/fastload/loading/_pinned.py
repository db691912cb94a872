"""Page-locked batch memory that torch's caching host allocator owns, so queued copies never see it rewritten.

A pinned batch is a set of tensors viewing one ``torch.empty(n, dtype=uint8,
pin_memory=True)`` buffer, allocated afresh for every batch and never
recycled by fastload. Because the views share that buffer's storage, a
``tensor.to("cuda", non_blocking=True)`` on any stream records its stream on
the allocator's block (``copy_`` passes the storage's allocation context to
``CachingHostAllocator_recordEvent``); when the last view is dropped, torch
records an event on each such stream and hands the block out again only after
those events complete. No call is needed from the user, and steady loops
still allocate nothing new: the cache reuses the blocks.

torch rounds each pinned block up to a power of two; ``pinned_block_bytes``
gives the bytes one allocation really holds. When one buffer per field rounds
to fewer bytes than one buffer for the whole batch (a field of a power-of-two
size plus a small label field would otherwise take twice its size), each field
gets its own buffer (``split_layout``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..errors import ArgumentError


class HostAllocator(Protocol):
    """Returns a fresh one-dimensional uint8 CPU tensor of ``nbytes`` for one batch."""

    def __call__(self, nbytes: int) -> torch.Tensor:
        """Allocate ``nbytes`` of batch memory."""


def allocate_pinned(nbytes: int) -> torch.Tensor:
    """Allocate ``nbytes`` of page-locked memory from torch's caching host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def pinned_block_bytes(nbytes: int) -> int:
    """Return the bytes torch's caching host allocator holds for a request of ``nbytes``: the next power of two."""
    return 1 << max(0, nbytes - 1).bit_length() if nbytes > 0 else 0


def split_layout(field_bytes: Sequence[int], slot_bytes: int) -> bool:
    """Return whether one pinned buffer per field holds fewer bytes, after torch's rounding, than one per batch."""
    return sum(pinned_block_bytes(b) for b in field_bytes) < pinned_block_bytes(slot_bytes)


class FieldViews:
    """Builds a batch's tensors as zero-copy views of its buffers (one ``set_`` per field).

    ``offsets`` are byte offsets of each field in its buffer: the reader's
    field offsets for one buffer per batch, zeros for one buffer per field.
    """

    def __init__(self, names: Sequence[str], offsets: Sequence[int], dtypes: Sequence[torch.dtype],
                 shapes: Sequence[Sequence[int]]) -> None:
        self._fields = []
        for name, offset, dtype, shape in zip(names, offsets, dtypes, shapes):
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if offset % itemsize:
                raise ArgumentError(f"field {name!r}: offset {offset} is not a multiple of its item size {itemsize}")
            per_sample = 1
            for dim in shape:
                per_sample *= int(dim)
            strides = []
            step = 1
            for dim in reversed(shape):
                strides.append(step)
                step *= int(dim)
            self._fields.append((name, offset // itemsize, dtype, tuple(int(d) for d in shape), per_sample,
                                 tuple(reversed(strides))))

    def __call__(self, buffers: Sequence[torch.Tensor], count: int) -> dict[str, torch.Tensor]:
        """Return ``{name: tensor[count, *shape]}``, each viewing the storage of its field's buffer."""
        out = {}
        for buffer, (name, offset, dtype, shape, per_sample, strides) in zip(buffers, self._fields):
            out[name] = torch.empty(0, dtype=dtype).set_(buffer.untyped_storage(), offset, (count, *shape),
                                                         (per_sample, *strides))
        return out
