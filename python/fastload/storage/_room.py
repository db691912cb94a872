"""The cache's room under ``cache_limit``: what each version holds or has promised, eviction, and claims by need.

Accounting: a version counts toward ``cache_limit`` at the size of all its shards from the moment its
manifest is placed (room is made for the whole version when it is opened), whether its shards are
downloaded yet or not, so versions filled lazily by several processes never overrun the bound. A
windowed version counts at its window (``<version>/.window``), or at what it holds when that is more.
The cache's own files at its top (``.fastload-boot``, the cache lock) are a few bytes and not counted.

Room by need, not by who came first: a version larger than the room there is (after evicting the
versions nobody reads) is opened *windowed*. A loader claims the room its order needs
(:func:`claim_room`: ``2 K`` shards for ``shuffle_window=K``, 2 in stored order) in a file
``<version>/.claim-<pid>-<n>`` that it holds a shared lock on for as long as it lives; the
version's window is then the sum of its live claims (a claim whose lock is free belongs to a
process that ended, and is deleted), not all the room there is. So several datasets and processes
that fit together all run, whichever opens first. Until a claim is made (a ``ShardDataset`` read
directly, or by a user's own DataLoader whose worker count nobody tells the cache) the version may
hold the room there was when it was opened, as before. One that does not fit waits up to
``ROOM_WAIT_S`` for the versions in use to let go, then a RemoteError names every holder and what
each holds.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import ArgumentError, RemoteError
from ._cache import (
    READERS_LOCK_NAME,
    UNVERIFIED_SUFFIX,
    cache_lock,
    cached_versions,
    last_used,
    set_window,
    shard_sizes,
    window_bytes,
)
from ._cache_fs import open_new, remove_tree, unlink_in
from ._locks import FileLock

ROOM_WAIT_S = 60.0  # how long an open or a claim waits for the versions in use to let go of room
_ROOM_POLL_S = 0.25  # it looks again this often (the cache lock is free in between)
CLAIM_PREFIX = ".claim-"
_OWN_FILES = (".fastload-",)  # the cache's own files at its top: a few bytes, not counted
_CLAIMS = itertools.count()
T = TypeVar("T")


class RoomHeld(RemoteError):
    """No room now, but versions in use hold room that they may let go of: waiting may help."""


def committed_bytes(cache_dir: Path, leaving_out: Path | None = None) -> int:
    """Return the bytes the cache holds or has promised: each version at least at the size it may grow to.

    ``leaving_out``: a version not counted (the one room is being made for); its files are not counted as
    lying outside versions either.
    """
    outside, held = _holdings(cache_dir, leaving_out)
    return outside + sum(held.values())


def _holdings(cache_dir: Path, leaving_out: Path | None) -> tuple[int, dict[Path, int]]:
    """Return (the bytes of the files outside versions, each other version's bytes at least at its promise).

    Call with the cache lock held: a windowed version's window first shrinks to the claims still live.
    """
    versions = set(cached_versions(cache_dir))
    for version in versions - {leaving_out}:
        _shrink_window(version)
    if leaving_out is not None:
        versions.add(leaving_out)
    outside, sizes = _bytes_by_version(cache_dir, versions)
    return outside, {v: max(size, _promised(v)) for v, size in sizes.items() if v != leaving_out}


def _bytes_by_version(cache_dir: Path, versions: set[Path]) -> tuple[int, dict[Path, int]]:
    """Return the bytes of the files outside ``versions`` and those of each version, from one walk of the cache.

    One walk, not one of the cache and one per version subtracted from it: a download is renamed from its
    ``.part`` name with no lock held, and a name listed before the rename and looked up after it is missed.
    Missed by one walk and counted by another, it took one shard off the bytes outside versions (below
    zero), and a windowed version's room came out one shard larger than ``cache_limit`` allows. Links
    count as themselves (never followed), and the cache's own files at its top not at all.
    """
    sizes = dict.fromkeys(versions, 0)
    outside = 0
    for dirpath, _, files in os.walk(cache_dir):
        parts = Path(dirpath).relative_to(cache_dir).parts
        version = cache_dir / parts[0] / parts[1] if len(parts) >= 2 else None
        bytes_here = 0
        for name in files:
            if not parts and name.startswith(_OWN_FILES):
                continue
            try:
                bytes_here += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:  # removed (or renamed) meanwhile
                pass
        if version in sizes:
            sizes[version] += bytes_here
        else:
            outside += bytes_here
    return outside, sizes


def meta_bytes(version: Path) -> int:
    """Return the bytes of a version's own files: its manifest, and room for its ``.window``."""
    try:
        return (version / "manifest.json").stat().st_size + 32
    except OSError:
        return 32


def _full(version: Path) -> int:
    """Return the bytes of a version whole: its shards (0 for a damaged manifest) and its own files."""
    return sum(shard_sizes(version)) + meta_bytes(version)


def _one_shard(version: Path) -> int:
    """Return the room a windowed version needs at least: its largest shard and its own files."""
    return max(shard_sizes(version), default=0) + meta_bytes(version)


def _promised(version: Path) -> int:
    """Return the bytes a version may grow to: whole, or its window."""
    window = window_bytes(version)
    full = _full(version)
    return full if window is None else min(full, window)


def live_claims(version: Path, leaving_out: Path | None = None) -> int:
    """Return the bytes the live claims on windowed ``version`` need; delete the claims of processes that ended.

    Call with the cache lock held. ``leaving_out``: a claim not counted (one being replaced).
    """
    total = 0
    for name in sorted(_names(version)):
        if not name.startswith(CLAIM_PREFIX):
            continue
        path = version / name
        if path == leaving_out:
            continue
        try:
            free = FileLock.try_exclusive(path) if sys.platform != "win32" else None
        except (OSError, RemoteError):  # another user's claim this one may not open (a shared cache): live
            free = None
        if free is not None:  # its owner ended
            with free:
                unlink_in(version.parent.parent, path)
            continue
        try:
            total += max(0, int(path.read_text(encoding="ascii")))
        except (OSError, ValueError, UnicodeDecodeError):
            pass
    return total


def _evict_idle(cache_dir: Path, keep: Path, limit: int, need: int) -> int:
    """Evict versions nobody reads, least recently used first, until ``need`` more bytes fit; return the bytes used.

    The bytes used are every version but ``keep`` at what it may grow to, and the files outside versions.
    """
    used = committed_bytes(cache_dir, leaving_out=keep)
    for version in sorted(cached_versions(cache_dir), key=last_used):
        if used + need <= limit:
            break
        if version == keep:
            continue
        lock = FileLock.try_exclusive(version / READERS_LOCK_NAME)
        if lock is None:  # being read
            continue
        with lock:
            remove_tree(cache_dir, version)  # never through a link planted in the cache
        used = committed_bytes(cache_dir, leaving_out=keep)  # what is really gone (a file kept open elsewhere stays)
    return used


def make_room(cache_dir: Path, keep: Path, limit: int | None) -> int | None:
    """Make room for version ``keep`` within ``limit``; return its window, or None when all its shards fit.

    Call with the cache lock held. Cached versions nobody reads are evicted, least recently used
    first, until ``keep`` fits whole. When it cannot, ``keep`` is windowed with the room its live
    claims need, or all the room there is before any (module docstring). Raise RoomHeld when
    versions in use leave less than one shard's room (waiting may help), RemoteError when ``limit``
    itself does, and on Windows
    (where no shard can be evicted under a reader's mapping) whenever the version does not fit whole.
    """
    if limit is None:
        set_window(keep, None)
        return None
    full = _full(keep)
    used = _evict_idle(cache_dir, keep, limit, full)
    if used + full <= limit:
        set_window(keep, None)
        return None
    room = limit - used
    claims = live_claims(keep)
    need = max(_one_shard(keep), claims + meta_bytes(keep))
    if room < need or sys.platform == "win32":
        what = ("a dataset larger than its room is read a window of shards at a time, which needs room for "
                f"{need} bytes now (its largest shard and its manifest, or what its readers claimed)"
                if sys.platform != "win32" else "on Windows a dataset must fit its cache whole")
        raise _no_room(cache_dir, keep, limit, f"this dataset's {full} bytes ({what})", room)
    window = min(room, need) if claims else room
    set_window(keep, window)
    for leftover in keep.glob(f".*{UNVERIFIED_SUFFIX}"):  # a windowed version's shards come and go: not kept whole
        unlink_in(cache_dir, leftover)
    return window


def room_ceiling(cache_dir: Path, version: Path, limit: int) -> int:
    """Return the most room for shards ``version`` could have: ``limit`` less the files outside versions and its own."""
    with cache_lock(cache_dir):
        outside, _ = _holdings(cache_dir, version)
        return limit - outside - meta_bytes(version)


def claim_room(cache_dir: Path, version: Path, limit: int, need: int,
               replacing: FileLock | None = None) -> FileLock | None:
    """Claim ``need`` bytes of shards for a reader of windowed ``version``; return the claim (None: not windowed).

    The claim holds until its lock is released (:func:`release_claim`, or the process ends; a forked
    child does not inherit it). The window grows to the live claims' sum (idle versions are evicted
    for it). ``replacing``: this reader's earlier claim, not counted, and let go of once the new one
    is made. When versions in use leave too little room, wait up to ``ROOM_WAIT_S`` for them to let
    go, then raise a RemoteError naming every holder.
    """
    if need < 0:
        raise ArgumentError(f"claim_room: need must be 0 or more bytes, not {need}")
    return waiting_for_room(cache_dir, lambda: _claim_now(cache_dir, version, limit, need, replacing))


def waiting_for_room(cache_dir: Path, attempt: Callable[[], T]) -> T:
    """Return ``attempt()`` (run with the cache lock held), tried again while it raises RoomHeld (``ROOM_WAIT_S``)."""
    deadline = time.monotonic() + ROOM_WAIT_S
    while True:
        try:
            with cache_lock(cache_dir):
                return attempt()
        except RoomHeld:
            if time.monotonic() >= deadline:
                raise
        time.sleep(_ROOM_POLL_S)


def _claim_now(cache_dir: Path, version: Path, limit: int, need: int, replacing: FileLock | None) -> FileLock | None:
    if window_bytes(version) is None:  # it counts whole: nothing to claim
        _let_go(cache_dir, replacing)
        return None
    full = _full(version)
    others = live_claims(version, leaving_out=None if replacing is None else replacing.path)
    want = min(full, max(_one_shard(version), others + need + meta_bytes(version)))
    used = _evict_idle(cache_dir, version, limit, want)
    if used + want > limit:
        raise _no_room(cache_dir, version, limit, f"{want} bytes for its readers' windows ({need} for this one's)",
                       limit - used)
    path = version / f"{CLAIM_PREFIX}{os.getpid()}-{threading.get_ident()}-{next(_CLAIMS)}"
    try:
        with open_new(path) as f:
            f.write(str(need).encode("ascii"))
        # Exclusive: its owner's alone (a forked child closes its copy, storage/_locks.py), live while held.
        claim = FileLock(path, exclusive=True, blocking=False)
    except OSError as err:
        raise RemoteError(f"cache file {path}: {err.strerror or err} (claiming room for {version.parent.name})") \
            from None
    _let_go(cache_dir, replacing)
    set_window(version, None if used + full <= limit else want)
    return claim


def _let_go(cache_dir: Path, claim: FileLock | None) -> None:
    """Release ``claim`` and delete its file (with the cache lock held)."""
    if claim is not None:
        claim.release()
        unlink_in(cache_dir, claim.path)


def release_claim(cache_dir: Path, version: Path, claim: FileLock) -> None:
    """Let go of ``claim`` on ``version``: its window shrinks to the live claims left (what it holds still counts)."""
    with cache_lock(cache_dir):
        _let_go(cache_dir, claim)
        _shrink_window(version, released=True)


def _shrink_window(version: Path, released: bool = False) -> None:
    """Shrink windowed ``version``'s window to what its live claims need (a claim's owner let go or ended).

    Call with the cache lock held. Shards it holds beyond the new window still count (at their size)
    until its reader evicts them. A version no claim was made on keeps its room, unless ``released``
    (its last claim was just let go of): then it keeps room for one shard.
    """
    window = window_bytes(version)
    if window is None or not (released or any(name.startswith(CLAIM_PREFIX) for name in _names(version))):
        return
    smaller = max(_one_shard(version), live_claims(version) + meta_bytes(version))
    if smaller < window:
        set_window(version, smaller)


def _names(version: Path) -> list[str]:
    try:
        return os.listdir(version)
    except OSError:
        return []


def _no_room(cache_dir: Path, keep: Path, limit: int, wanted: str, room: int) -> RemoteError:
    """Return the error for ``keep`` finding ``room`` bytes: RoomHeld, naming them, when versions in use hold room."""
    outside, held = _holdings(cache_dir, keep)
    holders = [f"{v.parent.name}/{v.name} ({size} bytes)" for v, size in sorted(held.items()) if size > 0]
    message = (f"cache {cache_dir}: cache_limit={limit} bytes leaves {max(room, 0)} bytes for {keep.parent.name}, "
               f"which needs {wanted}")
    if outside:
        message += f"; {outside} bytes lie in files of the cache that are not datasets"
    if holders:
        message += (f"; datasets in use hold the rest: {', '.join(holders)} (waited {ROOM_WAIT_S:g} s for them to "
                    "let go)")
    message += "; raise cache_limit, leave it unset, or read fewer datasets at once from this cache"
    return RoomHeld(message) if holders else RemoteError(message)
