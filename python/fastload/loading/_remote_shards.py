"""Reading datasets in object storage while their shards download: fetching in the order of the epoch.

Policy only, in Python: which shards this rank's epoch needs and in which order
(``shard_need_order``), handed to each remote dataset's fetcher (``fetch_ahead``); and for the
native backend a :class:`RemoteShardSet`, a lazy native shard set whose shards are attached as
their downloads complete, with the gate the native epoch passes before it submits a batch (every
shard the batch reads attached). The bytes (downloads, validation, reads) are the storage layer's
and the C++ core's.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._extension import require as native_core
from ..errors import ArgumentError, RemoteError
from ..storage import NeedPlan
from ..storage._heal import advised, heal_shard, is_damage, names_file
from ._dataset import ShardDataset


def is_remote_dataset(dataset: ShardDataset) -> bool:
    """Return whether ``dataset`` reads a version of a remote dataset through the cache."""
    return getattr(dataset, "_cached", None) is not None


def shard_starts(datasets: Sequence[ShardDataset]) -> np.ndarray:
    """Return the first global index of every shard of ``datasets`` laid end to end, plus the total (int64)."""
    counts = [s.count for ds in datasets for s in ds.manifest.shards]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def shard_need_order(starts: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Return the shards that ``indices`` read, in the order each is first read (int64)."""
    return first_reads(starts, indices)[0]


