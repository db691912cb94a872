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

Accounting: a version counts toward ``cache_limit`` at the size of all its shards from the moment its
manifest is placed (room is made for the whole version when it is opened), whether its shards are
downloaded yet or not, so versions filled lazily by several processes never overrun the bound.

Windows of a version: a version larger than the room ``cache_limit`` leaves it (after evicting the
versions nobody reads) is opened *windowed*: it may hold ``<version dir>/.window`` bytes (the room
there was), and counts at that. Its shards then come and go: before a shard is downloaded, room is
made for it under the cache lock (``storage/_window.py``: shards of the version that no process
holds, the one needed latest first), and its ``.part`` file is created at its full size (sparse), so
downloads in flight count at their full size in every process's sum. A process reading a shard of a
windowed version holds a shared lock on ``<version dir>/.<shard file>.readers`` (``hold_shard``);
eviction deletes a shard only when it takes that lock exclusively.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

from ..errors import ArgumentError, ArgumentTypeError, DatasetError, RemoteError, RemoteNotFoundError
from ..format._manifest import HASH_ALGORITHM, ShardInfo, file_hash, load_manifest
from ..format._page_cache import write_aligned
from ._client import RemoteRoot
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
                if path.is_file():
                    if windowed:
                        path.unlink(missing_ok=True)
                    else:
                        os.replace(path, unverified_path(path))
    part = cache_dir / f"{BOOT_MARKER_NAME}.part-{os.getpid()}-{threading.get_ident()}"
    with open(part, "w", encoding="ascii") as f:
        f.write(current)
        f.flush()
        os.fsync(f.fileno())  # the demotions are renames: durable before (or with) this marker, never after
    os.replace(part, marker)


def cache_lock(cache_dir: Path) -> FileLock:
    """Take the cache-wide lock (blocking): one process fills or evicts at a time."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
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


def _set_window(version: Path, window: int | None) -> None:
    if window is None:
        (version / WINDOW_NAME).unlink(missing_ok=True)
        return
    part = version / f"{WINDOW_NAME}.part-{os.getpid()}"
    part.write_text(str(window))
    os.replace(part, version / WINDOW_NAME)


def committed_bytes(cache_dir: Path, leaving_out: Path | None = None) -> int:
    """Return the bytes the cache holds or has promised: each version at least at the size it may grow to.

    ``leaving_out``: a version not counted (the one room is being made for); its files are not counted as
    lying outside versions either.
    """
    versions = set(cached_versions(cache_dir))
    if leaving_out is not None:
        versions.add(leaving_out)
    outside, sizes = _bytes_by_version(cache_dir, versions)
    return outside + sum(max(size, _promised(v)) for v, size in sizes.items() if v != leaving_out)


def _bytes_by_version(cache_dir: Path, versions: set[Path]) -> tuple[int, dict[Path, int]]:
    """Return the bytes of the files outside ``versions`` and those of each version, from one walk of the cache.

    One walk, not one of the cache and one per version subtracted from it: a download is renamed from its
    ``.part`` name with no lock held, and a name listed before the rename and looked up after it is missed.
    Missed by one walk and counted by another, it took one shard off the bytes outside versions (below
    zero), and a windowed version's room came out one shard larger than ``cache_limit`` allows.
    """
    sizes = dict.fromkeys(versions, 0)
    outside = 0
    for dirpath, _, files in os.walk(cache_dir):
        parts = Path(dirpath).relative_to(cache_dir).parts
        version = cache_dir / parts[0] / parts[1] if len(parts) >= 2 else None
        bytes_here = 0
        for name in files:
            try:
                bytes_here += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:  # removed (or renamed) meanwhile
                pass
        if version in sizes:
            sizes[version] += bytes_here
        else:
            outside += bytes_here
    return outside, sizes


def _promised(version: Path) -> int:
    """Return the bytes a version may grow to: its shards' full size and its own files, or its window."""
    window = window_bytes(version)
    full = _full_size(version) + _meta_bytes(version)
    return full if window is None else min(full, window)


def _meta_bytes(version: Path) -> int:
    """Return the bytes of a version's own files: its manifest, and room for its ``.window``."""
    try:
        return (version / "manifest.json").stat().st_size + 32
    except OSError:
        return 32


def _full_size(version: Path) -> int:
    return sum(_shard_sizes(version))  # a damaged manifest: 0, it counts at what it holds


