"""Test helpers that read and rewrite the records of a shard file, whatever its format version.

Format v4 shards hold blocks of records (docs/FORMAT.md, "A block"): LMDB key *b* is block *b*, not
record *b*. Tests that damage or swap records go through these helpers, which keep each record in its
block (a rewritten record may change length; its block is re-encoded around it).
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from fastload.format._blocks import BLOCK_VERSION, encode_block, unpack_block
from fastload.format._shard_files import record_key


def _packed(records_version: int | None, values: list[bytes]) -> bool:
    if records_version is not None:
        return records_version >= BLOCK_VERSION
    return bool(values) and values[0][:4] == b"FLBK"


def read_values(shard: str | Path) -> list[bytes]:
    """Return the shard's LMDB values in key order (records, or v4 blocks)."""
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [bytes(v) for _, v in txn.cursor()]
    finally:
        env.close()


def read_blocks(shard: str | Path) -> list[list[bytes]]:
    """Return a v4 shard's records grouped by block."""
    groups, key = [], 0
    for number, value in enumerate(read_values(shard)):
        spans = unpack_block(value, number, key)
        groups.append([value[o:o + n] for o, n in spans])
        key += len(spans)
    return groups


def read_records(shard: str | Path, version: int | None = None) -> list[bytes]:
    """Return every record of the shard in key order (``version``: the dataset's; None guesses from the bytes)."""
    values = read_values(shard)
    if not _packed(version, values):
        return values
    return [r for group in read_blocks(shard) for r in group]


def write_records(shard: str | Path, records: list[bytes], version: int | None = None) -> None:
    """Rewrite the shard in place with ``records`` (same count), keeping v4 records in their blocks."""
    values = read_values(shard)
    if _packed(version, values):
        sizes = [len(group) for group in read_blocks(shard)]
        if sum(sizes) != len(records):
            raise AssertionError(f"{len(records)} records for a shard of {sum(sizes)}")
        values, start = [], 0
        for n in sizes:
            values.append(encode_block(records[start:start + n], start))
            start += n
    else:
        values = list(records)
    put_values(shard, values)


def put_values(shard: str | Path, values: list[bytes]) -> None:
    """Replace the shard's LMDB values (keys 0..n-1) with ``values``, leaving no other key."""
    total = sum(len(v) + 4096 for v in values)
    env = lmdb.open(str(shard), subdir=False, lock=False, map_size=max(1 << 24, 4 * total))
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(), delete=False)
            for key, value in enumerate(values):
                txn.put(record_key(key), value)
    finally:
        env.close()


def replace_record(shard: str | Path, key: int, record: bytes, version: int | None = None) -> bytes:
    """Put ``record`` in place of record ``key``; return the record it replaced."""
    records = read_records(shard, version)
    old = records[key]
    records[key] = record
    write_records(shard, records, version)
    return old


def record_file_offset(shard: str | Path, key: int, version: int | None = None) -> int:
    """Return where record ``key``'s bytes start in the shard file (found by searching for them: unique in tests)."""
    data = Path(shard).read_bytes()
    record = read_records(shard, version)[key]
    at = data.find(record)
    if at < 0 or data.find(record, at + 1) >= 0:
        raise AssertionError(f"record {key} is not found exactly once in {shard}")
    return at
