"""The local cache of remote datasets: where it is, how large it may grow, and filling it safely.

Layout: ``<cache_dir>/<name>-<hash of the URL>/<hash of the manifest>/`` holds one remote dataset as
a local one (its ``manifest.json`` and shard files under their manifest names), so everything that
reads a local dataset reads it unchanged. A new manifest at the same URL (the dataset rewritten) gets
a directory of its own; shards are never mixed across versions.

Trust: a file appears under its final name only after its bytes matched the manifest's size and
``xxh3-128`` hash (downloaded to ``<name>.part-<pid>``, checked, renamed). A torn download (a
crash, Ctrl-C, a full disk) leaves only a ``.part`` file, which the next holder of the lock deletes.

Durability is scoped to the boot on Linux: a download is not fsynced (the fsync was a quarter of a
shard's download here), because until the machine restarts every process reads it from the page
cache, whole. ``<cache_dir>/.fastload-boot`` holds the boot (``/proc/sys/kernel/random/boot_id``)
whose unsynced files the cache may hold; the first open after a restart (a power loss may have
left a renamed file's blocks unwritten) renames the shards of every version nobody reads to
``.<name>.unverified`` (``check_boot``), and each is hashed again before it is used (kept when it
matches, downloaded again when not). Windowed versions' shards are deleted instead (they come and
go anyway). Elsewhere (no boot id) each download is fsynced before its rename.

Sharing: processes on one node (ranks, DataLoader workers) share the cache. Making room (eviction)
and placing a version's manifest are serialised by the cache-wide lock ``.fastload-cache.lock``; each
shard is downloaded under its own lock ``<version dir>/.<shard file>.lock`` (one process downloads it,
the others wait and then find the file), so different shards download at once, from one process or
several. A process reading a dataset holds a shared lock on ``<version dir>/.readers.lock`` for as
long as it reads, and eviction deletes only versions whose readers lock it can take exclusively, so a
shard being read is never deleted or replaced under a reader.

Accounting, eviction and room by need are ``storage/_room.py``'s; links and permissions
``storage/_cache_fs.py``'s (nothing below ``cache_dir`` is reached through a link).

Windows of a version: a version larger than the room ``cache_limit`` leaves it (after evicting the
versions nobody reads) is opened *windowed*: it may hold ``<version dir>/.window`` bytes (what its
loaders claimed, ``storage/_room.py``), and counts at that. Its shards then come and go: before a
shard is downloaded, room is made for it under the cache lock (``storage/_window.py``: shards of the
version that no process holds, the one needed latest first), and its ``.part`` file is created at its
full size (sparse), so downloads in flight count at their full size in every process's sum. A process
reading a shard of a windowed version holds a shared lock on ``<version dir>/.<shard file>.readers``
(``hold_shard``); eviction deletes a shard only when it takes that lock exclusively.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

from ..errors import ArgumentError, ArgumentTypeError, DatasetError, FastloadWarning, RemoteError
from ..format._manifest import HASH_ALGORITHM, ShardInfo, file_hash, load_manifest
from ..format._page_cache import write_aligned
from ._cache_fs import check_cache_dir, foreign_dir, is_real_file, open_existing, open_new, real_dir, unlink_in
from ._client import RemoteRoot, Retries, TransientError
from ._locks import FileLock
from ._urls import redact

CACHE_DIR_ENV = "FASTLOAD_CACHE_DIR"
BOOT_MARKER_NAME = ".fastload-boot"  # the boot whose unsynced downloads the cache may hold
UNVERIFIED_SUFFIX = ".unverified"  # a shard from before a restart, hashed again before use
_ATTEMPTS = itertools.count()  # makes every download's temporary name unique within the process
CACHE_LOCK_NAME = ".fastload-cache.lock"
READERS_LOCK_NAME = ".readers.lock"
WINDOW_NAME = ".window"  # in a windowed version: the bytes it may hold
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class DownloadStopped(Exception):
    """A download given up because another failed or the caller was interrupted (never shown to users)."""


class CacheDiskError(RemoteError):
    """The cache's own disk failed (full, read-only, removed): not retried, unlike a transfer."""


