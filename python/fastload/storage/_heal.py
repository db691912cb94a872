"""Healing a damaged shard in the cache: checked against its manifest, set aside, downloaded again.

A shard under its final name in the cache matched its manifest's hash when it was downloaded, and is
trusted by its size from then on (``storage/_cache.py``). A byte that changes later (a failing disk, a
stray write) shows when the shard is read: a CorruptRecordError (a record's checksum) or a
CorruptShardError (the LMDB structure) naming the cached file. A reader of a remote dataset
(``loading/``) then calls :func:`heal_shard`, and reads again once:

- the file no longer matches the manifest's ``xxh3-128`` hash: it is renamed ``.<file>.damaged-<pid>``
  and deleted, under the shard's download lock (no other process downloads it meanwhile or finds a
  half state: a file is either the old one, absent, or a new download renamed into place whole),
  downloaded again through the fetcher (checked against the manifest, as every download), and one
  :class:`~fastload.errors.FastloadWarning` names the file;
- the file matches its hash, or is gone (another process is healing it): nothing is done here.

When the read fails again, or the download does, the reader raises :func:`advised`: the same typed
error, its message saying what to run (``fastload verify <url>``) or which file to delete. In a
DataLoader worker the warning is handed to the main process (:func:`set_warning_sink`), where
``warnings`` filters and test harnesses see it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import CorruptRecordError, CorruptShardError, FastloadWarning, RemoteError
from ..format._manifest import ShardInfo, file_hash
from ._cache import is_whole, shard_lock

DAMAGED_INFIX = ".damaged-"  # a damaged shard set aside: ``.<file>.damaged-<pid>``, deleted at once

# Where this process's heal warnings go: None, ``warnings.warn`` here; a DataLoader worker's hands them on.
_sink: Callable[[str], None] | None = None


def set_warning_sink(sink: Callable[[str], None] | None) -> None:
    """Send this process's heal warnings to ``sink(message)`` instead of ``warnings.warn`` (None: back to it).

    A DataLoader worker's: the main process warns them (``loading/_torch_backend.py``), once each.
    """
    global _sink
    _sink = sink


def is_damage(error: BaseException) -> bool:
    """Return whether ``error`` is a reader's report of damaged bytes in a named file."""
    return isinstance(error, (CorruptRecordError, CorruptShardError)) and bool(getattr(error, "path", ""))


def names_file(error: BaseException, path: Path) -> bool:
    """Return whether ``error`` (a CorruptRecordError or CorruptShardError) names the file ``path``."""
    named = getattr(error, "path", "")
    return bool(named) and os.path.abspath(named) == os.path.abspath(path)


def heal_shard(fetcher: Any, index: int, shard: ShardInfo, error: BaseException, url: str) -> bool:
    """Replace the cached copy of shard ``index`` when it no longer matches its manifest; return whether it did.

    ``fetcher``: the version's ``ShardFetcher`` (or a forked child's ``ForkedFetcher``), with
    ``path(index)`` and ``refetch(index)``; ``error``: what reading the copy raised; ``url``: the
    dataset's URL (without secrets), for messages. False: the copy matches its hash (left as it is),
    or another process has set it aside (fetched again here, or waited for). Raises :func:`advised`
    when the download fails (a RemoteError: the object in storage is damaged too, or unreachable).
    """
    path = fetcher.path(index)
    with shard_lock(path.parent, shard.file):
        here = path.exists()
        if here and is_whole(path, shard.bytes) and _matches(path, shard):
            return False
        if here:
            aside = path.with_name(f".{path.name}{DAMAGED_INFIX}{os.getpid()}")
            try:
                os.replace(path, aside)
                aside.unlink()
            except FileNotFoundError:  # evicted meanwhile (a windowed version's): fetched again below
                here = False
            except OSError as err:
                raise advised(error, url, shard, f"setting the damaged file aside failed ({err.strerror or err})") \
                    from None
    try:  # (gone: another process set it aside; this fetches it, or waits for that process's download)
        fetcher.refetch(index)
    except RemoteError as err:
        what = "it no longer matched its manifest's hash and was deleted" if here else "it was set aside"
        raise advised(error, url, shard, f"{what}, but downloading it again failed: {err}") from None
    if not here:
        return False
    _warn(f"{path}: the cached copy of {url}/{shard.file} was damaged ({_reason(error)}): it no longer matched "
          "its manifest's hash, so it was downloaded again and reading goes on")
    return True


def advised(error: BaseException, url: str, shard: ShardInfo, detail: str | None = None) -> Exception:
    """Return ``error`` again (its type, file and record) with what to do about it in its message.

    ``detail``: what happened to the cached copy; without it the copy is hashed here to say whether it
    matches its manifest (the damage is then in the dataset as stored, or in this machine's memory).
    """
    path = getattr(error, "path", "")
    if detail is None:
        matches = is_whole(Path(path), shard.bytes) and _matches(Path(path), shard)
        detail = ("the file matches its manifest's hash, so the dataset in storage holds this damage (or this "
                  "machine's memory corrupted the read)" if matches else
                  "the file was downloaded again and is damaged again (check this machine's disk)")
    advice = (f"{detail}; run `fastload verify {url}` to check the dataset in storage, or delete {path} to have "
              "it downloaded again")
    if isinstance(error, CorruptRecordError):
        return CorruptRecordError(path, error.record, f"{error.reason}; {advice}")
    return CorruptShardError(path, f"{error}; {advice}")


def _matches(path: Path, shard: ShardInfo) -> bool:
    """Return whether ``path`` hashes as the manifest says (False when it cannot be read, or is gone)."""
    try:
        return file_hash(path) == shard.hash
    except OSError:
        return False


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if isinstance(error, CorruptRecordError) and reason:
        return f"record {error.record}: {reason}"
    return str(error).split(": ", 2)[-1] if isinstance(error, CorruptShardError) else str(error)


def _warn(message: str) -> None:
    sink = _sink
    if sink is not None:
        try:
            sink(message)
            return
        except (OSError, ValueError):  # the main process is gone or closed the channel: warn here
            pass
    warnings.warn(message, FastloadWarning, stacklevel=4)
