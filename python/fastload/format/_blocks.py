"""Format v4 blocks: consecutive records packed into one LMDB value (docs/FORMAT.md, "A block").

LMDB stores a value above about 2 KB on whole overflow pages of its own, and a small value pays a
node's overhead in a leaf page: a 3 KB record took a 4 KiB page, a 264-byte one about 390 bytes.
Version 4 stores consecutive records in blocks of about 1 MiB, each with a small index of the
records' lengths, so a shard is within a page per block of its records' bytes. The writer packs
with :func:`pack_blocks`; :func:`unpack_block` is the Python reference of the checks the native
reader (``csrc/format/record_blocks.cpp``) makes before it reads any record of a block.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

from ..errors import ArgumentError

BLOCK_MAGIC = b"FLBK"
BLOCK_VERSION = 4  # the format version whose shards hold blocks
BLOCK_TARGET = 1 << 20  # a block is closed once its value reaches this many bytes
MIN_RECORD_BYTES = 48  # a v4 record's header and one field entry: the shortest record a block may index
BLOCK_HEADER = struct.Struct("<4sHBBQII")  # magic, version, index width, reserved, first key, records, length
_WIDTHS = {0: None, 2: "H", 4: "I"}


class BlockError(ValueError):
    """A block that breaks the format ("block 3: ..."); readers raise it as a CorruptShardError naming the file."""


def _width(lengths: Sequence[int]) -> int:
    if all(n == lengths[0] for n in lengths):
        return 0
    return 2 if max(lengths) < 1 << 16 else 4


def encode_block(records: Sequence[bytes], first_key: int, version: int = BLOCK_VERSION) -> bytes:
    """Return one block value holding ``records`` (at least one, each non-empty), the first of key ``first_key``."""
    if not records:
        raise BlockError("a block holds at least one record")
    lengths = [len(r) for r in records]
    if min(lengths) < 1:
        raise ArgumentError("an empty record: a record is at least its header")
    if max(lengths) >= 1 << 32:
        raise ArgumentError(f"a record of {max(lengths)} bytes: a shard holds records below 4 GiB (LMDB's largest "
                            "value), so a sample's encoded fields must stay below 4 GiB")
    width = _width(lengths)
    common = lengths[0] if width == 0 else 0
    head = BLOCK_HEADER.pack(BLOCK_MAGIC, version, width, 0, first_key, len(records), common)
    index = b"" if width == 0 else struct.pack(f"<{len(records)}{_WIDTHS[width]}", *lengths)
    return b"".join([head, index, *records])


def pack_blocks(records: Sequence[bytes], version: int = BLOCK_VERSION, target: int = BLOCK_TARGET) -> list[bytes]:
    """Return the block values of a shard holding ``records`` (keys 0..n-1), in block order.

    Records are appended to the current block until its value (header, index and records) reaches
    ``target`` bytes, so every block but the last is at least ``target`` long, and a record of at least
    ``target`` bytes ends its block (it is alone in it when it also starts one).
    """
    blocks: list[bytes] = []
    start, total, first_len, same, longest = 0, 0, -1, True, 0
    for i, record in enumerate(records):
        n = len(record)
        if first_len < 0:
            first_len = n
        same = same and n == first_len
        longest = max(longest, n)
        total += n
        width = 0 if same else (2 if longest < 1 << 16 else 4)
        if BLOCK_HEADER.size + width * (i + 1 - start) + total >= target:
            blocks.append(encode_block(records[start:i + 1], start, version))
            start, total, first_len, same, longest = i + 1, 0, -1, True, 0
    if start < len(records):
        blocks.append(encode_block(records[start:], start, version))
    return blocks


def unpack_block(value: bytes | memoryview | Any, block: int, first_key: int, version: int = BLOCK_VERSION,
                 records_left: int | None = None) -> list[tuple[int, int]]:
    """Return (offset within ``value``, length) of each record of block number ``block``.

    ``first_key`` is the key its first record must have (the records of the blocks before it), and
    ``records_left`` (when known) how many records the shard has from there. Every header field, index
    entry and the total length are checked, in the order and with the messages of the native reader
    (``csrc/format/record_blocks.cpp``); a problem is a :class:`BlockError` ("block 3: ..."). A claimed
    count is checked against the value's bytes before anything of that size is built.
    """

    def fail(reason: str) -> BlockError:
        return BlockError(f"block {block}: {reason}")

    size, head = len(value), BLOCK_HEADER.size
    if size < head:
        raise fail(f"{size} bytes, shorter than a block header ({head})")
    magic, own_version, width, reserved, first, count, common = BLOCK_HEADER.unpack_from(value, 0)
    if magic != BLOCK_MAGIC:
        raise fail("bad magic, not a block of records")
    if own_version != version:
        raise fail(f"block version {own_version} in a version {version} dataset")
    if width not in _WIDTHS:
        raise fail(f"index width {width}, expected 0, 2 or 4")
    if reserved != 0:
        raise fail(f"reserved byte {reserved}, expected 0")
    if first != first_key:
        raise fail(f"first key {first}, expected {first_key} (blocks out of order)")
    if count == 0:
        raise fail("holds no records")
    if (width == 0) != (common != 0):
        raise fail(f"record length {common} with index width {width}")
    if width == 0 and common < MIN_RECORD_BYTES:
        raise fail(f"records of {common} bytes, shorter than a record ({MIN_RECORD_BYTES})")
    start = head + width * count
    if start > size:
        raise fail(f"an index of {count} records does not fit in its {size} bytes")
    if records_left is not None and count > records_left:
        raise fail(f"its records run past the shard's {first_key + records_left}")
    room = size - start
    if width == 0:
        if common * count != room:
            raise fail(f"{count} records of {common} bytes do not fill its {room} bytes of records")
        lengths: Sequence[int] = [common] * count
    else:
        lengths = struct.unpack_from(f"<{count}{_WIDTHS[width]}", value, head)
        ends = list(accumulate(lengths))
        short = next((i for i, n in enumerate(lengths) if n < MIN_RECORD_BYTES), count)
        past = bisect_right(ends, room)  # the first record whose end lies past the value (ends never decrease)
        if short < past:  # as the native loop: a short record is found before the sum runs past
            raise fail(f"record {first_key + short} has length {lengths[short]}, shorter than a record "
                       f"({MIN_RECORD_BYTES})")
        if past < count:
            raise fail(f"its records' lengths run past its {room} bytes of records")
        if ends[-1] != room:
            raise fail(f"its records take {ends[-1]} bytes, the block holds {room}")
    spans, offset = [], start
    for n in lengths:
        spans.append((offset, n))
        offset += n
    return spans


def iter_block_records(blocks: Sequence[bytes | memoryview], version: int = BLOCK_VERSION,
                       records: int | None = None) -> Iterator[bytes]:
    """Yield the records of a shard's blocks in key order, checking each block with :func:`unpack_block`.

    ``records``: how many the shard must hold (the manifest's count), checked as the readers do.
    """
    key = 0
    for number, value in enumerate(blocks):
        spans = unpack_block(value, number, key, version, None if records is None else records - key)
        for offset, n in spans:
            yield bytes(value[offset:offset + n])
        key += len(spans)
    if records is not None and key != records:
        raise BlockError(f"holds {key} records, the manifest says {records}")
