"""A loader's first memory touched in the background, before its first pass (issue 26).

A fresh process pays for the first touch of memory (docs/benchmarks.md, "Warming up while the model
is built"): the pages of its batch buffers (zeroed by the kernel; on a virtual machine whose balloon
reports free pages, backed by the host first, up to milliseconds per MB) and the page tables of its
shard mappings (a fault per 64 KiB of a file the page cache holds in small folios). A training
script builds its loader, then its model, optimizer and process group: time in which the cores are
mostly idle. :func:`start_warm_up` uses it. It opens the shards as the first pass would (the pass
reuses that ShardSet: ``open_shards`` shares one per process while the files are unchanged), adds the
first pass's batch buffers to the loader's pool, and starts a native thread (``_native.Warmer``)
that faults the buffers in and maps the shard pages the page cache already holds. The first pass
asks it to stop (it ends after the 2 MiB step in flight, without the pass waiting for it) and finds
what was done ready; its workers do the rest, as they would have. The loader joins the thread when
that pass ends; the thread is also stopped and joined when the loader goes, and at interpreter exit
(``weakref.finalize``). In a child made by ``os.fork()`` the thread does not exist: the warm-up is
neither waited for nor used there.

Policy, here: the native backend over local shards only (a remote cache's shards come and go);
pinned batches get no buffers ahead (torch's caching host allocator owns them), only the mapping;
at most ``MAX_MAPPING_BYTES`` of the shard files are looked at (of a dataset far larger than memory
little is cached, and a first pass reads only part of it); and no mapping at all unless the kernel
says truthfully which pages are cached (:func:`page_cache_visible`), since mapping pages it only
claims are cached would read them from disk.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._augment import Augment
from ._dataset import ShardDataset
from ._native_backend import NativeEpoch, NativeSettings, _native

MAX_MAPPING_BYTES = 8 << 30  # of shard files looked at for cached pages to map


class WarmUp:
    """A running warm-up: the native thread, and the ShardSet the first pass will reuse (kept open meanwhile)."""

    def __init__(self, warmer: Any, shards: Any, buffer: np.ndarray | None, slot_bytes: int) -> None:
        self._warmer = warmer
        self._shards: Any = shards
        self._buffer = buffer  # the slots added to the pool, end to end, in the order they were added
        self._slot_bytes = slot_bytes
        self._pid = os.getpid()
        # Joins the thread when this object goes, or at interpreter exit if it is still alive then.
        self._finalizer = weakref.finalize(self, warmer.stop)

    def forked(self) -> bool:
        """Return whether this is a child made by ``os.fork()`` since (where the thread does not exist)."""
        return os.getpid() != self._pid

    def stop(self, wait: bool = True) -> dict[str, Any]:
        """Stop the thread and return what it did; ``wait=False`` does not join it (the step in flight goes on).

        Idempotent. A pass starting asks without waiting (a 2 MiB step of fresh memory can take milliseconds);
        the loader joins it when that pass ends, and the finalizer joins it when this object goes or at exit.
        """
        self._warmer.stop(wait)
        if wait:
            self._shards = None
        return self.stats()

    def unfaulted(self) -> list[np.ndarray]:
        """Return the slots (or their parts) the thread will not fault in; call it after ``stop``.

        In the order the pool hands them out last (the pool is last in, first out: the slot added last goes
        first), without that last slot, which the first batch's worker is writing by the time a waiting consumer
        could fault it: ``prefault_later`` takes the newest region first, so the consumer then faults the slot
        needed next, ahead of the workers. None in a forked child, whose pool is a new one.
        """
        if self._buffer is None or self.forked():
            return []
        claimed = int(self._warmer.stats()["claimed_bytes"])  # the end of a step in flight, if one is
        size = self._slot_bytes
        starts = range(0, len(self._buffer) - size, size)  # every slot but the last
        return [self._buffer[max(start, claimed):start + size] for start in starts if start + size > claimed]

    def stats(self) -> dict[str, Any]:
        """Return ``prefaulted_bytes``, ``claimed_bytes``, ``mapped_bytes``, ``seconds``, ``done``, ``supported``."""
        return dict(self._warmer.stats())


def page_cache_visible(path: str | os.PathLike) -> bool:
    """Return whether ``mincore`` tells this process which pages of ``path`` the page cache holds.

    Since Linux 5.0 it does only for a file the process owns or may write (or with the privilege to act
    as any owner, root's); for any other file it says every page is cached, and mapping them all would
    read the file from disk.
    """
    if not hasattr(os, "geteuid"):  # Windows: no mincore (the native side maps nothing there anyway)
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    euid = os.geteuid()
    writable = os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    return euid == 0 or st.st_uid == euid or writable


def start_warm_up(shards: Any, dataset: ShardDataset, batch_size: int, settings: NativeSettings, augment: Augment,
                  fingerprints: list[int], shard_paths: Sequence[str]) -> WarmUp:
    """Add the first pass's batch buffers to ``settings.slots``'s pool and start faulting them and ``shards`` in.

    ``shards`` is an eager native ShardSet of the files ``shard_paths``; the other arguments are those the
    first pass's NativeEpoch gets.
    """
    buffer: np.ndarray | None = None
    slot_bytes = 0
    if settings.slots is not None and settings.allocator() is None:  # plain buffers, pooled across passes
        epoch = NativeEpoch(shards, dataset, 0, batch_size, _no_batch, settings, augment, 0, fingerprints)
        try:
            # The window, and the batch the loop holds while the next one is taken (what a pass's pool ends with).
            buffer, slot_bytes = epoch.reserve_slots(settings.prefetch + 1), epoch.slot_bytes
        finally:
            epoch.close()  # the pool, with its new buffers, goes back to settings.slots for the first pass
    mapping = MAX_MAPPING_BYTES if all(page_cache_visible(p) for p in shard_paths) else 0
    return WarmUp(_native.Warmer(buffer, shards, mapping), shards, buffer, slot_bytes)


def _no_batch(batch: int) -> np.ndarray:
    raise AssertionError(f"a warm-up reads no batch (asked for {batch})")
