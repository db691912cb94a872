"""The exceptions fastload raises. ``csrc/errors.h`` mirrors them for the native core.

Every message names the operation, the file and the record where there is one,
for example ``decode: train/shard-00003.lmdb record 1234: checksum mismatch``.
"""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "CorruptShardError",
    "DatasetError",
    "FastloadError",
    "FastloadWarning",
    "SchemaMismatchError",
    "ShardNotFoundError",
]


class FastloadError(Exception):
    """Base class of every error fastload raises about data or arguments."""


class FastloadWarning(UserWarning):
    """A visible warning about something that works but probably not as meant (a unit mismatch, an option ignored)."""


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
    """A shard file as a whole is unusable: truncated, not LMDB, wrong record count or hash."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class CorruptRecordError(FastloadError):
    """One record failed to decode: bad magic, a length out of bounds, a checksum mismatch..."""

    def __init__(self, path: str, record: int, reason: str) -> None:
        super().__init__(f"decode: {path} record {record}: {reason}")
        self.path = path
        self.record = record
        self.reason = reason

    def __reduce__(self):  # keeps the fields when raised in a DataLoader worker
        return (type(self), (self.path, self.record, self.reason))
