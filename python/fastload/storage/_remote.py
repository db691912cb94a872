"""Opening a dataset in object storage: its manifest, its split index, and its shards into the cache."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._progress import Progress
from ..errors import ArgumentError, ArgumentTypeError, DatasetError, RemoteError, RemoteNotFoundError
from ..format._manifest import MANIFEST_NAME, load_manifest
from ..format._manifest_check import MAX_MANIFEST_BYTES
from ..format._splits import MAX_SPLITS_BYTES, SPLITS_NAME, read_splits
from ._cache import (
    READERS_LOCK_NAME,
    cache_lock,
    check_boot,
    default_cache_dir,
    hold_for_reading,
    parse_cache_limit,
    touch,
    version_dir,
    window_bytes,
)
from ._cache_fs import is_real_file, open_new, real_dir, unlink_in
from ._client import RemoteRoot, StorageOptions
from ._fetch_child import ForkedFetcher
from ._fetcher import DOWNLOAD_THREADS, ShardFetcher
from ._locks import FileLock
from ._room import claim_room, make_room, release_claim, room_ceiling, waiting_for_room
from ._urls import join_url, redact

# How many shards are downloaded ahead of the reader by default: twice the downloads at once, so each
# download thread has its next shard while the reader takes the current ones.
AUTO_PREDOWNLOAD = 2 * DOWNLOAD_THREADS


@dataclass(frozen=True)
class RemoteSpec:
    """Where a remote dataset is cached and how its storage is reached (the loader's storage options)."""

    storage_options: StorageOptions
    cache_dir: Path
    cache_limit: int | None
    predownload: int | None = AUTO_PREDOWNLOAD  # shards downloaded ahead of the reader (None: no bound)

    @classmethod
    def build(cls, storage_options: Mapping[str, Any] | None, cache_dir: str | os.PathLike | None,
              cache_limit: int | str | None, predownload: int | str = "auto") -> RemoteSpec:
        """Check and group the storage arguments of ``ShardDataset`` / ``ShardLoader``."""
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise ArgumentTypeError(f"cache_dir must be a path, not {type(cache_dir).__name__}")
        directory = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser().absolute()
        return cls(StorageOptions.build(storage_options), directory, parse_cache_limit(cache_limit),
                   parse_predownload(predownload))


def parse_predownload(value: int | str) -> int | None:
    """Return how many shards may download ahead of the reader (None: no bound).

    ``value``: ``"auto"``, ``"all"`` (no bound) or an int >= 0.
    """
    if isinstance(value, str) and value in ("auto", "all"):
        return AUTO_PREDOWNLOAD if value == "auto" else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"predownload must be a number of shards (an int), 'auto' or 'all', not {value!r}")
    if value < 0:
        raise ArgumentError(f"predownload must be 0 or more shards (0: each shard when a batch needs it), not {value}")
    return value


class CachedDataset:
    """A remote dataset's version in the local cache, held against eviction while alive.

    Its shards are fetched by ``fetcher`` (this process's): on demand and ahead of need, or all of
    them by ``open_remote(..., shards=True)``.
    """

    def __init__(self, source_url: str, path: Path, reading: FileLock, spec: RemoteSpec,
                 root: RemoteRoot | None = None) -> None:
        """``root``: the store the manifest came through, reused by this process's fetcher (not after a fork)."""
        self.source_url = source_url  # as given (one split's): it may hold a token, so it is never shown
        self.url = redact(source_url)
        self.path = path
        self._reading = reading
        self._spec = spec
        self._fetcher: ShardFetcher | ForkedFetcher | None = None
        self._fetcher_pid = 0
        self._fetcher_lock = (os.getpid(), threading.Lock())  # one fetcher per process, whichever thread asks
        self._pid = os.getpid()  # the process that opened it: a forked child's fetcher is a ForkedFetcher
        self._root = root
        self._claim: FileLock | None = None  # the room this process's reader claimed in a windowed version
        self._claimed = 0

    @property
    def fetcher(self) -> ShardFetcher | ForkedFetcher:
        """Return this process's fetcher of the version's shards (in a child made by fork: a ForkedFetcher)."""
        fetcher = self._fetcher
        if fetcher is not None and self._fetcher_pid == os.getpid():
            return fetcher
        if self._fetcher_lock[0] != os.getpid():  # a forked child: a lock no thread of a parent can hold
            self._fetcher_lock = (os.getpid(), threading.Lock())
        with self._fetcher_lock[1]:
            if self._fetcher is None or self._fetcher_pid != os.getpid():
                shards = load_manifest(self.path).shards
                if self._pid != os.getpid():  # obstore does not work after fork: a fresh interpreter fetches
                    self._fetcher = ForkedFetcher(self.source_url, self._spec, self.path, shards, self.url)
                else:
                    root = self._root if self._root is not None else RemoteRoot(self.source_url,
                                                                                self._spec.storage_options)
                    self._fetcher = ShardFetcher(root, self.path, shards, ahead=self._spec.predownload)
                self._fetcher_pid = os.getpid()
            return self._fetcher

    @property
    def window(self) -> int | None:
        """Return the bytes this version may hold when it is windowed (larger than its room), else None."""
        return window_bytes(self.path)

    def room_for_shards(self) -> int | None:
        """Return the most room for shards this version could have under ``cache_limit`` (None: no limit).

        That is ``cache_limit`` less the cache's files that are not datasets and this version's own
        files: what it gets when no other dataset is in use.
        """
        limit = self._spec.cache_limit
        return None if limit is None else room_ceiling(self._spec.cache_dir, self.path, limit)

    @property
    def claimed(self) -> int | None:
        """Return the bytes of shards this process's reader claimed in the windowed version (None: no claim)."""
        return self._claimed if self._claim is not None else None

    def claim(self, need: int) -> None:
        """Claim ``need`` bytes of shards for this reader's window of a windowed version (storage/_room.py).

        Idempotent for a smaller or equal need. Waits up to ``ROOM_WAIT_S`` for datasets in use to let
        go of room, then raises a RemoteError naming them.
        """
        limit = self._spec.cache_limit
        if limit is None or self.window is None or (self._claim is not None and need <= self._claimed):
            return
        claim = claim_room(self._spec.cache_dir, self.path, limit, need, replacing=self._claim)
        self._claim, self._claimed = claim, need  # (the claim it replaces was let go of with the cache lock held)

    def _drop_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None and self._pid == os.getpid():  # a forked child's copy is not its claim
            try:
                release_claim(self._spec.cache_dir, self.path, claim)
            except (RemoteError, OSError):
                claim.release()  # the claim file stays; its free lock marks it as ended

    def release(self) -> None:
        """Stop this process's downloads, let go of its claimed room, and let eviction take this version again."""
        if self._fetcher is not None and self._fetcher_pid == os.getpid():
            self._fetcher.close()
        self._drop_claim()
        self._reading.release()


