"""Fetching a remote dataset's shards while it is read: on demand, and ahead of need in the plan's order.

A :class:`ShardFetcher` belongs to one opened remote dataset (one cached version) in one process. The
loader tells it which shards the epoch will need, in order of first need for this rank
(:meth:`ShardFetcher.want`); a few download threads fetch them in that order, several at once, and a
reader that needs a shard now (:meth:`ShardFetcher.ensure`) moves it to the front and waits for it.
Policy (which shard next) is this module's; the bytes go through ``fetch_shard`` (checked against the
manifest, written atomically) under a per-shard file lock, so processes sharing the cache (ranks,
DataLoader workers) never download one shard twice and never see a torn file.

Errors: a shard that cannot be fetched is a RemoteError naming its URL, raised in whoever waits for
it; a wait is bounded (the storage's own timeouts and retries bound every transfer). A closed fetcher
stops its threads at their next chunk and renames nothing from then on.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import RemoteError
from ..format._manifest import ShardInfo
from ._cache import DownloadStopped, fetch_shard, is_whole, shard_lock
from ._client import RemoteRoot
from ._urls import redact

DOWNLOAD_THREADS = 8  # concurrent shard downloads (obstore releases the GIL)
_WAIT_SLICE_S = 0.1  # a waiting thread wakes this often (Ctrl-C is handled between slices)


class ShardFetcher:
    """The shards of one cached remote version: which are here, which to fetch next, and waiting for one."""

    def __init__(self, root: RemoteRoot, version: Path, shards: list[ShardInfo],
                 threads: int = DOWNLOAD_THREADS) -> None:
        self._root, self._version, self._shards = root, version, shards
        self._threads_wanted = max(1, threads)
        self._cond = threading.Condition()
        self._done = [is_whole(version / s.file, s.bytes) for s in shards]
        self._errors: dict[int, BaseException] = {}
        self._running: set[int] = set()
        self._queue: list[int] = []  # shards to fetch, first needed first
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._listeners: list[Callable[[int, Path], None]] = []
        self._urgent: int | None = None  # a slow start: this many downloads until one shard is whole
        self._pid = os.getpid()
        _LIVE.add(self)

    def __len__(self) -> int:
        return len(self._shards)

    def path(self, index: int) -> Path:
        """Return where shard ``index`` lies in the cache (whole or not yet)."""
        return self._version / self._shards[index].file

    def missing(self) -> int:
        """Return how many shards are not in the cache yet."""
        with self._cond:
            return self._done.count(False)

    def on_fetched(self, listener: Callable[[int, Path], None]) -> None:
        """Call ``listener(index, path)`` for every shard as it becomes whole (at once for those already here).

        It runs on the download thread (or this one), must not block for long, and an exception it
        raises becomes the shard's error.
        """
        with self._cond:
            self._listeners.append(listener)
            here = [i for i, done in enumerate(self._done) if done]
        for index in here:
            listener(index, self.path(index))

    def want(self, order: Iterable[int], first: int = 0) -> None:
        """Fetch the shards of ``order`` not here yet, in that order, in the background (replaces the queue).

        A shard whose download failed earlier is tried again.

        ``first``: how many shards at the head of ``order`` the first batch reads. Until one shard is
        whole only that many download at once (at least 2): on a link whose bandwidth the downloads
        share, the first batch's shards then arrive sooner; then all ``threads`` do.
        """
        with self._cond:
            self._check_open()
            wanted = list(dict.fromkeys(int(i) for i in order))
            for i in wanted:  # a new pass tries again what failed before (the store may be back)
                self._errors.pop(i, None)
            self._queue = [i for i in wanted if not self._done[i] and i not in self._running]
            if first > 0 and not self._running and self._queue:
                self._urgent = max(2, first)
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
            while not self._done[index]:
                if index in self._errors:
                    raise self._errors[index]
                self._check_open()
                if index not in self._running and index not in self._queue:  # first, or dropped by a want()
                    self._queue.insert(0, index)
                    self._start_threads()
                    self._cond.notify_all()
                if deadline is not None and time.monotonic() > deadline:
                    raise RemoteError(f"{self._root.url_of(self._shards[index].file)}: not fetched within "
                                      f"{timeout:g} s")
                self._cond.wait(_WAIT_SLICE_S)
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
        self._threads = [t for t in self._threads if t.is_alive()]
        wanted = self._threads_wanted if self._urgent is None else min(self._threads_wanted, self._urgent)
        while len(self._threads) < min(wanted, len(self._queue)):
            thread = threading.Thread(target=self._work, name=f"fastload-fetch-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    if not self._cond.wait(5.0):  # idle: the thread ends; want() or ensure() starts another
                        if not self._queue:
                            self._threads = [t for t in self._threads if t is not threading.current_thread()]
                            return
                if self._stop.is_set():
                    return
                index = self._queue.pop(0)
                self._running.add(index)
            error: BaseException | None = None
            try:
                path = self._fetch(index)
                for listener in list(self._listeners):
                    listener(index, path)
            except DownloadStopped:
                error = RemoteError(f"{self._root.url_of(self._shards[index].file)}: download stopped")
            except BaseException as err:  # handed to whoever waits for this shard
                error = err
            with self._cond:
                self._running.discard(index)
                if error is None:
                    self._done[index] = True
                else:
                    self._errors[index] = error
                if self._urgent is not None:
                    self._urgent = None
                    self._start_threads()  # one shard has ended: all the threads from now on
                self._cond.notify_all()

    def _fetch(self, index: int) -> Path:
        shard = self._shards[index]
        with shard_lock(self._version, shard.file):
            return fetch_shard(self._root, self._version, shard, stop=self._stop)


_LIVE: weakref.WeakSet[ShardFetcher] = weakref.WeakSet()  # this process's fetchers, stopped at exit


@atexit.register
def _stop_at_exit() -> None:
    """Stop every fetcher before the interpreter kills its daemon threads: their ``.part`` files are removed."""
    for fetcher in list(_LIVE):
        if fetcher._pid == os.getpid():  # a forked child's copies: their locks may be held by dead threads
            fetcher.close()
