"""Fetching a remote dataset's shards while it is read: on demand, and ahead of need in the plan's order.

A :class:`ShardFetcher` belongs to one opened remote dataset (one cached version) in one process. The
loader tells it which shards the epoch will need, in order of first need for this rank
(:meth:`ShardFetcher.want`); a few download threads fetch them in that order, several at once, and a
reader that needs a shard now (:meth:`ShardFetcher.ensure`) moves it to the front and waits for it.
Policy (which shard next) is this module's; the bytes go through ``fetch_shard`` (checked against the
manifest, written atomically) under a per-shard file lock, so processes sharing the cache (ranks,
DataLoader workers) never download one shard twice and never see a torn file.

How many download at once is measured, not fixed (``storage/_concurrency.py``): downloads that share
one bottleneck end together, so only as many run as raise the aggregate rate, and the shards arrive
in the order the reader needs them.

Errors: a shard that cannot be fetched is a RemoteError naming its URL, raised in whoever waits for
it; a wait is bounded (the retry budget, ``retry_timeout_s``, and ``timeout`` bound every download;
a reader's wait has no shorter bound of its own, so an outage within the budget is ridden out). A closed fetcher
stops its threads at their next chunk and renames nothing from then on.

A windowed version (larger than its room in the cache, ``storage/_window.py``): before each download
room is made by evicting shards, the one needed latest by the plan (:meth:`ShardFetcher.plan`, and
the position the reader reached, :meth:`ShardFetcher.at`) first; readers hold the shards they read
(:meth:`ShardFetcher.hold`) and let go of them when asked (:meth:`ShardFetcher.on_release`). A
download with no room yet waits for the epoch to move on; one a reader waits for that finds no room
for ``ROOM_WAIT_S`` plus the retry budget (``retry_timeout_s``: downloads retrying through an outage
hold their room meanwhile) is a RemoteError naming ``cache_limit``.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError, RemoteError
from ..format._manifest import ShardInfo
from ._cache import DownloadStopped, NoRoom, fetch_shard, hold_shard, is_whole, shard_lock, window_bytes
from ._client import RemoteRoot
from ._concurrency import DownloadConcurrency
from ._locks import FileLock
from ._room import ROOM_WAIT_S  # the cache's one wait for room: here beyond the retry budget (downloads in

# flight hold their room while they retry through an outage)
from ._urls import redact
from ._window import NeedPlan, reserve_room

DOWNLOAD_THREADS = 8  # concurrent shard downloads (obstore releases the GIL)
_WAIT_SLICE_S = 0.1  # a waiting thread wakes this often (Ctrl-C is handled between slices)
_ROOM_RETRY_S = 0.05  # a download with no room tries again this often (or when a reader lets go of shards)
_AHEAD_WAIT_S = 1.0  # a download waiting for the reader to move on looks again this often (at() wakes it first)


class ShardFetcher:
    """The shards of one cached remote version: which are here, which to fetch next, and waiting for one."""

    def __init__(self, root: RemoteRoot, version: Path, shards: list[ShardInfo],
                 threads: int = DOWNLOAD_THREADS, ahead: int | None = None,
                 concurrency: DownloadConcurrency | None = None) -> None:
        """``ahead``: at most this many shards are downloaded ahead of the reader (``want``'s bound); None: no bound.

        ``concurrency``: how many download at once (default: measured, up to ``threads``).
        """
        self._root, self._version, self._shards = root, version, shards
        self._threads_wanted = max(1, threads)
        self._ahead = ahead
        self._first_need: np.ndarray | None = None  # per shard: the batch of the pass that first reads it (inf: none)
        self._needs_sorted = np.zeros(0)  # the finite first needs, sorted (how many shards are read before a batch)
        self._lead = 0  # batches past the reported position that may be read already (the torch backend's workers)
        self._cond = threading.Condition()
        self._done = [is_whole(version / s.file, s.bytes) for s in shards]
        self._sizes = np.array([s.bytes for s in shards], dtype=np.int64)
        self._errors: dict[int, BaseException] = {}
        self._running: set[int] = set()
        self._queue: list[int] = []  # shards to fetch, first needed first
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        # (owner, callback): a callback is dropped once its owner (a weak reference) is gone
        self._listeners: list[tuple[weakref.ref[Any], Callable[[int, Path], None]]] = []
        self._concurrency = concurrency or DownloadConcurrency(self._threads_wanted)  # how many download at once
        self._received = 0  # bytes received by this fetcher's downloads (the rate _concurrency measures)
        self._plan: NeedPlan | None = None  # when this process's epoch reads each shard (windowed versions)
        self._position = 0  # the next batch the reader submits, in the plan's batches
        self._releasers: list[tuple[weakref.ref[Any], Callable[[int], bool]]] = []
        self._waited: set[int] = set()  # shards a reader waits for in ensure()
        self._no_room_since: dict[int, float] = {}
        self._room_waiters = 0  # download threads waiting for room (at() and wake() wake them)
        self._ahead_waiters = 0  # download threads waiting for the reader to move on (at() wakes them)
        self._pid = os.getpid()
        _LIVE.add(self)

    def __len__(self) -> int:
        return len(self._shards)

    def size(self, index: int) -> int:
        """Return shard ``index``'s size in bytes (the manifest's)."""
        return int(self._shards[index].bytes)

    def path(self, index: int) -> Path:
        """Return where shard ``index`` lies in the cache (whole or not yet)."""
        return self._version / self._shards[index].file

    def missing(self) -> int:
        """Return how many shards are not in the cache yet."""
        with self._cond:
            return self._done.count(False)

    def on_fetched(self, owner: object, listener: Callable[[int, Path], None]) -> None:
        """Call ``listener(index, path)`` for every shard as it becomes whole (at once for those already here).

        It runs on the download thread (or this one), must not block for long, and an exception it
        raises becomes the shard's error. It is dropped once ``owner`` is gone (the listener should
        not hold ``owner`` itself: the fetcher would keep it alive).
        """
        with self._cond:
            self._listeners = [(o, f) for o, f in self._listeners if o() is not None] + [(weakref.ref(owner),
                                                                                         listener)]
            here = [i for i, done in enumerate(self._done) if done]
        for index in here:
            listener(index, self.path(index))

    @property
    def windowed(self) -> bool:
        """Return whether the version may hold only part of its shards at a time (``storage/_window.py``)."""
        return window_bytes(self._version) is not None

    def hold(self, index: int) -> FileLock | None:
        """Hold shard ``index`` against eviction (a lock to release after reading), or None when it is not here."""
        lock = hold_shard(self._version, self._shards[index].file, self._shards[index].bytes)
        if lock is None:
            with self._cond:
                self._done[index] = False  # evicted (by another process, or before its holder attached it)
        return lock

    def on_release(self, owner: object, release: Callable[[int], bool]) -> None:
        """Ask ``release(index)`` to let go of a shard before it is evicted (False: a batch in flight reads it).

        Dropped once ``owner`` is gone, as ``on_fetched``'s listeners.
        """
        with self._cond:
            self._releasers = [(o, f) for o, f in self._releasers if o() is not None] + [(weakref.ref(owner),
                                                                                         release)]

    def plan(self, plan: NeedPlan | None) -> None:
        """Set when this process's epoch reads each shard (eviction goes by it); the reader is at batch 0.

        Which shards are here is read again from the cache directory: other processes evict and fetch
        shards of a windowed version, and a shard marked here that is gone would never be fetched ahead.
        """
        here = _whole_shards(self._version, self._shards)
        with self._cond:
            self._plan, self._position = plan, 0
            self._done = [i in here for i in range(len(self._shards))]
            self._cond.notify_all()

    def at(self, position: int) -> None:
        """Say the reader submits batch ``position`` of the plan next (shards needed only before it may go)."""
        with self._cond:
            if position != self._position:
                self._position = position
                # Waking idle download threads at every batch would cost the reader the GIL: only those
                # waiting for room, and those waiting for the reader once the next shard is in reach.
                if self._room_waiters or (self._ahead_waiters and self._queue and self._may_start(self._queue[0])):
                    self._cond.notify_all()

    def next_need(self, index: int) -> float:
        """Return the batch of the plan, from the reader's position on, that reads shard ``index`` next.

        inf: none; 0 without a plan.
        """
        with self._cond:
            return 0.0 if self._plan is None else self._plan.next_need(index, self._position)

    def wake(self) -> None:
        """Have downloads waiting for room try again now (a reader let go of shards)."""
        with self._cond:
            if self._room_waiters:
                self._cond.notify_all()

    def want(self, order: Iterable[int], first: int = 0, needs: Iterable[int] | None = None, lead: int = 0) -> None:
        """Fetch the shards of ``order`` not here yet, in that order, in the background (replaces the queue).

        A shard whose download failed earlier is tried again; the reader is at batch 0.

        ``first``: how many shards at the head of ``order`` the first batch reads: at least that many
        download at once from the start (capped at ``threads``). How many download at once is then
        measured (``storage/_concurrency.py``): as few as give the link its full rate, so that shards
        arrive in the order they are read; a shard a reader waits for starts whatever the number.

        ``needs``: the batch of the pass that first reads each shard of ``order`` (non-decreasing).
        With it, and the fetcher's ``ahead`` bound, a shard is downloaded only once it is among the
        ``ahead`` shards first read from the reader's position (``at``) plus ``lead`` batches on;
        those the batches before that read, and any a reader waits for, always are.
        """
        with self._cond:
            self._check_open()
            order = [int(i) for i in order]
            first_need = np.full(len(self._shards), np.inf)
            if needs is not None:
                need_list = [float(n) for n in needs]
                if len(need_list) != len(order):
                    raise ArgumentError("want(): one need per shard of the order")
                for i, n in zip(reversed(order), reversed(need_list)):  # the first need of a shard listed twice
                    first_need[i] = n
            self._first_need = first_need if needs is not None else None
            self._needs_sorted = np.sort(first_need[np.isfinite(first_need)])
            self._lead, self._position = max(0, int(lead)), 0
            wanted = list(dict.fromkeys(order))
            for i in wanted:  # a new pass tries again what failed before (the store may be back)
                self._errors.pop(i, None)
            self._queue = [i for i in wanted if not self._done[i] and i not in self._running]
            if first > 0:
                self._concurrency.start(first)
            self._start_threads()
            self._cond.notify_all()

    def ensure(self, index: int, timeout: float | None = None) -> Path:
        """Return shard ``index``'s path once it is whole, fetching it first (ahead of the queue) if needed.

        Raises the RemoteError of its download, or RemoteError when ``timeout`` seconds pass.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_open()
            self._errors.pop(index, None)  # failed before: this call tries again (the store may be back)
            self._waited.add(index)
            try:
                while not self._done[index]:
                    if index in self._errors:
                        raise self._errors[index]
                    self._check_open()
                    if index not in self._running and index not in self._queue:  # first, or dropped by want()
                        self._queue.insert(0, index)
                        self._start_threads()
                        self._cond.notify_all()
                    elif index in self._queue and self._queue[0] != index:  # needed now: next
                        self._queue.remove(index)
                        self._queue.insert(0, index)
                        self._cond.notify_all()
                    if index in self._queue:
                        self._start_threads()  # every thread busy at the limit: one more for the shard waited for
                    if deadline is not None and time.monotonic() > deadline:
                        raise RemoteError(f"{self._root.url_of(self._shards[index].file)}: not fetched within "
                                          f"{timeout:g} s")
                    self._cond.wait(_WAIT_SLICE_S)
            finally:
                self._waited.discard(index)
        return self.path(index)

    def ready(self, indices: Iterable[int]) -> bool:
        """Return whether every shard of ``indices`` is whole; raise the first one's download error."""
        with self._cond:
            for index in indices:
                if index in self._errors:
                    raise self._errors[index]
                if not self._done[index]:
                    return False
        return True

    def close(self) -> None:
        """Stop fetching: transfers in flight stop at their next chunk and rename nothing (idempotent)."""
        self._stop.set()
        with self._cond:
            self._queue.clear()
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        deadline = time.monotonic() + 2.0
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def __del__(self) -> None:
        self._stop.set()

    # ---- the download threads ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._stop.is_set():
            raise RemoteError(f"{redact(self._root.url)}: this dataset's downloads were stopped (the dataset was "
                              "closed)")

    def _start_threads(self) -> None:  # with self._cond held
        """Start download threads: as many as may download at once, plus one per shard a reader waits for."""
        self._threads = [t for t in self._threads if t.is_alive()]
        waited = sum(1 for i in self._queue if i in self._waited)
        wanted = min(self._threads_wanted, self._concurrency.limit + waited, len(self._queue) + len(self._running))
        while len(self._threads) < wanted:
            thread = threading.Thread(target=self._work, name=f"fastload-fetch-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    while not self._queue and not self._stop.is_set():
                        if not self._cond.wait(5.0):  # idle: the thread ends; want() or ensure() starts another
                            if not self._queue:
                                self._threads = [t for t in self._threads if t is not threading.current_thread()]
                                return
                    if self._stop.is_set():
                        return
                    if len(self._running) >= self._concurrency.limit and self._queue[0] not in self._waited:
                        if len(self._threads) > self._concurrency.limit:  # more threads than may download: one ends
                            self._threads = [t for t in self._threads if t is not threading.current_thread()]
                            return
                        self._cond.wait(_AHEAD_WAIT_S)  # enough downloads at once (a reader waiting goes anyway)
                        continue
                    pick = self._next_allowed()
                    if pick is not None:
                        break
                    self._ahead_waiters += 1  # the next shards are too far ahead: wait for the reader (at())
                    try:
                        self._cond.wait(_AHEAD_WAIT_S)
                    finally:
                        self._ahead_waiters -= 1
                index = self._queue.pop(pick)
                self._running.add(index)
                self._report()
            error: BaseException | None = None
            try:
                path = self._fetch(index)
                for owner, listener in list(self._listeners):
                    if owner() is not None:
                        listener(index, path)
            except NoRoom:
                self._wait_for_room(index)
                continue
            except DownloadStopped:
                error = RemoteError(f"{self._root.url_of(self._shards[index].file)}: download stopped")
            except BaseException as err:  # handed to whoever waits for this shard
                error = err
            with self._cond:
                self._running.discard(index)
                self._report()
                self._no_room_since.pop(index, None)  # fetched, or failed: no wait for room goes on
                if error is None:
                    self._done[index] = True
                else:
                    self._errors[index] = error
                self._cond.notify_all()

    def _next_allowed(self) -> int | None:  # with self._cond held
        """Return the place in the queue of the next shard to download now, or None (all too far ahead)."""
        if self._may_start(self._queue[0]):
            return 0
        for k, index in enumerate(self._queue):  # a shard a reader waits for goes whatever the bound
            if index in self._waited:
                return k
        return None

    def _may_start(self, index: int) -> bool:  # with self._cond held
        """Return whether shard ``index`` is within ``ahead`` shards of the reader's position (``want``)."""
        if self._ahead is None or self._first_need is None or index in self._waited:
            return True
        start = self._position + self._lead
        need = self._first_need[index]
        if need < start or not math.isfinite(need):  # read by the batches up to the position (or outside the plan)
            return True
        before = int(np.searchsorted(self._needs_sorted, need, "left") -
                     np.searchsorted(self._needs_sorted, start, "left"))
        return before < self._ahead

    def _fetch(self, index: int) -> Path:
        shard = self._shards[index]
        with shard_lock(self._version, shard.file):
            return fetch_shard(self._root, self._version, shard, stop=self._stop,
                               reserve=lambda part: self._reserve(index, part), progress=self._on_chunk)

    def _on_chunk(self, size: int) -> None:
        """Count ``size`` bytes received by a download (on its thread)."""
        with self._cond:
            self._received += size
            self._report()

    def _report(self) -> None:  # with self._cond held
        """Tell the concurrency what arrived and how many download now; start more when its limit rose."""
        if self._concurrency.report(time.monotonic(), self._received, len(self._running)):
            self._start_threads()
            self._cond.notify_all()

    def _next_need(self, index: int) -> float:  # with self._cond held
        return _need(self._plan, self._position, index in self._waited, index)

    def _reserve(self, index: int, part: Path) -> bool:
        """Make room for shard ``index`` (a windowed version) and create its ``.part``; False: no room yet."""
        with self._cond:
            plan, position = self._plan, self._position
            waited = index in self._waited
            busy = set(self._running)
            releasers = [f for o, f in self._releasers if o() is not None]
        needs: dict[int, float] = {}

        def need(j: int) -> float:  # as _next_need, from the state read above (computed for the shards asked)
            if j not in needs:
                needs[j] = _need(plan, position, j == index and waited, j)
            return needs[j]

        window = window_bytes(self._version)
        if plan is not None and window is not None:
            # Not further ahead than the room reaches: the shards read before it (and it) must fit, or it
            # would push out a shard needed sooner, or be pushed out itself before it is read.
            if plan.bytes_needed_by(position, need(index), self._sizes) > window:
                return False
        evicted = reserve_room(self._version, self._shards, index, part, need,
                               lambda j: all(release(j) for release in releasers), busy - {index})
        if evicted is None:
            return False
        with self._cond:
            for j in evicted:
                self._done[j] = False
                if need(j) < math.inf and j not in self._queue:  # needed again later: fetched again then
                    self._queue.append(j)
            if self._plan is not None:
                self._queue.sort(key=self._next_need)
            self._no_room_since.pop(index, None)
        return True

    def _wait_for_room(self, index: int) -> None:
        """Put shard ``index`` back at the head of the queue and wait for the epoch to move on (no room yet)."""
        with self._cond:
            self._running.discard(index)
            self._report()
            if index in self._waited:  # the clock runs only while a reader waits for this shard
                since = self._no_room_since.setdefault(index, time.monotonic())
            else:
                since = time.monotonic()
                self._no_room_since.pop(index, None)
            limit = ROOM_WAIT_S + float(self._root.options.retries["retry_timeout_s"])
            if index in self._waited and time.monotonic() - since > limit:
                self._errors[index] = RemoteError(
                    f"{self._root.url_of(self._shards[index].file)}: no room in the cache for this shard for "
                    f"{limit:g} s: cache_limit leaves this dataset {window_bytes(self._version)} bytes, and "
                    "the shards this process and the others sharing the cache read now fill them (processes that "
                    "do not read in step need room for 2 x shuffle_window shards each); raise cache_limit, or "
                    "lower shuffle_window")
                self._no_room_since.pop(index, None)
                self._cond.notify_all()
                return
            if index not in self._queue:
                self._queue.insert(0, index)
            self._room_waiters += 1
            try:
                self._cond.wait(_ROOM_RETRY_S)
            finally:
                self._room_waiters -= 1

    def refetch(self, index: int) -> Path:
        """Download shard ``index`` again: its cached copy was found damaged and set aside (``storage/_heal.py``).

        Forgets that it is here, then fetches it as :meth:`ensure` does (under its shard lock, checked
        against the manifest; another process that fetched it meanwhile leaves nothing to download) and
        returns its path. Raises the download's RemoteError.
        """
        with self._cond:
            self._done[index] = False
            self._errors.pop(index, None)
        return self.ensure(index)


def _need(plan: NeedPlan | None, position: int, waited: bool, index: int) -> float:
    """Return when shard ``index`` is read next: the plan's batch from ``position`` on, inf for none.

    A shard a reader waits for that the plan does not read from here on (no plan, or a read outside
    it: a dataset indexed directly) is read now: -1, before every batch.
    """
    need = math.inf if plan is None else plan.next_need(index, position)
    return -1.0 if waited and need == math.inf else need


def _whole_shards(version: Path, shards: list[ShardInfo]) -> set[int]:
    """Return the shards whole in ``version`` now (one listing, then a size check of those listed)."""
    try:
        names = set(os.listdir(version))
    except OSError:
        return set()
    return {i for i, s in enumerate(shards) if s.file in names and is_whole(version / s.file, s.bytes)}


_LIVE: weakref.WeakSet[ShardFetcher] = weakref.WeakSet()  # this process's fetchers, stopped at exit


@atexit.register
def _stop_at_exit() -> None:
    """Stop every fetcher before the interpreter kills its daemon threads: their ``.part`` files are removed."""
    for fetcher in list(_LIVE):
        if fetcher._pid == os.getpid():  # a forked child's copies: their locks may be held by dead threads
            fetcher.close()