def remote_splits(url: str, spec: RemoteSpec, root: RemoteRoot | None = None) -> dict[str, str] | None:
    """Return split name -> URL for a root with ``splits.json`` (validated as a local one), else None.

    One GET (its 404 says there is none). ``root``: a store already open at ``url``, used instead of a new one.
    """
    root = root if root is not None else RemoteRoot(url, spec.storage_options)
    try:
        data = root.read_bytes(SPLITS_NAME, MAX_SPLITS_BYTES)
    except RemoteNotFoundError:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="fastload-splits-") as tmp:
            Path(tmp, SPLITS_NAME).write_bytes(data)
            try:
                splits = read_splits(tmp, check_dirs=False)
            except DatasetError as err:
                raise DatasetError(str(err).replace(tmp, redact(url))) from None
    except OSError as err:
        raise RemoteError(f"{redact(url)}: cannot check {SPLITS_NAME} in a temporary directory: {err}") from None
    assert splits is not None
    return {name: join_url(url, str(entry["path"])) for name, entry in splits.items()}


def resolve_remote_split(url: str, split: str | None, spec: RemoteSpec, root: RemoteRoot | None = None) -> str:
    """Return the URL of the dataset meant by ``url`` and ``split`` (a root with ``splits.json`` needs one).

    ``root``: a store already open at ``url``, used instead of a new one.
    """
    splits = remote_splits(url, spec, root)
    if splits is None:
        if split is not None:
            raise DatasetError(f"{redact(url)}: split={split!r} given, but this is not a dataset root with splits "
                               f"(no {SPLITS_NAME})")
        return url
    if split is None:
        raise DatasetError(f"{redact(url)}: a dataset root with splits {', '.join(map(repr, splits))}; pass split= "
                           f"one of them (e.g. split={next(iter(splits))!r})")
    if split not in splits:
        raise DatasetError(f"{redact(url)}: no split {split!r}; the splits are {list(splits)}")
    return splits[split]