def first_reads(starts: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the shards that ``indices`` read in the order each is first read, and where in ``indices`` (int64)."""
    if len(indices) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    shards = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
    unique, first = np.unique(shards, return_index=True)
    by_first = np.argsort(first, kind="stable")
    return unique[by_first], first[by_first].astype(np.int64)


def shards_missing(datasets: Sequence[ShardDataset]) -> bool:
    """Return whether a remote dataset among ``datasets`` lacks shards in the cache, or is windowed.

    A pass then fetches ahead (a windowed dataset's by the pass's plan).
    """
    return any(is_remote_dataset(ds) and (ds._cached.fetcher.windowed  # type: ignore[union-attr]
                                          or ds._cached.fetcher.missing() > 0)  # type: ignore[union-attr]
               for ds in datasets)


def fetch_ahead(datasets: Sequence[ShardDataset], indices: np.ndarray, batch_size: int,
                batch_sizes: Sequence[int] | None = None, lead: int = 0) -> None:
    """Have each remote dataset fetch the shards ``indices`` read (global over ``datasets``), first needed first.

    The shards of the first batch (``indices[:batch_size]``) get the link to themselves until one
    of them is whole (``ShardFetcher.want``'s ``first``). Each fetcher learns the batch that first
    reads each shard, so it downloads no further ahead of the reader's position than its
    ``predownload`` bound (``lead``: batches past the position told that may be read already).
    A windowed dataset's fetcher also gets the plan (which batch reads which shard) it evicts by; a
    batch whose shards alone do not fit its window is a RemoteError now, before the pass.
    ``batch_sizes``: the size of each batch when they differ (a group's share of a concat's
    batches), else every batch holds ``batch_size``.
    """
    if not any(is_remote_dataset(ds) for ds in datasets):
        return
    starts = shard_starts(datasets)
    shard_of = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
    if batch_sizes is None:
        batch_of = np.arange(len(shard_of), dtype=np.int64) // max(1, int(batch_size))
    else:
        batch_of = np.repeat(np.arange(len(batch_sizes), dtype=np.int64), np.asarray(batch_sizes, dtype=np.int64))
    offset = 0
    for ds in datasets:
        count = len(ds.manifest.shards)
        if is_remote_dataset(ds) and ds._cached.fetcher.windowed:  # type: ignore[union-attr]
            local = np.where((shard_of >= offset) & (shard_of < offset + count), shard_of - offset, -1)
            plan = NeedPlan(local, batch_of, count)
            check_batches_fit(ds, plan)
            ds._cached.fetcher.plan(plan)  # type: ignore[union-attr]
        offset += count
    order, where = first_reads(starts, indices)
    needs = batch_of[where]  # the batch that first reads each shard of the order
    first_batch = batch_size if batch_sizes is None else (int(batch_sizes[0]) if len(batch_sizes) else 0)
    urgent = set(shard_need_order(starts, indices[:first_batch]).tolist())
    offset = 0
    for ds in datasets:
        count = len(ds.manifest.shards)
        if is_remote_dataset(ds):
            in_ds = (order >= offset) & (order < offset + count)
            first = sum(1 for s in range(offset, offset + count) if s in urgent)
            ds._cached.fetcher.want((order[in_ds] - offset).tolist(), first,  # type: ignore[union-attr]
                                    needs[in_ds].tolist(), lead)
        offset += count


def check_cache_fits(datasets: Sequence[ShardDataset], shuffle: bool, sampling: Any) -> None:
    """Claim, at construction, the room the order needs in each windowed remote dataset; refuse one that cannot fit.

    A windowed dataset (larger than the room ``cache_limit`` leaves it) holds a window of shards at a
    time: ``shuffle_window=K`` needs room for ``2 K`` shards (a window read while the next one
    downloads), ``shuffle=False`` for 2; a global shuffle, weights, ``indices=`` or a mixture read
    every shard all epoch long and need the whole dataset. The need is claimed in the cache
    (``storage/_room.py``: the window holds what its readers claimed, not all the room there is), so
    other datasets and processes get the rest. An order that could not fit even with no other
    dataset in use is an ArgumentError naming what fits; one that fits but finds the room held by
    datasets in use waits for them (bounded), then a RemoteError names them.
    """
    for ds in datasets:
        cached = ds._cached if is_remote_dataset(ds) else None
        if cached is None or cached.window is None:
            continue
        room = cached.room_for_shards()
        if room is None:
            continue
        full = sum(s.bytes for s in ds.manifest.shards)
        largest = max(s.bytes for s in ds.manifest.shards)
        fits = room // (2 * largest)
        short = (f"{ds.url}: its {full} bytes of shards do not fit the {room} bytes cache_limit leaves it, so it is "
                 f"read a window of shards at a time")
        if sampling.mode == "shard_window":
            need = 2 * sampling.window * largest
            if need > room:
                raise ArgumentError(f"{short}: shuffle_window={sampling.window} needs room for "
                                    f"{2 * sampling.window} shards of up to {largest} bytes (a window read while the "
                                    f"next one downloads); "
                                    + (f"shuffle_window={fits} fits, or raise cache_limit" if fits else
                                       "raise cache_limit"))
        elif sampling.mode != "plain" or shuffle:
            what = "shuffle=True" if sampling.mode == "plain" else f"{sampling.mode} sampling"
            hint = (f"shuffle=True, shuffle_window={fits} (a shard-aware shuffle, docs/sampling.md) fits" if fits else
                    "no shuffle_window fits either")
            raise ArgumentError(f"{short}: {what} reads every shard all epoch long and needs the whole dataset in "
                                f"the cache; {hint}, or raise cache_limit to {full} bytes at least")
        else:
            need = 2 * largest
            if need > room:
                raise ArgumentError(f"{short}: reading it in order needs room for 2 shards of up to {largest} bytes; "
                                    "raise cache_limit")
        cached.claim(need)


def remote_fetchers(datasets: Sequence[ShardDataset]) -> list[Any]:
    """Return the fetchers of the remote datasets among ``datasets`` (their downloads and eviction follow the pass)."""
    return [ds._cached.fetcher for ds in datasets if is_remote_dataset(ds)]  # type: ignore[union-attr]


def follow_pass(batches: Iterator[Any], fetchers: Sequence[Any]) -> Iterator[Any]:
    """Yield ``batches``, telling ``fetchers`` the position of the pass before each batch is asked for.

    The torch backend's: batch ``p`` is read (in this process, or by a worker ahead of it) while the
    pass is at ``p`` or before, so no shard a batch not yet delivered reads is evicted as done, and
    a worker holds the shard it reads. Downloads run ahead of ``p`` by the workers' lead
    (``fetch_ahead``'s ``lead``) plus the ``predownload`` bound.
    """
    position = 0
    while True:
        for fetcher in fetchers:
            fetcher.at(position)
        try:
            batch = next(batches)
        except StopIteration:
            return
        yield batch
        position += 1


class RemoteShardSet:
    """A native shard set over datasets some of which are remote: shards attached as their downloads complete.

    ``native`` is the lazy ``_native.ShardSet`` the reader reads; local datasets' shards are attached
    at once (opened and validated now, as an eager set would), remote ones by their fetcher's
    download threads. ``ready``/``wait`` gate a batch's submission on its shards.

    A windowed remote dataset (larger than its room in the cache, ``storage/_window.py``): each
    shard is attached under a hold (its readers lock) and detached again when its fetcher makes
    room, unless a batch in flight reads it (the native set refuses then); ``at`` tells the
    fetchers which batch comes next, so they evict what the epoch needs latest.
    """

    def __init__(self, datasets: Sequence[ShardDataset]) -> None:
        self.datasets = list(datasets)
        self.starts = shard_starts(self.datasets)
        packed = [ds.manifest.packed for ds in self.datasets for _ in ds.manifest.shards]  # v4: blocks of records
        self.native = native_core().ShardSet.lazy([int(c) for c in np.diff(self.starts)], packed)
        self._parts: list[tuple[int, Any]] = []  # per shard: (index in its dataset, its fetcher or None)
        self._sizes = np.array([s.bytes for ds in self.datasets for s in ds.manifest.shards], dtype=np.int64)
        self._firsts: list[int] = []  # per shard: the first shard of its dataset (which dataset it is)
        self._claims: list[Any] = []  # per shard: its dataset's claimed bytes, as a callable (None: no claim)
        self._all_attached = False
        self._holds: dict[int, Any] = {}  # windowed shards attached: their readers locks
        self._attaching = threading.Lock()  # attach (with its hold) and detach (with its release) one at a time
        first = 0
        me = weakref.ref(self)
        for ds in self.datasets:
            count = len(ds.manifest.shards)
            self._firsts += [first] * count
            self._claims += [functools.partial(_claimed, ds)] * count
            if is_remote_dataset(ds):
                fetcher = ds._cached.fetcher  # type: ignore[union-attr]
                self._parts += [(i, fetcher) for i in range(len(ds.manifest.shards))]
                fetcher.on_fetched(self, functools.partial(_attach, me, first))
                fetcher.on_release(self, functools.partial(_release, me, first))
            else:
                for i, shard in enumerate(ds.manifest.shards):
                    self.native.attach(first + i, str(ds.path / shard.file))
                    self._parts.append((i, None))
            first += len(ds.manifest.shards)
        self._fetchers = list({id(f): f for _, f in self._parts if f is not None}.values())

    def want(self, indices: np.ndarray, batch_size: int, batch_sizes: Sequence[int] | None = None) -> None:
        """Fetch the shards ``indices`` read, in the order of first need (the rank's epoch, in batches)."""
        fetch_ahead(self.datasets, indices, batch_size, batch_sizes)

    def at(self, position: int) -> None:
        """Say batch ``position`` of the pass is submitted next (windowed datasets evict what comes later).

        Shards of windowed datasets that no batch from here on reads are let go of now (detached once
        no batch in flight reads them): a process holds only what it still needs, so processes sharing
        the cache never wait on each other's finished shards.
        """
        for fetcher in self._fetchers:
            fetcher.at(position)
        released = False
        for s in list(self._holds):
            local, fetcher = self._parts[s]
            if fetcher.next_need(local) == math.inf:
                released = self.release(s) or released
        if released:  # downloads waiting for room try again now
            for fetcher in self._fetchers:
                fetcher.wake()

    def complete(self) -> bool:
        """Return whether every shard is attached for good: all whole in the cache, no dataset windowed.

        Nothing is detached then (only a windowed dataset's shards are), so the pass's batches need no
        gate: the native reader may plan them ahead (it keeps every shard attached until they are out).
        """
        if any(f.windowed for f in self._fetchers):
            return False
        if self._all_attached:
            return True
        for s in range(len(self._parts)):
            if not self.native.attached(s):
                local, fetcher = self._parts[s]
                if not (fetcher.ready([local]) and self.attach(s)):  # whole, its listener not run for this set
                    return False
        self._all_attached = True
        return True

    def _missing(self, indices: np.ndarray) -> list[int]:
        if self._all_attached:
            return []
        shards = np.unique(np.searchsorted(self.starts, np.asarray(indices, dtype=np.int64), side="right") - 1)
        missing = [int(s) for s in shards if not self.native.attached(int(s))]
        if not missing and all(self.native.attached(s) for s in range(len(self._parts))):
            self._all_attached = True
        return missing

    def ready(self, indices: np.ndarray) -> bool:
        """Return whether every shard ``indices`` read is attached; raise a failed download's error."""
        ready = True
        for s in self._missing(indices):
            local, fetcher = self._parts[s]
            # whole, its listener not run for this set (or it was detached since): attach it here
            if not (fetcher.ready([local]) and self.attach(s)):  # (ready raises the download's error)
                ready = False
        return ready

    def wait(self, indices: np.ndarray) -> None:
        """Return once every shard ``indices`` read is attached, fetching it first; raise a download's error."""
        missing = self._missing(indices)
        if missing:  # the batch a reader waits for: what it does not read is let go of (unless in flight)
            reads = set(np.unique(np.searchsorted(self.starts, np.asarray(indices, dtype=np.int64),
                                                  side="right") - 1).tolist())
            for s in list(self._holds):
                if s not in reads:
                    self.release(s)
        for s in missing:
            local, fetcher = self._parts[s]
            for _ in range(_ATTACH_ATTEMPTS):
                fetcher.ensure(local)
                if self.attach(s, beyond_claim=True):  # False: evicted between the two (another process made room)
                    break
            else:
                raise RemoteError(f"{fetcher.path(local)}: evicted {_ATTACH_ATTEMPTS} times before it could be "
                                  "read; the cache is too small for the processes sharing it (raise cache_limit)")

    def attach(self, s: int, beyond_claim: bool = False) -> bool:
        """Attach shard ``s`` if its file is whole (held first, when windowed); return whether it is attached.

        A windowed dataset's shards are held (pinned against every process's eviction) only up to the
        room this process's loader claimed (``check_cache_fits``), unless ``beyond_claim`` (the batch a
        reader waits for with none in flight). The claims of the processes sharing the version add up
        to its window, so each one always finds room for its next batch, whatever the others hold: a
        rank that reads ahead (batches in flight stay pinned until delivered) while its consumer waits
        for a slower rank in a collective never holds the room the slower rank needs.
        """
        if self.native.attached(s):
            return True
        local, fetcher = self._parts[s]
        with self._attaching:
            if self.native.attached(s):
                return True
            if fetcher.windowed:
                if not beyond_claim and self._over_claim(s):
                    return False
                hold = fetcher.hold(local)
                if hold is None:  # evicted meanwhile
                    return False
                old = self._holds.pop(s, None)
                self._holds[s] = hold
                if old is not None:
                    old.release()
            self.native.attach(s, str(fetcher.path(local)))
        return True

    def _over_claim(self, s: int) -> bool:  # with self._attaching held
        """Return whether holding shard ``s`` too would hold more of its dataset than this process claimed."""
        claimed = self._claims[s]()
        if claimed is None:
            return False
        first = self._firsts[s]
        held = sum(int(self._sizes[h]) for h in self._holds if self._firsts[h] == first)
        return held + int(self._sizes[s]) > claimed

    def let_go(self) -> None:
        """Detach every windowed shard this set holds (a pass ended: none is read until the next one)."""
        for s in list(self._holds):
            self.release(s)

    def release(self, s: int) -> bool:
        """Detach shard ``s`` and drop its hold, unless a batch in flight reads it (False)."""
        with self._attaching:
            if not self.native.detach(s):
                return False
            self._all_attached = False
            hold = self._holds.pop(s, None)
        if hold is not None:
            hold.release()
        return True

    def forget(self, dataset: ShardDataset, index: int) -> bool:
        """Detach shard ``index`` of ``dataset`` to drop its mapping; False while a batch in flight reads it.

        Before its cached file is replaced (a damaged copy healed): it is attached again, from the new
        file, when a batch reads it (or its download completes). True also when ``dataset`` is not one
        of this set's (nothing of it is mapped here).
        """
        first = 0
        for ds in self.datasets:
            if ds is dataset:
                return self.release(first + index)
            first += len(ds.manifest.shards)
        return True


_ATTACH_ATTEMPTS = 20


def heal_damaged_shard(datasets: Sequence[ShardDataset], shard_sets: Sequence[Any], error: Exception,
                       healed: set[Any]) -> bool:
    """Heal the cached shard of a remote dataset among ``datasets`` that ``error`` names; return whether to go on.

    ``error``: a CorruptRecordError or CorruptShardError the native reader raised. False when it names
    no remote dataset's cached shard (a local dataset's file, another error): it stands as it is. The
    shard is detached from the :class:`RemoteShardSet` sets among ``shard_sets`` (its mapping dropped),
    then healed (``storage/_heal.py``: downloaded again when its copy no longer matches its manifest),
    and the read may go on: it reads the shard afresh. ``healed``: the shards healed before in this pass;
    one of them damaged again raises ``error`` with what to do in its message (as does a failed download).
    """
    if not is_damage(error):
        return False
    named = Path(getattr(error, "path", ""))
    for n, ds in enumerate(datasets):
        if not is_remote_dataset(ds) or not names_file(error, ds.path / named.name):
            continue
        index = next((i for i, s in enumerate(ds.manifest.shards) if s.file == named.name), None)
        if index is None:
            continue
        shard = ds.manifest.shards[index]
        assert ds.url is not None
        if (n, index) in healed:
            raise advised(error, ds.url, shard) from None
        healed.add((n, index))
        for shard_set in shard_sets:
            if isinstance(shard_set, RemoteShardSet) and not shard_set.forget(ds, index):
                raise advised(error, ds.url, shard, "its cached copy is still mapped for a batch in flight, so it "
                                                    "was not replaced") from None
        heal_shard(ds._cached.fetcher, index, shard, error, ds.url)  # type: ignore[union-attr]
        return True
    return False


def check_batches_fit(dataset: ShardDataset, plan: NeedPlan) -> None:
    """Raise RemoteError when one batch of ``plan`` reads more bytes of shards than the windowed dataset's room."""
    window = dataset._cached.window  # type: ignore[union-attr]
    if window is None:
        return
    window -= (dataset.path / "manifest.json").stat().st_size  # the room for shards
    sizes = np.array([s.bytes for s in dataset.manifest.shards], dtype=np.int64)
    shards, batches = plan.pairs()
    if len(batches) == 0:
        return
    per_batch = np.bincount(batches, weights=sizes[shards].astype(np.float64))
    worst = int(np.argmax(per_batch))
    if per_batch[worst] > window:
        raise RemoteError(f"{dataset.url}: batch {worst} of this pass reads {int(per_batch[worst])} bytes of shards, "
                          f"more than the {window} bytes cache_limit leaves this dataset; raise cache_limit, or read "
                          "with shuffle_window= (fewer shards per batch)")


def _attach(owner: weakref.ref[RemoteShardSet], first: int, index: int, path: Path) -> None:
    """Attach shard ``index`` of a dataset whose shards start at ``first`` (nothing once the set is gone).

    A windowed dataset's shard is attached (and held) only when a batch about to be submitted reads
    it (``ready``/``wait``): a shard fetched ahead stays free for other processes to evict meanwhile.
    """
    shard_set = owner()
    if shard_set is not None and not shard_set._parts[first + index][1].windowed:
        shard_set.attach(first + index)


def _claimed(dataset: ShardDataset) -> int | None:
    """Return the bytes of shards this process's loader claimed in remote ``dataset`` (None: no claim)."""
    cached = getattr(dataset, "_cached", None)
    return None if cached is None else cached.claimed


def _release(owner: weakref.ref[RemoteShardSet], first: int, index: int) -> bool:
    """Let go of shard ``index`` of a dataset whose shards start at ``first`` (True once the set is gone)."""
    shard_set = owner()
    return True if shard_set is None else shard_set.release(first + index)