def default_cache_dir() -> Path:
    """Return ``$FASTLOAD_CACHE_DIR``, else the per-user cache directory's ``fastload`` folder."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "fastload" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "fastload"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastload"


def parse_cache_limit(limit: int | str | None) -> int | None:
    """Return ``cache_limit`` in bytes: None (unbounded), an int of bytes, or a string such as ``"50GB"``."""
    if limit is None:
        return None
    if isinstance(limit, bool):
        raise ArgumentTypeError(f"cache_limit must be bytes (an int) or a size such as '50GB', not {limit!r}")
    if isinstance(limit, int):
        value = limit
    elif isinstance(limit, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*", limit)
        if match is None or match.group(2).upper() not in _UNITS:
            raise ArgumentError(f"cache_limit={limit!r} is not a size; write e.g. '50GB', '512MiB' or bytes as an int")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    else:
        raise ArgumentTypeError(f"cache_limit must be bytes (an int) or a size such as '50GB', not "
                                f"{type(limit).__name__}")
    if value <= 0:
        raise ArgumentError(f"cache_limit must be positive, not {limit!r}")
    return value


def version_dir(cache_dir: Path, url: str, manifest_bytes: bytes) -> Path:
    """Return the cache directory of one version (URL and manifest) of a remote dataset."""
    shown = redact(url).split("://", 1)[-1]  # no user information or query (tokens) in a directory name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", shown).strip("-.")[-48:] or "dataset"
    url_key = hashlib.sha256(redact(url).rstrip("/").encode()).hexdigest()[:16]
    return cache_dir / f"{name}-{url_key}" / hashlib.sha256(manifest_bytes).hexdigest()[:16]


def boot_id() -> str | None:
    """Return the id of this boot of the machine (Linux), or None where there is none (downloads are fsynced)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


# Where the machine has a boot id, downloads are not fsynced: the first open after a restart demotes them.
SYNC_BY_BOOT = boot_id() is not None


def unverified_path(path: Path) -> Path:
    """Return where shard file ``path`` lies while it waits to be hashed again (after a restart)."""
    return path.with_name(f".{path.name}{UNVERIFIED_SUFFIX}")


def check_boot(cache_dir: Path, current: str | None = None) -> None:
    """Demote the shards a restart may have torn; call with the cache lock held, before any download.

    When ``cache_dir``'s boot marker names another boot than this one (or none: a new cache, or one
    an older fastload wrote), the shards of each version no process reads are renamed
    ``.<name>.unverified`` (deleted, for a windowed version) and the marker is set to this boot. A
    version a process reads is left alone: that process opened it in this boot, after this check.
    """
    current = boot_id() if current is None else current
    if current is None:
        return
    marker = cache_dir / BOOT_MARKER_NAME
    try:
        with open(marker, "rb") as f:
            if f.read(256).strip() == current.encode("ascii", "replace"):  # (a boot id is 36 characters)
                return
    except OSError:
        pass
    for version in cached_versions(cache_dir):
        lock = FileLock.try_exclusive(version / READERS_LOCK_NAME)
        if lock is None:  # being read
            continue
        with lock:
            windowed = window_bytes(version) is not None
            for name in _shard_names(version):
                path = version / name
                if is_real_file(path):
                    if windowed:
                        path.unlink(missing_ok=True)
                    else:
                        os.replace(path, unverified_path(path))
    part = cache_dir / f"{BOOT_MARKER_NAME}.part-{os.getpid()}-{threading.get_ident()}-{next(_ATTEMPTS)}"
    with open_new(part) as f:
        f.write(current.encode("ascii", "replace"))
        f.flush()
        os.fsync(f.fileno())  # the demotions are renames: durable before (or with) this marker, never after
    os.replace(part, marker)


def cache_lock(cache_dir: Path) -> FileLock:
    """Take the cache-wide lock (blocking): one process fills or evicts at a time.

    ``cache_dir`` is created private when missing, and refused when others could plant files in it
    (``storage/_cache_fs.py``).
    """
    check_cache_dir(cache_dir)
    try:
        return FileLock(cache_dir / CACHE_LOCK_NAME, exclusive=True)
    except OSError as err:
        raise RemoteError(f"cache directory {cache_dir}: {err.strerror or err}") from None


def shard_lock(version: Path, file: str) -> FileLock:
    """Take the lock under which one shard of a version is downloaded (blocking)."""
    try:
        return FileLock(version / f".{file}.lock", exclusive=True)
    except OSError as err:
        raise CacheDiskError(f"cache file {version / f'.{file}.lock'}: {err.strerror or err}") from None


def hold_for_reading(version: Path) -> FileLock:
    """Take a shared lock on a cached version: eviction leaves it alone while the lock is held."""
    return FileLock(version / READERS_LOCK_NAME, exclusive=False)


def hold_shard(version: Path, file: str, size: int) -> FileLock | None:
    """Hold shard ``file`` of a windowed version against eviction: the lock, or None when it is not whole there.

    The caller keeps the lock for as long as it reads the shard (mapped, attached) and releases it after.
    """
    try:
        lock = FileLock(version / f".{file}.readers", exclusive=False)
    except OSError as err:
        raise CacheDiskError(f"cache file {version / f'.{file}.readers'}: {err.strerror or err}") from None
    if is_whole(version / file, size):
        return lock
    lock.release()
    return None


