"""Shard files: the key of each record, and the checks before anything opens a shard.

The checks (inside the dataset, regular, non-empty, the right size) use only ``stat``, never
``open``, so a FIFO in place of a shard cannot block.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import CorruptShardError, ShardNotFoundError
from ._manifest import Manifest, ShardInfo


def record_key(index: int) -> bytes:
    """Return the LMDB key of the record at ``index`` within its shard: 8 bytes big-endian."""
    return index.to_bytes(8, "big")


def check_shard_file(directory: Path, shard: ShardInfo, allow_external_shards: bool = False,
                     check_size: bool = True) -> Path:
    """Check one shard is a non-empty regular file inside ``directory`` (and has the manifest's size); return its path.

    A shard whose real path (symbolic links resolved) leaves the dataset directory is refused unless
    ``allow_external_shards`` is true. Only ``stat`` is used, never ``open``, so a FIFO cannot block here.
    """
    path = directory / shard.file
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ShardNotFoundError(str(path)) from None
    except OSError as err:
        raise CorruptShardError(str(path), f"open: {path}: cannot stat the file ({err.strerror})") from None
    root, real = os.path.realpath(directory), os.path.realpath(path)
    if not allow_external_shards and os.path.commonpath([root, real]) != root:
        raise CorruptShardError(str(path), f"open: {path}: resolves to {real}, outside the dataset directory "
                                           f"{root} (pass allow_external_shards=True to read it)")
    if not stat.S_ISREG(st.st_mode):
        raise CorruptShardError(str(path), f"open: {path}: not a regular file")
    if st.st_size == 0:
        raise CorruptShardError(str(path), f"open: {path}: the file is empty (0 bytes)")
    if check_size and st.st_size != shard.bytes:
        hint = " (truncated)" if st.st_size < shard.bytes else ""
        raise CorruptShardError(str(path), f"open: {path}: {st.st_size} bytes, the manifest says {shard.bytes}{hint}")
    return path


def check_shard_files(directory: Path, manifest: Manifest, allow_external_shards: bool = False) -> None:
    """Check every shard of ``manifest`` with ``check_shard_file``, without opening any."""
    for shard in manifest.shards:
        check_shard_file(directory, shard, allow_external_shards)