def make_room(cache_dir: Path, keep: Path, limit: int | None) -> int | None:
    """Make room for version ``keep`` within ``limit``; return its window, or None when all its shards fit.

    Call with the cache lock held. Cached versions nobody reads are evicted, least recently used
    first, until ``keep`` fits whole. When it cannot (the versions in use and ``limit`` leave too
    little room), ``keep`` is windowed: it may hold the room there is (recorded in its ``.window``),
    and its shards are evicted one by one as they are read (``storage/_window.py``). Raise
    RemoteError when that room cannot hold its largest shard, and on Windows (where no shard can
    be evicted under a reader's mapping) whenever the version does not fit whole.
    """
    if limit is None:
        _set_window(keep, None)
        return None
    full = _full_size(keep) + _meta_bytes(keep)  # the shards and the version's own files (its manifest)
    largest = max((int(s) for s in _shard_sizes(keep)), default=0) + _meta_bytes(keep)

    def others() -> int:  # every other version at what it may grow to, and what lies outside versions
        return committed_bytes(cache_dir, leaving_out=keep)

    used = others()
    for version in sorted(cached_versions(cache_dir), key=_last_used):
        if used + full <= limit:
            break
        if version == keep:
            continue
        lock = FileLock.try_exclusive(version / READERS_LOCK_NAME)
        if lock is None:  # being read
            continue
        with lock:
            shutil.rmtree(version, ignore_errors=True)
        used = others()  # what is really gone (a file another system keeps open stays)
    if used + full <= limit:
        _set_window(keep, None)
        return None
    room = limit - used
    if room < largest or sys.platform == "win32":
        held = f"; {used} bytes are held by datasets in use" if used else ""
        raise RemoteError(f"cache {cache_dir}: cache_limit={limit} bytes{held}, which leaves {max(room, 0)} bytes "
                          f"for this dataset's {full} bytes of shards"
                          + (f" (its largest shard and its manifest are {largest} bytes; "
                             "a dataset larger than its room is read a window of shards at a time, "
                             "which needs room for its largest shard at least)" if sys.platform != "win32" else
                             " (on Windows a dataset must fit its cache whole)")
                          + "; raise cache_limit or leave it unset")
    _set_window(keep, room)
    for leftover in keep.glob(f".*{UNVERIFIED_SUFFIX}"):  # a windowed version's shards come and go: not kept whole
        leftover.unlink(missing_ok=True)
    return room


def _shard_sizes(version: Path) -> list[int]:
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
    user keeps under ``cache_dir``.
    """
    found = []
    for dataset in cache_dir.iterdir():
        if not (dataset.is_dir() and _VERSION_DIR.fullmatch(dataset.name)):
            continue
        for version in dataset.iterdir():
            if (version.is_dir() and _VERSION.fullmatch(version.name) and (version / READERS_LOCK_NAME).is_file()
                    and (version / "manifest.json").is_file()):
                found.append(version)
    return found


def _last_used(version: Path) -> float:
    try:
        return (version / READERS_LOCK_NAME).stat().st_mtime
    except OSError:
        return 0.0


def is_whole(path: Path, size: int) -> bool:
    """Return whether ``path`` is a file of ``size`` bytes: a shard under its final name is whole (it was checked)."""
    try:
        return path.is_file() and path.stat().st_size == size
    except OSError:
        return False


class NoRoom(Exception):
    """No room yet for a shard in its windowed version (never shown to users: the fetcher tries again)."""


def fetch_shard(root: RemoteRoot, version: Path, shard: ShardInfo, attempts: int = 3,
                stop: threading.Event | None = None, reserve: Callable[[Path], bool] | None = None) -> Path:
    """Return the cached shard, downloading it first when absent; its bytes always match the manifest.

    Call with the shard's lock held (``shard_lock``). A download that does not match (truncated, corrupt, the object
    replaced) or breaks off (a dropped connection after obstore's own retries) is fetched again,
    ``attempts`` times in all, then a RemoteError names the URL. A missing object is not retried.
    ``reserve(part)`` (a windowed version's, ``storage/_window.py``) makes room and creates the
    ``.part`` file at the shard's full size, or returns False (raised here as NoRoom).
    """
    dest = version / shard.file
    if is_whole(dest, shard.bytes):
        return dest
    if _reverified(dest, shard):  # from before a restart: hashed again, and kept
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(dest.name + ".part-*"):  # torn downloads of a process that ended
        stale.unlink(missing_ok=True)
    part = dest.with_name(f"{dest.name}.part-{os.getpid()}-{threading.get_ident()}-{next(_ATTEMPTS)}")
    try:
        if reserve is not None:
            if not reserve(part):
                raise NoRoom(shard.file)
        else:
            part.touch()
    except OSError as err:
        raise CacheDiskError(f"cache file {part}: {err.strerror or err} "
                             f"(downloading {root.url_of(shard.file)})") from None
    try:
        problem = ""
        for _ in range(attempts):
            try:
                problem = _download(root, shard, dest, part, stop)
            except RemoteNotFoundError:
                raise
            except RemoteError as err:  # the transfer failed (not the cache's disk: that is CacheDiskError)
                if isinstance(err, CacheDiskError):
                    raise
                problem = str(err)
                continue
            if not problem:
                return dest
            problem += "; the object does not match its dataset's manifest"
        raise RemoteError(f"{root.url_of(shard.file)}: {problem} (tried {attempts} times)")
    finally:
        part.unlink(missing_ok=True)


def _reverified(dest: Path, shard: ShardInfo) -> bool:
    """Return whether shard ``dest``'s copy from before a restart matched the manifest and is now ``dest``.

    A copy that does not match (a power loss tore it) is deleted: the shard is downloaded again.
    """
    held = unverified_path(dest)
    if not held.is_file():
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


def _download(root: RemoteRoot, shard: ShardInfo, dest: Path, part: Path, stop: threading.Event | None) -> str:
    """Download ``shard`` into ``part`` (from its start) and rename it ``dest``; return '' or the problem.

    The problem: its size or hash do not match the manifest's.
    """
    digest = xxhash.xxh3_128()
    size = 0

    def checked_chunks() -> Iterator[memoryview]:
        nonlocal size
        for chunk in root.stream(shard.file):
            size += len(chunk)
            if size > shard.bytes:
                return  # said below
            if stop is not None and stop.is_set():
                raise DownloadStopped(shard.file)
            digest.update(chunk)
            yield chunk

    try:
        with open(part, "r+b", buffering=0) as f:
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
        os.utime(path, (time.time(), time.time()))
    except OSError:
        pass
