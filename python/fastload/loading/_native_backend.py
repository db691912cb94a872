"""The native backend: one epoch of batches from the C++ worker pool, as torch tensors.

Python decides which samples make each batch (policy); ``fastload._native``
reads, decodes and copies them into batch buffers (bytes). Plain CPU buffers
are pooled: one goes back to the pool when the last tensor viewing it is
dropped. Pinned buffers are not: each batch gets a fresh buffer from torch's
caching host allocator (``_pinned.py``), which alone decides when that memory
may be written again, after every copy queued from it has completed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _extension
from ..errors import FastloadError, RemoteError
from ..format._record import max_sample_bytes, schema_fingerprint
from ._augment import Augment
from ._dataset import ShardDataset, changes_named
from ._pinned import FieldViews, HostAllocator, allocate_pinned, split_layout
from ._remote_shards import RemoteShardSet, is_remote_dataset

_native: Any = _extension.native
NATIVE_IMPORT_ERROR: ImportError | None = _extension.IMPORT_ERROR


FIRST_WINDOW = 2  # batches submitted before the first one is delivered
PLAN_STRETCH = 32  # batches planned into the reader at a time (at least twice the window), when it submits them
_SUBMIT_ATTEMPTS = 20  # a batch whose shards a bounded cache evicts this often between gate and submit: an error


@dataclass(frozen=True)
class NativeSettings:
    """How the native backend reads: threads, batches in flight, pinned buffers."""

    num_threads: int
    prefetch: int
    pin_memory: bool
    verify_checksums: bool = True
    host_allocator: HostAllocator | None = None  # testing only: replaces torch's pinned allocator
    slots: SlotPoolKeeper | None = None  # plain buffers kept from pass to pass (the loader's)
    # The consumer's thread faults fresh batch buffers in while it waits (where a core is idle: fewer
    # threads than cores; measured in docs/benchmarks.md, "Fresh memory").
    prefault_while_waiting: bool = False
    # Pooled slots' memory a warm-up before the first pass did not fault in (``_warm_up.py``), the slot needed
    # soonest last: with prefault_while_waiting, the consumer's thread goes on with it.
    unfaulted: Sequence[np.ndarray] = ()
    # How many threads decode at once (0: all of them); the others wait for a turn (docs/loading.md).
    max_running: int = 0

    def allocator(self) -> HostAllocator | None:
        """Return the allocator of single-use batch buffers, or None for pooled numpy buffers."""
        if self.host_allocator is not None:
            return self.host_allocator
        return allocate_pinned if self.pin_memory else None


class SlotPoolKeeper:
    """Keeps a loader's plain batch buffers (a native SlotPool) from one pass to the next.

    A new pass over the same fields reuses them: it neither allocates nor page-faults
    its buffers again (with tiles, hundreds of MiB per pass). Buffers still viewed by
    batches of an earlier pass return to the pool when those tensors are dropped; the
    pool keeps no more than ``prefetch + 2`` free ones (set by each pass). The pool is
    lent to one pass at a time (``take``, then ``give_back`` when the pass closes): two
    live passes of one loader never share buffers. It is this process's: in a child
    made by ``os.fork()`` a new one is started (the parent's threads may have held its
    lock at the fork).
    """

    def __init__(self) -> None:
        self._pool: Any = None
        self._pid = 0

    def take(self) -> Any:
        """Return the pool kept in this process, or None, and keep nothing until it is given back."""
        pool, self._pool = self.get(), None
        return pool

    def give_back(self, pool: Any, getpid: Callable[[], int] = os.getpid) -> None:  # bound now: runs in __del__
        """Keep ``pool`` for the next pass."""
        self._pool, self._pid = pool, getpid()

    def get(self, getpid: Callable[[], int] = os.getpid) -> Any:
        """Return the pool kept in this process (without taking it), or None."""
        return self._pool if self._pid == getpid() else None


# Open shard sets of this process, shared by every loader over the same unchanged files, so each shard
# is mapped and validated once per process (while some loader uses it).
_open_sets: weakref.WeakValueDictionary[tuple, Any] = weakref.WeakValueDictionary()
_open_lock = threading.Lock()


def _identity(path: str, count: int) -> tuple:
    # The file is (st_dev, st_ino); the path is in the key only so that errors name the path the caller gave.
    # No realpath: its lstat per path component cost about 70 us per shard on the way to a first batch.
    st = os.stat(path)
    return (os.path.abspath(path), count, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def shard_paths(datasets: Sequence[ShardDataset]) -> list[str]:
    """Return the paths of every shard of ``datasets``, in order (one global index space)."""
    return [str(ds.path / s.file) for ds in datasets for s in ds.manifest.shards]


def record_fingerprints(datasets: Sequence[ShardDataset]) -> list[int]:
    """Return what the records of every shard of ``datasets`` carry, in the order of :func:`shard_paths`."""
    return [f for ds in datasets for f in ds.manifest.record_fingerprints()]


def open_shards(datasets: ShardDataset | Sequence[ShardDataset]) -> Any:
    """Map and validate every shard of ``datasets`` in the native core, or reuse this process's open set.

    Several datasets are laid end to end in one shard set: one global index space, as ``fastload.concat``.
    With a remote dataset among them: a :class:`RemoteShardSet` (its shards attached as they download;
    the epoch gates each batch on them).
    """
    if _native is None:
        raise ImportError(f"fastload._native is not available: {NATIVE_IMPORT_ERROR}")
    datasets = [datasets] if isinstance(datasets, ShardDataset) else list(datasets)
    if any(is_remote_dataset(ds) for ds in datasets):  # shards attached as they download
        return RemoteShardSet(datasets)
    paths = shard_paths(datasets)
    counts = [s.count for ds in datasets for s in ds.manifest.shards]
    packed = [ds.manifest.packed for ds in datasets for _ in ds.manifest.shards]
    with changes_named(datasets):  # rewritten in place since it was opened: say so rather than "corrupt"
        try:
            key = tuple(_identity(p, c) for p, c in zip(paths, counts)) + (tuple(packed),)
        except OSError:  # let the native core name the problem
            return _native.ShardSet(paths, counts, packed)
        with _open_lock:
            shards = _open_sets.get(key)
            if shards is None:
                shards = _open_sets[key] = _native.ShardSet(paths, counts, packed)
            return shards


class NativeEpoch:
    """Iterates one epoch: submits up to ``prefetch`` batches ahead and yields them in order.

    With a host allocator (pinned memory) the epoch holds at most ``prefetch``
    buffers itself: those of batches submitted and not yet delivered.
    ``close()`` (also on ``del``, ``break`` and errors) joins every worker thread.

    Lifecycle guards: an epoch belongs to one consumer at a time, which the
    :class:`~fastload.loading._epoch.EpochIterator` driving it enforces (and the
    C++ reader refuses a second consumer too), and to the process that made it:
    in a child made by ``os.fork()`` it raises FastloadError, and
    ``close()``/``del`` abandon the native reader without joining threads that
    do not exist there.
    """

    def __init__(self, shards: Any, dataset: ShardDataset, num_batches: int, batch_size: int,
                 batch_indices: Callable[[int], np.ndarray], settings: NativeSettings,
                 augment: Augment | None = None, epoch: int = 0, fingerprints: Sequence[int] | None = None) -> None:
        assert _native is not None
        if fingerprints is None:  # what each shard's records carry (v3: bound to their dataset and position)
            fingerprints = dataset.manifest.record_fingerprints()
        schema = dataset.manifest.fields
        wanted = {f.name for f in dataset.fields}
        # What the slots hold: each field after the transforms (bfloat16 held as uint16 and viewed).
        if augment is None:
            augment = Augment(dataset, None, "chw", None, None, 0)
        specs = {name: (np_dtype, torch_dtype, shape) for name, np_dtype, torch_dtype, shape in
                 augment.field_specs(dataset)}
        steps, num_params = augment.native_steps(dataset)
        self._augment: Augment = augment
        self._epoch = epoch
        self._bf16 = [name for name, (_np, dt, _s) in specs.items() if dt == torch.bfloat16]
        self._names = [f.name for f in schema if f.name in wanted]
        self._num_batches = num_batches
        self._batch_indices = batch_indices
        self._started = time.perf_counter()
        self._final_stats: dict[str, Any] | None = None
        self._settings = settings
        self._next_submit = 0
        self._delivered = 0
        self._allocator = settings.allocator()
        self._buffers: deque[list[torch.Tensor]] = deque()  # single-use buffers of submitted batches, in order
        self._pid = os.getpid()
        self._reader: Any = None  # set first: __del__ runs even when the constructor below raises
        # Plain buffers: the loader's kept pool is lent to this pass and given back by close().
        self._slots = settings.slots if self._allocator is None else None
        self._pool: Any = self._slots.take() if self._slots is not None else None
        self._gate: RemoteShardSet | None = shards if isinstance(shards, RemoteShardSet) else None
        # Shards all here into plain buffers: the reader submits the batches itself, planned a stretch at a
        # time, so the consumer's thread does no Python work per batch beyond taking it. Pinned buffers (one
        # fresh buffer per batch) and remote shards still downloading or windowed (each batch gated on its
        # shards) are submitted one by one.
        if self._gate is not None and self._allocator is None and self._gate.complete():
            self._gate = None  # a warm cache holding the whole dataset: no gate (the plan pins every shard)
        self._planned = self._gate is None and self._allocator is None
        self._stretch = max(PLAN_STRETCH, 2 * settings.prefetch)
        self._reader = _native.BatchReader(
            shards.native if isinstance(shards, RemoteShardSet) else shards, [f.native_spec for f in schema],
            [specs[f.name][0] if f.name in specs else f.np_dtype for f in schema],
            [list(specs[f.name][2]) if f.name in specs else list(f.shape) for f in schema],
            [f.name in wanted for f in schema], batch_size, settings.num_threads, settings.verify_checksums,
            steps, num_params, max_sample_bytes=max_sample_bytes(),
            record_version=dataset.manifest.format_version, schema_fingerprint=schema_fingerprint(schema),
            shard_fingerprints=list(fingerprints),
            pool=self._pool, max_running=settings.max_running)
        if self._slots is not None:
            self._pool = self._reader.pool  # the lent one, or a new one when its buffers are of another size
            # The window, the batch in use and the one a loop variable still holds: a consumer that once
            # held a whole epoch (list(loader)) does not leave the loader holding as many buffers.
            self._pool.keep_at_most(settings.prefetch + 2)
        # The window bounds the planned batches in flight (the one-by-one path bounds its own, in _submit_ahead);
        # in both, a consumer that has to wait sleeps until three quarters of it are ready.
        self._reader.set_window(settings.prefetch, min(settings.prefetch, FIRST_WINDOW))
        self._reader.prefault_while_waiting = settings.prefault_while_waiting
        if settings.prefault_while_waiting and self._slots is not None:
            for region in settings.unfaulted:  # the reader takes the newest region first
                self._reader.prefault_later(region)
        self._views: FieldViews | None = None
        self._split = False
        self._plain_until = 0  # __next__ takes its few steps until this many batches are delivered
        if self._allocator is not None:
            decoded = [f for f in schema if f.name in wanted]
            sizes = [b for f, b in zip(schema, self._reader.field_bytes) if f.name in wanted]
            self._split = split_layout(sizes, self._reader.slot_bytes)
            offsets = [0] * len(decoded) if self._split else self._reader.field_offsets
            self._views = FieldViews(self._names, offsets, [specs[f.name][1] for f in decoded],
                                     [specs[f.name][2] for f in decoded])
            self._wanted = [f.name in wanted for f in schema]

    def _submit_ahead(self) -> None:
        reader = self._reader
        # Until the first batch is out only two go in: the first batch does not wait for the others'
        # buffers and submissions; the rest of the window fills on the next call.
        window = self._settings.prefetch if self._delivered else min(self._settings.prefetch, FIRST_WINDOW)
        while self._next_submit < self._num_batches and self._next_submit - self._delivered < window:
            indices = self._batch_indices(self._next_submit)
            if self._gate is not None:
                self._gate.at(self._next_submit)
                if not self._gate.ready(indices):
                    if self._next_submit > self._delivered:
                        break  # its shards are downloading: deliver the batches in flight meanwhile
                    self._gate.wait(indices)
            if self._allocator is not None:
                self._buffers.append(self._new_buffers())
            elif reader.free_slots == 0:
                reader.add_slot(np.empty(reader.slot_bytes, dtype=np.uint8))
            params = self._augment.params(self._epoch, indices)
            for _ in range(_SUBMIT_ATTEMPTS):
                if reader.submit(indices, params):
                    break
                assert self._gate is not None  # only a lazy set refuses: a shard was evicted since the gate
                self._gate.wait(indices)
            else:
                raise RemoteError(f"batch {self._next_submit}: its shards were evicted {_SUBMIT_ATTEMPTS} times "
                                  "before it could be read; raise cache_limit")
            self._next_submit += 1

    def _fast_path_until(self) -> int:
        """Return how many batches may be delivered by ``__next__``'s few steps: until the next plan is due.

        0 (never) for pinned buffers (each batch its own), batches submitted one by one, or a field viewed as bfloat16.
        """
        if not self._planned or self._views is not None or self._bf16:
            return 0
        if self._next_submit < self._num_batches:  # the next stretch goes in once the window is down to prefetch
            return max(0, self._next_submit - self._settings.prefetch)
        return self._num_batches

    def _plan_ahead(self) -> None:
        """Plan the rest of the epoch into the reader, or its next stretch of batches.

        The rest at once where the reader can work out the positions itself (an epoch permutation or the
        identity, no transform parameters); else the next stretch, indices and transform parameters computed here.
        """
        first = self._next_submit
        rank_plan = getattr(self._batch_indices, "rank_plan", None)
        plan = rank_plan() if rank_plan is not None and not self._augment.transforms else None
        if plan is not None:  # the rest of the epoch at once: the reader works out each batch's positions
            permutation = getattr(self._batch_indices, "permutation", None)
            self._reader.plan_positions(plan, first, self._num_batches, permutation)
            self._next_submit = self._num_batches
            return
        stop = min(first + self._stretch, self._num_batches)
        span = getattr(self._batch_indices, "span", None)
        permutation = getattr(self._batch_indices, "permutation", None)
        params = None
        if span is not None and permutation is not None and not self._augment.transforms:
            # Positions of the epoch permutation: the workers map them (no per-sample parameters need the indices).
            values, sizes = span(first, stop, positions=True)
        else:
            permutation = None
            if span is not None:
                values, sizes = span(first, stop)
            else:
                parts = [np.asarray(self._batch_indices(b), dtype=np.uint64) for b in range(first, stop)]
                values, sizes = np.concatenate(parts), [len(p) for p in parts]
            params = self._augment.params(self._epoch, values)
        self._reader.plan(values, sizes, params, permutation)
        self._next_submit = stop

    @property
    def slot_bytes(self) -> int:
        """Return the size of one batch buffer (every decoded field of a batch, aligned)."""
        return int(self._reader.slot_bytes)

    def reserve_slots(self, count: int) -> np.ndarray | None:
        """Add fresh plain batch buffers until the pool holds ``count``; return their memory, or None if it did.

        For a warm-up before the first pass (``_warm_up.py``): the buffers stay in the pool when this epoch closes.
        """
        return self._reader.reserve_slots(count)

    def _new_buffers(self) -> list[torch.Tensor]:
        """Allocate one batch's single-use buffers and add them to the reader; one per decoded field if split."""
        assert self._allocator is not None
        reader = self._reader
        if not self._split:
            buffer = self._allocator(reader.slot_bytes)
            reader.add_slot(buffer.numpy(), reusable=False)
            return [buffer] * len(self._names)
        per_field = [self._allocator(n) if w else None for n, w in zip(reader.field_bytes, self._wanted)]
        reader.add_split_slot([b.numpy() if b is not None else None for b in per_field], reusable=False)
        return [b for b in per_field if b is not None]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def _forked(self, getpid: Callable[[], int] = os.getpid) -> bool:  # bound now: __del__ may run at shutdown
        return getpid() != self._pid

    def _is_finalizing(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> bool:  # bound now, as _forked
        return finalizing()

    def _wall_s(self, clock: Callable[[], float] = time.perf_counter) -> float:  # bound now, as _forked
        return clock() - self._started

    def __next__(self, from_numpy: Callable[[np.ndarray], torch.Tensor] = torch.from_numpy) -> dict[str, torch.Tensor]:
        # The common case in few steps (issue 26: the consumer's time per batch): planned batches into plain
        # buffers, no plan due, no field viewed as another dtype. The native reader refuses a forked child itself.
        reader = self._reader
        if reader is None or self._delivered >= self._plain_until:
            return self._next_batch()
        try:
            arrays = reader.next()
        except BaseException:
            self.close()
            if self._forked():  # the reader's own words name the reader; these name what the user holds
                raise self._fork_error() from None
            raise
        self._delivered += 1
        return dict(zip(self._names, map(from_numpy, arrays)))

    def _fork_error(self) -> FastloadError:
        return FastloadError(f"this loader iterator was created in process {self._pid} and inherited through "
                             "os.fork(); its threads do not exist here: iterate a new ShardLoader in the child")

    def _next_batch(self) -> dict[str, torch.Tensor]:
        if self._forked():
            raise self._fork_error()
        if self._reader is None or self._delivered >= self._num_batches:
            self.close()
            raise StopIteration
        try:
            if not self._planned:
                self._submit_ahead()
            elif self._next_submit - self._delivered <= self._settings.prefetch and \
                    self._next_submit < self._num_batches:
                self._plan_ahead()  # the next stretch goes in while the window still holds batches
            if self._views is not None:
                count = self._reader.next_count()
                batch = self._views(self._buffers.popleft(), count)
            else:
                batch = dict(zip(self._names, map(torch.from_numpy, self._reader.next())))
                for name in self._bf16:
                    batch[name] = batch[name].view(torch.bfloat16)
            self._delivered += 1
            if self._delivered > 1 and not self._planned:  # the first batch goes out now; the window fills next
                self._submit_ahead()
            self._plain_until = self._fast_path_until()
        except BaseException:
            self.close()
            raise
        return batch

    @property
    def pool_slots(self) -> int:
        """Return how many batch buffers the pool has allocated so far."""
        return 0 if self._reader is None else self._reader.total_slots

    @property
    def buffers_held(self) -> int:
        """Return how many single-use (pinned) buffers this epoch holds for batches not yet delivered."""
        return len(self._buffers)

    def stats(self) -> dict[str, Any]:
        """Return the native reader's counters, plus wall time and batches ready, for this epoch."""
        if self._reader is None or self._forked():
            return dict(self._final_stats or {})
        stats = self._reader.stats()
        stats["wall_s"] = self._wall_s()
        stats["ready_batches"] = self._reader.ready
        stats["num_threads"] = self._reader.num_threads
        return stats

    def reset_stats(self) -> None:
        """Zero the native reader's counters."""
        if self._reader is not None:
            self._reader.reset_stats()

    def close(self) -> None:
        """Stop and join the worker threads; idempotent. The epoch's stats stay readable."""
        if self._forked():  # the native reader abandons itself: nothing to join in this process
            reader, self._reader = self._reader, None
            if reader is not None:
                reader.close()
            return
        try:
            if self._reader is not None:
                self._final_stats = self.stats()
                self._final_stats["ready_batches"] = 0
        finally:  # the threads are joined even if the counters cannot be read
            reader, self._reader = self._reader, None
            if reader is not None:
                reader.close()
                gate = getattr(self, "_gate", None)
                if gate is not None and not self._is_finalizing():  # no batch in flight: other processes may evict
                    gate.let_go()
            self._buffers.clear()
            pool, self._pool = getattr(self, "_pool", None), None
            slots = getattr(self, "_slots", None)
            if pool is not None and slots is not None:  # threads joined: the next pass may take it
                slots.give_back(pool)

    def __del__(self) -> None:
        self.close()