def open_remote(url: str, split: str | None, spec: RemoteSpec, shards: bool = False,
                progress: bool = False) -> CachedDataset:
    """Return the dataset at ``url`` (one ``split`` of a root) as a version in the cache, held for reading.

    The manifest is fetched and validated first (a missing object, no credentials or a refused
    permission fail here, naming the URL, before any shard is fetched), and room is made for the
    whole version within ``cache_limit``, or, when it cannot fit, for a window of its shards
    (``storage/_window.py``; its shards are then evicted as the epoch moves on). The shards come
    later, through ``fetcher`` (on demand and in the order the loader asks for them), or now with
    ``shards=True``: all of them, several at once, each checked against the manifest (``progress``: their
    bytes reported as they arrive, ``_progress.Progress``, logger ``fastload.download``).
    """
    root = RemoteRoot(url, spec.storage_options)  # one store for every request of this process (making one takes ms)
    resolved = resolve_remote_split(url, split, spec, root)
    if resolved != url:
        url, root = resolved, RemoteRoot(resolved, spec.storage_options)
    manifest_bytes = root.read_bytes(MANIFEST_NAME, MAX_MANIFEST_BYTES)
    version = version_dir(spec.cache_dir, url, manifest_bytes)

    def place_and_make_room() -> FileLock:  # with the cache lock held; tried again while datasets in use hold room
        check_boot(spec.cache_dir)  # first, after a restart: what a power loss may have torn is hashed again
        _place_manifest(version, manifest_bytes)
        try:
            load_manifest(version)  # validated before a byte of room is made for it
        except DatasetError as err:
            raise DatasetError(f"{redact(url)}: {err}") from None
        reading = hold_for_reading(version)
        try:
            make_room(spec.cache_dir, version, spec.cache_limit)  # whole, or windowed (storage/_room.py)
            touch(version / READERS_LOCK_NAME)
        except BaseException:
            reading.release()
            raise
        return reading

    try:
        reading = waiting_for_room(spec.cache_dir, place_and_make_room)
    except OSError as err:  # the cache's own files: permissions, a full disk, locks the filesystem refuses
        raise RemoteError(f"cache {spec.cache_dir}: {err.strerror or err} (opening {redact(url)})") from None
    cached = CachedDataset(url, version, reading, spec, root)
    if shards:
        try:
            fetch_all(cached.fetcher, progress, f"download {redact(url)}")
        except BaseException:
            cached.release()
            raise
    return cached


def fetch_all(fetcher: ShardFetcher | ForkedFetcher, progress: bool = False, desc: str = "download") -> None:
    """Fetch every shard of a version not in the cache yet, several at once; raise the first failure.

    Every shard is needed now, in no particular order: as many download at once as the fetcher has
    threads from the start (``want``'s ``first``), fewer once the link proves shared. ``progress``:
    the bytes of the shards as each is whole (a bar, or lines in a command's log). The wait is in
    short slices: a Ctrl-C ends it at once, and the fetcher is then closed (the transfers in flight
    stop at their next chunk and leave only ``.part`` files).
    """
    sizes = [fetcher.size(i) for i in range(len(fetcher))]
    here = {i for i in range(len(fetcher)) if fetcher.ready([i])}
    try:
        with Progress(desc, sum(sizes), unit="B", initial=sum(sizes[i] for i in here), enabled=progress,
                      logger="fastload.download", leave=False) as bar:
            fetcher.want(range(len(fetcher)), first=len(fetcher))
            for index in range(len(fetcher)):
                if index not in here:
                    fetcher.ensure(index)
                    bar.update(sizes[index])
    except BaseException:
        fetcher.close()
        raise


def reopen_cached(source_url: str, path: Path, spec: RemoteSpec) -> CachedDataset:
    """Hold a version already opened elsewhere (a dataset unpickled in a worker), without the network.

    When the version is in the cache (its manifest matches the version's name), no request is made:
    a worker starts while the store is unreachable, reads the shards already there, and fetches the
    others as it needs them, from the version it was handed, never a newer one written at the same
    URL since. A version evicted meanwhile is opened again; if the URL now holds another version, a
    RemoteError says the dataset changed.
    """
    try:
        with cache_lock(spec.cache_dir):  # a copy handed to a process after a restart trusts no unsynced shard
            check_boot(spec.cache_dir)
    except OSError as err:
        raise RemoteError(f"cache {spec.cache_dir}: {err.strerror or err} (opening {redact(source_url)})") from None
    try:
        if hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()[:16] == path.name:
            load_manifest(path)
            return CachedDataset(source_url, path, hold_for_reading(path), spec)
    except (DatasetError, OSError):
        pass  # evicted or damaged: open it again below
    cached = open_remote(source_url, None, spec)
    if cached.path != path:
        cached.release()
        raise RemoteError(f"{redact(source_url)}: the dataset changed in storage since this copy of it was opened "
                          f"(another manifest); open it again")
    return cached


def _place_manifest(version: Path, manifest_bytes: bytes) -> None:
    """Write the version's manifest (atomically, fsynced) unless the same bytes are already there.

    Its directories are made private, and a link planted at their names is refused (``real_dir``).
    """
    cache_dir = version.parent.parent
    real_dir(cache_dir, version.parent.name, version.name, create=True)
    target = version / MANIFEST_NAME
    for stale in version.glob(f".{MANIFEST_NAME}.part-*"):  # an earlier writer's, interrupted (we hold the lock)
        unlink_in(cache_dir, stale)
    try:
        if is_real_file(target) and target.read_bytes() == manifest_bytes:  # (a link there is replaced)
            return
    except OSError:
        pass
    part = version / f".{MANIFEST_NAME}.part-{os.getpid()}-{threading.get_ident()}"
    with open_new(part) as f:
        f.write(manifest_bytes)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, target)
