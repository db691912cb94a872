"""Fetching in a process made by ``os.fork()``: one shard at a time, by a fresh interpreter.

obstore's runtime does not survive ``fork`` (a forked child's request never returns: tested), so a
child such as a ``DataLoader`` worker gets a :class:`ForkedFetcher`. A shard already whole is read at
once; one its parent is downloading is waited for (its lock); any other is fetched by a fresh
interpreter running this module (:func:`fetch_in_fresh_process`). The request (URL, storage options,
version directory, shard number) goes through stdin, never the command line, where credentials
would show in process listings. The child prints an error as ``<type>``, a tab and ``<message>`` on stderr and
exits 1; the messages are the storage layer's, which never hold secrets.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import FastloadError, RemoteError
from ..format._manifest import ShardInfo, load_manifest
from ._cache import hold_shard, is_whole, shard_lock, window_bytes
from ._client import RemoteRoot
from ._fetcher import ShardFetcher
from ._locks import FileLock

# A windowed version's shard evicted (by another process making room) right after its download this
# many times in a row, before the worker could look at it: an error naming cache_limit.
FETCH_ATTEMPTS = 5


class ForkedFetcher:
    """The fetcher of a forked child: what :class:`ShardFetcher` offers readers, without obstore in this process."""

    def __init__(self, source_url: str, spec: Any, version: Path, shards: list[ShardInfo], url: str) -> None:
        self._source_url, self._spec, self._version, self._shards, self._url = source_url, spec, version, shards, url

    def __len__(self) -> int:
        return len(self._shards)

    def size(self, index: int) -> int:
        """Return shard ``index``'s size in bytes (the manifest's)."""
        return int(self._shards[index].bytes)

    def path(self, index: int) -> Path:
        """Return where shard ``index`` lies in the cache (whole or not yet)."""
        return self._version / self._shards[index].file

    def is_here(self, index: int) -> bool:
        """Return whether shard ``index`` is whole in the cache."""
        return is_whole(self.path(index), self._shards[index].bytes)

    def missing(self) -> int:
        """Return how many shards are not in the cache yet."""
        return sum(not self.is_here(i) for i in range(len(self._shards)))

    def want(self, order: Any, first: int = 0, needs: Any = None, lead: int = 0) -> None:
        """Do nothing: the parent process fetches ahead."""

    @property
    def windowed(self) -> bool:
        """Return whether the version may hold only part of its shards at a time (``storage/_window.py``)."""
        return window_bytes(self._version) is not None

    def hold(self, index: int) -> FileLock | None:
        """Hold shard ``index`` against eviction (a lock to release after reading), or None when it is not here."""
        return hold_shard(self._version, self._shards[index].file, self._shards[index].bytes)

    def on_release(self, owner: object, release: Any) -> None:
        """Do nothing: the fresh interpreter that fetches evicts only shards no process holds."""

    def plan(self, plan: Any) -> None:
        """Do nothing: without a plan, room is made by recent use."""

    def at(self, position: int) -> None:
        """Do nothing (no plan)."""

    def wake(self) -> None:
        """Do nothing (no download threads)."""

    def next_need(self, index: int) -> float:
        """Return 0: without a plan every shard may be needed now."""
        return 0.0

    def on_fetched(self, owner: object, listener: Any) -> None:
        """Call ``listener(index, path)`` for the shards here now (those fetched later are returned by ensure)."""
        for index in range(len(self._shards)):
            if self.is_here(index):
                listener(index, self.path(index))

    def ready(self, indices: Any) -> bool:
        """Return whether every shard of ``indices`` is whole."""
        return all(self.is_here(int(i)) for i in indices)

    def ensure(self, index: int, timeout: float | None = None) -> Path:
        """Return shard ``index``'s path once it is whole: waited for if another process fetches it, else fetched.

        Until this process holds it, a windowed version's shard may be evicted by any process making
        room (the parent's downloads, another worker's fresh interpreter), also between its download
        and the look here: it is then fetched again, ``FETCH_ATTEMPTS`` times in all, before a
        RemoteError says the cache is too small. (The caller holds it next and, when it is gone even
        then, calls again.)
        """
        file = self._shards[index].file
        for _ in range(FETCH_ATTEMPTS):
            if self.is_here(index):
                return self.path(index)
            with shard_lock(self._version, file):  # released when its downloader is done
                here = self.is_here(index)
            if not here:
                fetch_in_fresh_process(self._source_url, self._spec, self._version, index, self._url)
            if self.is_here(index):
                return self.path(index)
            if not self.windowed:  # nothing evicts a shard of a version held whole
                raise RemoteError(f"{self._url}/{file}: not in the cache after its download")
        raise RemoteError(f"{self._url}/{file}: evicted {FETCH_ATTEMPTS} times right after its download, before this "
                          "DataLoader worker could read it; the cache is too small for the processes sharing it "
                          "(raise cache_limit)")

    def refetch(self, index: int) -> Path:
        """Download shard ``index`` again: its damaged copy was set aside (``storage/_heal.py``); as :meth:`ensure`.

        Nothing here remembers a shard as fetched, so a copy that is gone is fetched again (by the
        process downloading it already, or a fresh interpreter).
        """
        return self.ensure(index)

    def close(self) -> None:
        """Do nothing: no thread of its own."""


def fetch_in_fresh_process(source_url: str, spec: Any, version: Path, index: int, url: str) -> None:
    """Fetch shard ``index`` of the cached ``version`` of ``source_url`` in a fresh interpreter; raise its error."""
    payload = pickle.dumps((source_url, spec, str(version), int(index)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}
    try:
        done = subprocess.run([sys.executable, "-m", "fastload.storage._fetch_child"], input=payload,
                              capture_output=True, check=False, env=env)
    except OSError as err:
        raise RemoteError(f"{url}: cannot start a process to fetch shard {index}: {err}") from None
    if done.returncode == 0:
        return
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    for line in reversed(lines):  # the child's report; anything printed after it (a warning) is skipped
        kind, tab, message = line.partition("\t")
        error = getattr(errors, kind, None) if tab else None
        if isinstance(error, type) and issubclass(error, FastloadError) and message:
            raised = error.__new__(error)  # its message as the child wrote it, whatever its constructor takes
            Exception.__init__(raised, message)
            raise raised
    what = lines[-1].split(":", 1)[0] if lines else "no message"  # an exception's type only: no values shown
    hint = ""
    # ``python -m`` reports a package that fails to import as "<python>: Error while finding module
    # specification for ... (ImportError: ...)": the type is looked for in the whole line.
    failed_import = re.search(r"\b(ImportError|ModuleNotFoundError|SyntaxError)\b", lines[-1]) if lines else None
    if failed_import:
        # The fresh interpreter imports fastload from disk again: an installation or a source tree
        # changed since this process started (an upgrade, an edit mid-run) fails every such fetch.
        what = failed_import.group(1)
        hint = ("; a fresh interpreter could not import fastload: was it reinstalled or edited while this "
                "process ran?")
    raise RemoteError(f"{url}: the process fetching shard {index} failed (exit status {done.returncode}, "
                      f"{what}){hint}")


def main() -> int:
    """Read the request from stdin, fetch the shard, report an error on stderr."""
    source_url, spec, version, index = pickle.loads(sys.stdin.buffer.read())
    try:
        fetcher = ShardFetcher(RemoteRoot(source_url, spec.storage_options), Path(version),
                               load_manifest(Path(version)).shards, threads=1)
        try:
            fetcher.ensure(index)
        finally:
            fetcher.close()
    except FastloadError as err:
        print(f"{type(err).__name__}\t{err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"RemoteError\tcache {version}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
