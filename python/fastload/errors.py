"""The exceptions fastload raises. ``csrc/errors.h`` mirrors them for the native core.

Every message names the operation, the file and the record where there is one,
for example ``decode: train/shard-00003.lmdb record 1234: checksum mismatch``.
"""

from __future__ import annotations

import os

__all__ = [
    "ArgumentError",
    "ArgumentIndexError",
    "ArgumentTypeError",
    "ClusterError",
    "CorruptRecordError",
    "CorruptShardError",
    "DatasetError",
    "FastloadError",
    "FastloadWarning",
    "ImageReadError",
    "PreprocessError",
    "RemoteError",
    "RemoteNotFoundError",
    "SchemaMismatchError",
    "ShardNotFoundError",
    "SourceError",
    "TransformError",
]


class FastloadError(Exception):
    """Base class of every error fastload raises about data or arguments."""


class FastloadWarning(UserWarning):
    """A visible warning about something that works but probably not as meant (a unit mismatch, an option ignored)."""
class ArgumentError(FastloadError, ValueError):
    """A parameter's value is refused; the message names the parameter and quotes the value."""


class ArgumentTypeError(ArgumentError, TypeError):
    """A parameter has the wrong type (a string or a bool where a number goes, ...); also a ``TypeError``."""


class ArgumentIndexError(ArgumentError, IndexError):
    """A sample index given as a parameter is out of range; also an ``IndexError``."""


class TransformError(ArgumentError):
    """A transform cannot apply to the dataset's fields, or a parameter of it is refused; names the op."""


class SourceError(FastloadError):
    """The input folder or the label file is unusable; the message says which file and why."""


class PreprocessError(FastloadError):
    """A source image stopped a conversion run; the message names the file."""


class ImageReadError(FastloadError):
    """A source file could not be read; carries its path."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason

    def __reduce__(self):  # crosses process boundaries from the encoding workers
        return (type(self), (self.path, self.reason))


class ClusterError(FastloadError):
    """The Dask cluster of a conversion is unusable: ``distributed`` missing, the scheduler unreachable or lost.

    The message names the scheduler (or the extra to install, ``pip install "fastload[dask]"``).
    """


class DatasetError(FastloadError):
    """A dataset directory is missing, incomplete (no manifest) or its manifest is invalid."""


class SchemaMismatchError(FastloadError, ValueError):
    """Samples disagree with the schema: another shape, dtype or field set."""


class ShardNotFoundError(DatasetError):
    """A shard named by the manifest is not on disk."""

    def __init__(self, path: str) -> None:
        super().__init__(f"open: {path}: shard file not found")
        self.path = path


class CorruptShardError(DatasetError):
    """A shard file as a whole is unusable: truncated, not LMDB, wrong record count or hash, or changed while read.

    Called with one argument, that is the whole message, rebuilt in another process: torch's DataLoader
    re-raises a worker's error as its type called with the worker's formatted traceback (which names the
    shard); ``path`` is then empty.

    A remote dataset's cached copy is healed first (downloaded again when it no longer matches its
    manifest, ``storage/_heal.py``); raised for it, the message ends with what to run
    (``fastload verify <url>``) or which file to delete.
    """

    def __init__(self, path: str, message: str | None = None) -> None:
        super().__init__(path if message is None else message)
        self.path = "" if message is None else path


class CorruptRecordError(FastloadError):
    """One record failed to decode: bad magic, a length out of bounds, a checksum mismatch...

    Called with one argument, that is the whole message, rebuilt in another process (see
    CorruptShardError); ``path`` is then empty and ``record`` -1. A remote dataset's cached copy is
    healed first, as for CorruptShardError; raised for it, the message says what to do.
    """

    def __init__(self, path: str, record: int | None = None, reason: str | None = None) -> None:
        if record is None or reason is None:
            super().__init__(path)
            self.path, self.record, self.reason = "", -1, path
            return
        super().__init__(f"decode: {path} record {record}: {reason}")
        self.path = path
        self.record = record
        self.reason = reason

    def __reduce__(self):  # keeps the fields when raised in a DataLoader worker
        return (type(self), (self.path, self.record, self.reason))


class RemoteError(DatasetError):
    """Object storage failed or refused; the message names the URL, never a credential.

    A server error after the retries, a dropped connection, no credentials, a refused permission, a
    download that never matched its manifest, a cache that cannot hold what is needed, a full disk.
    """


class RemoteNotFoundError(RemoteError):
    """An object (a manifest, a shard, a bucket) is not at the URL the message names."""


def _unwinding_ctrl_c(err: BaseException) -> bool:
    """Whether ``err`` was raised while a KeyboardInterrupt unwound (it is in the error's context chain).

    Cleanup that a Ctrl-C interrupts may fail in turn and replace the KeyboardInterrupt: seen in CI,
    ``shutil.rmtree`` (a ``TemporaryDirectory`` of a remote source's copy) interrupted between its
    ``os.close(fd)`` and the flag recording it closed the descriptor again in its ``finally`` and raised
    ``OSError: [Errno 9] Bad file descriptor``. Reported as the task's error, the run ended with a
    failure naming a good source instead of as interrupted (and resumable).
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        chained = todo.pop()
        if chained is None or id(chained) in seen:
            continue
        if isinstance(chained, KeyboardInterrupt):
            return True
        seen.add(id(chained))
        todo += (chained.__cause__, chained.__context__)
    return False
