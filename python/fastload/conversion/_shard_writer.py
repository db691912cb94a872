"""Writing one LMDB shard: build, compact, then rename into place.

A shard is built under ``.NAME.build``, copied with LMDB's compacting copy to
``.NAME.tmp`` (so the file is about the size of its data, also on Windows
where an LMDB file otherwise grows to its whole map size), fsynced and only
then renamed to ``NAME``. A file with a final name is therefore complete. On
Linux the compacting copy goes to ``.NAME.compact`` and is copied again to
``.NAME.tmp`` in aligned 2 MiB writes (format/_page_cache.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import lmdb
import xxhash

from ..errors import ArgumentError, SchemaMismatchError
from ..format._blocks import BLOCK_VERSION, pack_blocks
from ..format._manifest import ShardInfo, file_hash, fsync_dir
from ..format._manifest_check import shard_name
from ..format._page_cache import REWRITE_SHARDS, copy_hashed
from ..format._record import FORMAT_VERSION, Field, bind_key, binding_fingerprint, schema_fingerprint
from ..format._shard_files import record_key

PAGE = 4096


def _map_size(records: Sequence[bytes]) -> int:
    # Each value lands on its own overflow pages when large, or shares leaf
    # pages when small; twice the page-rounded sum plus slack is always enough.
    pages = sum((len(r) + 64 + PAGE - 1) // PAGE for r in records)
    return 2 * (pages * PAGE + sum(len(r) + 64 for r in records)) + (8 << 20)


def dataset_id(fields: Sequence[Field], identity: str, first_shard: Sequence[bytes]) -> str:
    """Return the id of a dataset about to be written: 32 hex digits (docs/FORMAT.md, "Dataset id").

    XXH3-128 of the format version, the schema, ``identity`` (the writer's inputs: its
    options and the names, labels and sizes of its sources) and the bytes of the first
    shard's records as encoded. It is a function of what is written, so conversions
    stay byte-identical for any worker count and on ``--resume``; two datasets get one
    id only when all of that agrees.
    """
    h = xxhash.xxh3_128()
    h.update(f"fastload dataset id\nformat {FORMAT_VERSION}\n".encode())
    h.update(json.dumps([f.to_json() for f in fields], sort_keys=True).encode())
    h.update(identity.encode("utf-8", "surrogatepass"))
    h.update(f"\nfirst shard {len(first_shard)}\n".encode())
    for record in first_shard:
        h.update(len(record).to_bytes(8, "little"))
        h.update(record)
    return h.hexdigest()


def write_shard(directory: str | os.PathLike, index: int, records: Sequence[bytes],
                binding: tuple[Sequence[Field], str] | None = None, durable: bool = True) -> ShardInfo:
    """Write ``records`` (keys 0..n-1) as shard ``index`` in ``directory`` and return its entry.

    Records of format v4 are packed into blocks (format/_blocks.py): LMDB key *b* holds block *b*; older
    records (written by tests and ``fastload upgrade``'s checks) are stored one per key.
    Each v2 or v3 record is bound to its key here (:func:`bind_key`), and each v3 record
    to its dataset and this shard's index: ``binding`` is (schema, dataset id), required
    for v3 records. With ``durable`` the file and the directory are fsynced before the
    shard is returned; without, the caller makes it durable (or uploads it and deletes it).
    """
    fingerprint, schema = None, b""
    version = int.from_bytes(records[0][4:6], "little") if records else FORMAT_VERSION
    if version >= 3:
        if binding is None:
            raise ArgumentError(f"shard {index}: format {version} records need (schema, dataset id) to bind to")
        schema_fp = schema_fingerprint(binding[0])
        schema, fingerprint = schema_fp.to_bytes(8, "little"), binding_fingerprint(schema_fp, binding[1], index)
    directory = Path(directory)
    name = shard_name(index)
    build = directory / f".{name}.build"
    compacted = directory / f".{name}.compact"
    tmp = directory / f".{name}.tmp"
    final = directory / name
    for stale in (build, compacted, tmp):
        stale.unlink(missing_ok=True)
    bound = []
    for key, record in enumerate(records):
        if record[4:6] != records[0][4:6]:
            own = int.from_bytes(record[4:6], "little")
            raise ArgumentError(f"shard {index} record {key}: record version {own} among version {version} records")
        if schema and record[16:24] != schema:  # the binding replaces the schema fingerprint: check it first
            raise SchemaMismatchError(f"shard {index} record {key}: encoded for another schema than the "
                                      "dataset's")
        bound.append(bind_key(record, key, fingerprint))
    values = pack_blocks(bound, version) if version >= BLOCK_VERSION else bound  # v4: records in blocks
    # The map size is written into the file's meta pages: from the records, as every format 4 shard so far.
    write_values(compacted if REWRITE_SHARDS else tmp, values, build, map_size=_map_size(records))
    if REWRITE_SHARDS:
        # LMDB's copy writes 1 MiB at a time; copied again in aligned 2 MiB writes (hashed on the way, which
        # reading it for its hash cost anyway), the shard sits in the page cache as 2 MiB folios where the
        # filesystem makes them, and readers map it 2 MiB at a time (format/_page_cache.py).
        digest = copy_hashed(compacted, tmp)
        compacted.unlink()
    else:
        digest = file_hash(tmp)
    if durable:
        fsync_file(tmp)
    info = ShardInfo(file=name, count=len(records), bytes=tmp.stat().st_size, hash=digest)
    os.replace(tmp, final)
    if durable:
        fsync_dir(directory)
    return info


def write_values(path: str | os.PathLike, values: Sequence[bytes], build: str | os.PathLike | None = None,
                 map_size: int | None = None) -> None:
    """Write an LMDB file of ``values`` under keys 0..n-1 (8-byte big-endian) at ``path``: compacted, not fsynced.

    It is built at ``build`` (default: ``.NAME.build`` beside ``path``), then copied with LMDB's compacting
    copy, so the file is about the size of its data. ``write_shard`` writes shards with it; tests and the
    fuzz corpus write crafted values with it. ``map_size`` (LMDB's, recorded in the file's meta pages):
    by default enough for ``values``.
    """
    path = Path(path)
    build = Path(build) if build is not None else path.with_name(f".{path.name}.build")
    build.unlink(missing_ok=True)
    env = lmdb.open(str(build), subdir=False, map_size=map_size or _map_size(values), lock=False, sync=False,
                    metasync=False, readahead=False, meminit=True, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            for key, value in enumerate(values):
                txn.put(record_key(key), value, append=True)
        env.copy(str(path), compact=True)
    finally:
        env.close()
    build.unlink()


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data to its disk (or, on a network filesystem, to its server)."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