def window_bytes(version: Path) -> int | None:
    """Return the bytes a windowed version may hold, or None when it has room for all its shards."""
    try:
        window = int((version / WINDOW_NAME).read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return window if window > 0 else None  # damaged: the version is rewritten whole by the next open


def set_window(version: Path, window: int | None) -> None:
    """Record the bytes windowed ``version`` may hold (None: it is not windowed); call with the cache lock held."""
    if window is None:
        (version / WINDOW_NAME).unlink(missing_ok=True)
        return
    part = version / f"{WINDOW_NAME}.part-{os.getpid()}-{threading.get_ident()}-{next(_ATTEMPTS)}"
    with open_new(part) as f:
        f.write(str(window).encode("ascii"))
    os.replace(part, version / WINDOW_NAME)


def shard_sizes(version: Path) -> list[int]:
    """Return the sizes of a version's shards as its manifest lists them (none when it is damaged)."""
    try:
        doc = json.loads((version / "manifest.json").read_bytes())
        return [int(s["bytes"]) for s in doc["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _shard_names(version: Path) -> list[str]:
    """Return the shard file names of a version's validated manifest (none when it is damaged: rewritten on open)."""
    try:
        return [shard.file for shard in load_manifest(version).shards]
    except (DatasetError, OSError):
        return []


_VERSION_DIR = re.compile(r"[A-Za-z0-9._-]*-[0-9a-f]{16}")
_VERSION = re.compile(r"[0-9a-f]{16}")


def cached_versions(cache_dir: Path) -> list[Path]:
    """Return the dataset versions in the cache: only the directories fastload made.

    That is ``<name>-<hash>/<hash>`` holding a manifest and a readers lock, never anything else a
    user keeps under ``cache_dir``, and never through a symbolic link: a link where a dataset or a
    version directory would be is left alone, with a warning naming it (``storage/_cache_fs.py``).
    """
    found = []
    for dataset in _entries(cache_dir):
        if not _VERSION_DIR.fullmatch(dataset.name) or not _real_dir_entry(cache_dir, dataset):
            continue
        for version in _entries(Path(dataset.path)):
            if (_VERSION.fullmatch(version.name) and _real_dir_entry(cache_dir, version)
                    and is_real_file(Path(version.path) / READERS_LOCK_NAME)
                    and is_real_file(Path(version.path) / "manifest.json")):
                found.append(Path(version.path))
    return found


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:
        return []


def _real_dir_entry(cache_dir: Path, entry: os.DirEntry[str]) -> bool:
    """Return whether ``entry`` is a directory itself; warn (once per name) when it is a link planted there."""
    try:
        if entry.is_symlink():
            if entry.path not in _WARNED:
                _WARNED.add(entry.path)
                warnings.warn(f"cache {cache_dir}: {entry.path} is a symbolic link where fastload keeps its dataset "
                              f"directories: not followed, never evicted through; remove it (someone else may have "
                              f"planted it)", FastloadWarning, stacklevel=3)
            return False
        if not entry.is_dir(follow_symlinks=False):
            return False
        foreign = foreign_dir(entry.stat(follow_symlinks=False))
        if foreign and entry.path not in _WARNED:
            _WARNED.add(entry.path)
            warnings.warn(f"cache {cache_dir}: {entry.path}: not taken for one of fastload's directories, {foreign}",
                          FastloadWarning, stacklevel=3)
        return not foreign
    except OSError:
        return False


_WARNED: set[str] = set()  # links and foreign directories already named in a warning, by this process


def last_used(version: Path) -> float:
    """Return when a version was last opened (its readers lock's mtime; eviction takes the oldest first)."""
    try:
        return (version / READERS_LOCK_NAME).stat().st_mtime
    except OSError:
        return 0.0


def is_whole(path: Path, size: int) -> bool:
    """Return whether ``path`` is a file of ``size`` bytes: a shard under its final name is whole (it was checked).

    A link is never whole: a download replaces it (the rename replaces the link, never its target).
    """
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == size


class NoRoom(Exception):
    """No room yet for a shard in its windowed version (never shown to users: the fetcher tries again)."""


def fetch_shard(root: RemoteRoot, version: Path, shard: ShardInfo, attempts: int = 3,
                stop: threading.Event | None = None, reserve: Callable[[Path], bool] | None = None,
                progress: Callable[[int], None] | None = None) -> Path:
    """Return the cached shard, downloading it first when absent; its bytes always match the manifest.

    Call with the shard's lock held (``shard_lock``). A download that fails for a transient reason (a
    refused or dropped connection, a 5xx, a body broken off after obstore's own resumptions) starts
    again from the start, with backoff, within the request budget (``Retries``: ``max_retries``,
    ``retry_timeout_s``); ``stop`` ends the waits at once (DownloadStopped). One whose bytes do not
    match the manifest (truncated, corrupt, the object replaced) is fetched again, ``attempts`` times
    in all. Then a RemoteError names the URL once, with the attempts and the time. A missing object
    and a refused permission are not retried. ``reserve(part)`` (a windowed version's,
    ``storage/_window.py``) makes room and creates the ``.part`` file at the shard's full size, or
    returns False (raised here as NoRoom). ``progress(size)`` is called for each chunk received (on this
    thread), retried downloads included: what the link delivered, not what the shard kept.
    """
    dest = version / shard.file
    if is_whole(dest, shard.bytes):
        return dest
    if _reverified(dest, shard):  # from before a restart: hashed again, and kept
        return dest
    cache_dir = version.parent.parent
    real_dir(cache_dir, version.parent.name, version.name, create=True)  # no link on the way (storage/_cache_fs.py)
    for stale in dest.parent.glob(dest.name + ".part-*"):  # torn downloads of a process that ended
        unlink_in(cache_dir, stale)
    part = dest.with_name(f"{dest.name}.part-{os.getpid()}-{threading.get_ident()}-{next(_ATTEMPTS)}")
    try:
        if reserve is not None:
            if not reserve(part):
                raise NoRoom(shard.file)
        else:
            open_new(part).close()
    except OSError as err:
        raise CacheDiskError(f"cache file {part}: {err.strerror or err} "
                             f"(downloading {root.url_of(shard.file)})") from None
    try:
        retries, mismatches = Retries(root.options.retries), 0
        while True:
            try:
                problem = _download(root, shard, dest, part, stop, progress)
            except TransientError as err:  # not the cache's disk (CacheDiskError), not a 404 or 403: raised
                if retries.wait(stop):
                    continue
                if stop is not None and stop.is_set():
                    raise DownloadStopped(shard.file) from None
                raise retries.failed(err) from None
            if not problem:
                return dest
            mismatches += 1
            if mismatches >= attempts:
                raise RemoteError(f"{root.url_of(shard.file)}: {problem}; the object does not match its dataset's "
                                  f"manifest (tried {attempts} times): run `fastload verify {redact(root.url)}` to "
                                  "check the dataset in storage, or write it again")
    finally:
        part.unlink(missing_ok=True)


def _reverified(dest: Path, shard: ShardInfo) -> bool:
    """Return whether shard ``dest``'s copy from before a restart matched the manifest and is now ``dest``.

    A copy that does not match (a power loss tore it) is deleted: the shard is downloaded again.
    """
    held = unverified_path(dest)
    if not is_real_file(held):
        return False
    try:
        good = held.stat().st_size == shard.bytes and file_hash(held) == shard.hash
        if good:
            os.replace(held, dest)
        else:
            held.unlink(missing_ok=True)
    except OSError as err:
        raise CacheDiskError(f"cache file {held}: {err.strerror or err}") from None
    return good


def _download(root: RemoteRoot, shard: ShardInfo, dest: Path, part: Path, stop: threading.Event | None,
              progress: Callable[[int], None] | None = None) -> str:
    """Download ``shard`` into ``part`` (from its start) and rename it ``dest``; return '' or the problem.

    The problem: its size or hash do not match the manifest's.
    """
    digest = xxhash.xxh3_128()
    size = 0

    def checked_chunks() -> Iterator[memoryview]:
        nonlocal size
        for chunk in root.stream(shard.file, retry=False):  # fetch_shard tries the download again
            size += len(chunk)
            if size > shard.bytes:
                return  # said below
            if stop is not None and stop.is_set():
                raise DownloadStopped(shard.file)
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
            yield chunk

    try:
        with open_existing(part) as f:  # never through a link planted under its name since it was made
            write_aligned(f, checked_chunks())  # 2 MiB folios in the page cache, where the filesystem makes them
            if size > shard.bytes:
                return f"more than the manifest's {shard.bytes} bytes"
            f.truncate(size)  # a reservation at full size, or an earlier attempt's bytes, end here
            if not SYNC_BY_BOOT:  # (on Linux a restart demotes it instead: check_boot)
                os.fsync(f.fileno())
        if size != shard.bytes:
            return f"{size} bytes, the manifest says {shard.bytes}"
        if f"{HASH_ALGORITHM}:{digest.hexdigest()}" != shard.hash:
            return "content hash differs from the manifest's"
        if stop is not None and stop.is_set():  # given up (Ctrl-C): the caller may no longer hold the lock
            raise DownloadStopped(shard.file)
        os.replace(part, dest)
        return ""
    except OSError as err:  # the cache's disk: full, read-only, gone
        raise CacheDiskError(f"cache file {part}: {err.strerror or err} "
                             f"(downloading {root.url_of(shard.file)})") from None


def touch(path: Path) -> None:
    """Mark a cached version as used now (eviction takes the least recently used first)."""
    try:
        os.utime(path, (time.time(), time.time()), follow_symlinks=False)
    except OSError:
        pass
