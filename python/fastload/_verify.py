"""Checking a dataset: the manifest, every shard's hash and every record's checksum."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from . import _lmdb_envs
from ._format import RecordDecodeError, decode_record
from ._manifest import file_hash, load_manifest
from ._shard_writer import record_key
from .errors import DatasetError, FastloadError


def find_problems(directory: str | os.PathLike) -> Iterator[str]:
    """Yield one line per problem found in the dataset at ``directory`` (none when it is sound)."""
    directory = Path(directory)
    try:
        manifest = load_manifest(directory)
    except DatasetError as err:
        yield str(err)
        return
    for shard in manifest.shards:
        path = directory / shard.file
        if not path.is_file():
            yield f"{path}: shard file not found"
            continue
        size = path.stat().st_size
        if size != shard.bytes:
            yield f"{path}: {size} bytes, the manifest says {shard.bytes}"
        elif file_hash(path) != shard.hash:
            yield f"{path}: content hash differs from the manifest's"
        try:
            env = _lmdb_envs.acquire(path, shard.count)
        except FastloadError as err:
            yield str(err)
            continue
        try:
            with env.begin(buffers=True) as txn:
                for key in range(shard.count):
                    raw = txn.get(record_key(key))
                    if raw is None:
                        yield f"{path} record {key}: key not found in the shard"
                        continue
                    try:
                        decode_record(raw, manifest.fields, verify=True)
                    except RecordDecodeError as err:
                        yield f"{path} record {key}: {err}"
        finally:
            _lmdb_envs.release(path)
