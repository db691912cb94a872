"""Read-only LMDB environments shared within a process.

LMDB (and py-lmdb, which enforces it) allows one open environment per file
per process, so two ShardDatasets over the same directory must share. Each
environment is reference-counted and closed when its last user releases it.

A forked child (a ``fork`` DataLoader worker) inherits the parent's handles
and py-lmdb's record of them, so it cannot open the file again; it uses the
inherited handle instead. That is safe here because shards are opened
read-only with ``lock=False`` (MDB_NOLOCK): no lock file or reader table is
shared, a read transaction only reads the memory map.

Every shard is validated (``_lmdb_check.validate_shard``) before py-lmdb opens
it, once per process while its environment is open.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import lmdb

from ..errors import CorruptShardError, ShardNotFoundError
from ._lmdb_check import validate_shard

_lock = threading.Lock()
_open: dict[str, list] = {}  # real path -> [environment, users]
_deferred: list[str] = []  # releases not yet applied (see release())


def _open_checked(path: Path, expected_count: int) -> lmdb.Environment:
    # No LMDB code runs on a structure that was not validated first.
    validate_shard(str(path), expected_count)
    try:
        size = path.stat().st_size
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                        map_size=max(size, 1), max_dbs=0)
    except (lmdb.Error, OSError) as err:
        raise CorruptShardError(str(path), f"open: {path}: not a readable LMDB file ({err})") from None
    try:
        info, stat = env.info(), env.stat()
    except lmdb.Error as err:
        env.close()
        raise CorruptShardError(str(path), f"open: {path}: not a readable LMDB file ({err})") from None
    needed = (info["last_pgno"] + 1) * stat["psize"]
    problem = None
    if size < needed:
        problem = f"truncated: the file has {size} bytes, its LMDB pages need {needed}"
    elif stat["entries"] != expected_count:
        problem = f"holds {stat['entries']} records, the manifest says {expected_count}"
    if problem:
        env.close()
        raise CorruptShardError(str(path), f"open: {path}: {problem}")
    return env


def acquire(path: Path, expected_count: int) -> lmdb.Environment:
    """Return the shared environment of shard ``path``, opening and checking it on first use."""
    if not path.is_file():
        raise ShardNotFoundError(str(path))
    key = os.path.realpath(path)
    with _lock:
        _drain_locked()
        entry = _open.get(key)
        if entry is None:
            entry = _open[key] = [_open_checked(path, expected_count), 0]
        elif _entries(entry[0]) != expected_count:
            raise CorruptShardError(str(path), f"open: {path}: holds {_entries(entry[0])} records, "
                                               f"the manifest says {expected_count}")
        entry[1] += 1
        return entry[0]


def _entries(env: lmdb.Environment) -> int:
    try:
        return int(env.stat()["entries"])
    except lmdb.Error:
        return -1


def release(path: Path, wait: bool = True) -> None:
    """Give back one use of shard ``path``; the environment closes with its last user.

    ``wait=False`` (from finalizers) never blocks: a finalizer may run in the middle of
    ``acquire`` on this very thread, which holds the lock; the release is then deferred
    to the next ``acquire`` or ``release`` instead of deadlocking.
    """
    _deferred.append(os.path.realpath(path))  # list.append is atomic
    if not _lock.acquire(blocking=wait):
        return
    try:
        _drain_locked()
    finally:
        _lock.release()


def _drain_locked() -> None:
    while _deferred:
        key = _deferred.pop()
        entry = _open.get(key)
        if entry is None:
            continue
        entry[1] -= 1
        if entry[1] <= 0:
            entry[0].close()
            del _open[key]
