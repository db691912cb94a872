"""Writing one LMDB shard: build, compact, then rename into place.

A shard is built under ``.NAME.build``, copied with LMDB's compacting copy to
``.NAME.tmp`` (so the file is about the size of its data, also on Windows
where an LMDB file otherwise grows to its whole map size), fsynced and only
then renamed to ``NAME``. A file with a final name is therefore complete.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import lmdb

from ..format._manifest import ShardInfo, file_hash, fsync_dir
from ..format._manifest_check import shard_name
from ..format._record import bind_key
from ..format._shard_files import record_key

PAGE = 4096


def _map_size(records: Sequence[bytes]) -> int:
    # Each value lands on its own overflow pages when large, or shares leaf
    # pages when small; twice the page-rounded sum plus slack is always enough.
    pages = sum((len(r) + 64 + PAGE - 1) // PAGE for r in records)
    return 2 * (pages * PAGE + sum(len(r) + 64 for r in records)) + (8 << 20)


def write_shard(directory: str | os.PathLike, index: int, records: Sequence[bytes]) -> ShardInfo:
    """Write ``records`` (keys 0..n-1) as shard ``index`` in ``directory`` and return its entry.

    Each v2 record is bound to its key here (:func:`bind_key`).
    """
    directory = Path(directory)
    name = shard_name(index)
    build = directory / f".{name}.build"
    tmp = directory / f".{name}.tmp"
    final = directory / name
    for stale in (build, tmp):
        stale.unlink(missing_ok=True)
    env = lmdb.open(str(build), subdir=False, map_size=_map_size(records), lock=False, sync=False,
                    metasync=False, readahead=False, meminit=True, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            for key, record in enumerate(records):
                txn.put(record_key(key), bind_key(record, key), append=True)
        env.copy(str(tmp), compact=True)
    finally:
        env.close()
    build.unlink()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    info = ShardInfo(file=name, count=len(records), bytes=tmp.stat().st_size, hash=file_hash(tmp))
    os.replace(tmp, final)
    fsync_dir(directory)
    return info
