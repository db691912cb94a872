"""Format v4 blocks (format/_blocks.py, csrc/format/record_blocks.cpp): packing, and every check of a block.

The unit tests round-trip records through ``pack_blocks`` and check where blocks end and which index width
each gets. The crafted shards are written here from hand-made block values (py-lmdb, keys 8-byte big-endian
block numbers, compacting copy, as the shard writer does) around the records of a real dataset; each damage
must be refused by ``unpack_block``, both structure validators (with the same message), ShardDataset and
ShardLoader (both backends) with a CorruptShardError naming the file and the block, never a wrong sample.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import shard_edit

import fastload
from fastload.conversion import _shard_writer
from fastload.errors import ArgumentError, CorruptRecordError, CorruptShardError
from fastload.format._blocks import (
    BLOCK_TARGET,
    MIN_RECORD_BYTES,
    BlockError,
    encode_block,
    iter_block_records,
    pack_blocks,
)
from fastload.format._lmdb_check import validate_shard
from fastload.format._manifest import file_hash

HEAD = struct.Struct("<4sHBBQII")  # the block header as docs/FORMAT.md lays it out
SHARD = "shard-00000.lmdb"
RECORDS = 150
SPLIT = (0, 50, 100, RECORDS)  # the crafted shards' three blocks


# ---------------------------------------------------------------------------------------------------------------
# An encoder and a parser of blocks written from the spec, independent of the code under test.

def spec_width(lengths: list[int]) -> int:
    """The index width the spec prescribes: 0 for one common length, else 2 below 65536 bytes, else 4."""
    if len(set(lengths)) == 1:
        return 0
    return 2 if max(lengths) < 1 << 16 else 4


def spec_size(lengths: list[int]) -> int:
    return HEAD.size + spec_width(lengths) * len(lengths) + sum(lengths)


def block(records: list[bytes], first: int, width: int | None = None, *, magic: bytes = b"FLBK", version: int = 4,
          reserved: int = 0, count: int | None = None, common: int | None = None,
          lengths: list[int] | None = None) -> bytes:
    """A block value with any field forced; the index is written for widths 2 and 4 only."""
    lengths = [len(r) for r in records] if lengths is None else lengths
    width = spec_width(lengths) if width is None else width
    count = len(records) if count is None else count
    if common is None:
        common = len(records[0]) if width == 0 else 0
    index = struct.pack(f"<{len(lengths)}{'H' if width == 2 else 'I'}", *lengths) if width in (2, 4) else b""
    return HEAD.pack(magic, version, width, reserved, first, count, common) + index + b"".join(records)


def parse(value: bytes) -> tuple[int, int, list[bytes]]:
    """(width, first key, records) of a sound block."""
    magic, version, width, reserved, first, n, common = HEAD.unpack_from(value)
    assert (magic, version, reserved) == (b"FLBK", 4, 0) and n >= 1
    lengths = [common] * n if width == 0 else list(struct.unpack_from(f"<{n}{'H' if width == 2 else 'I'}", value, 24))
    at, out = HEAD.size + width * n, []
    for length in lengths:
        out.append(value[at:at + length])
        at += length
    assert at == len(value)
    return width, first, out


# ---------------------------------------------------------------------------------------------------------------
# Unit tests of _blocks.

SIZES = [1, 2, 3, 255, 256, 4095, 4096, 65535, 65536, 65537, (1 << 20) - 30, 1 << 20, (1 << 20) + 1, 3_000_000]


def test_round_trip_of_record_sizes_1_byte_to_3_mb():
    rng = random.Random(0)
    records = []
    for size in SIZES:  # each size alone, in a run of equal records, and mixed with the others
        records += [rng.randbytes(size)] + [rng.randbytes(size) for _ in range(3)]
    mixed = [rng.randbytes(rng.choice(SIZES)) for _ in range(40)]
    for stream in (records, mixed, [b"x"], [rng.randbytes(3_000_000)]):
        blocks = pack_blocks(stream)
        if min(len(r) for r in stream) >= MIN_RECORD_BYTES:  # readers refuse shorter ones (no record is)
            assert list(iter_block_records(blocks)) == stream
        else:
            with pytest.raises(BlockError, match=r"shorter than a record \(48\)"):
                list(iter_block_records(blocks))
        got, key = [], 0
        for value in blocks:
            _width, first, recs = parse(value)
            assert first == key
            got += recs
            key += len(recs)
        assert got == stream


@pytest.mark.parametrize(("lengths", "width"), [
    ([5], 0), ([5] * 9, 0), ([70_000] * 3, 0), ([1 << 20] * 2, 0),
    ([1, 2], 2), ([65535, 1], 2), ([65535] * 4 + [7], 2),
    ([65536, 1], 4), ([1, 65536], 4), ([3_000_000, 5, 5], 4),
])
def test_index_width_is_0_for_one_length_2_below_64_kib_else_4(lengths, width):
    records = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    value = encode_block(records, 7)
    magic, version, w, reserved, first, n, common = HEAD.unpack_from(value)
    assert (magic, version, w, reserved, first, n) == (b"FLBK", 4, width, 0, 7, len(lengths))
    assert common == (lengths[0] if width == 0 else 0)
    assert len(value) == 24 + width * len(lengths) + sum(lengths)
    assert parse(value) == (width, 7, records)


def check_boundaries(stream: list[bytes], target: int) -> None:
    """Blocks in order, each closed as soon as its value reaches ``target``: every block but the last at
    least ``target`` long and below it without its last record; a record of ``target`` or more ends its block
    (and is alone in it when it starts one); widths as the spec says."""
    blocks = pack_blocks(stream, target=target) if target != BLOCK_TARGET else pack_blocks(stream)
    key = 0
    for number, value in enumerate(blocks):
        width, first, recs = parse(value)
        lengths = [len(r) for r in recs]
        assert first == key and recs == stream[key:key + len(recs)]
        assert width == spec_width(lengths) and len(value) == spec_size(lengths)
        if number < len(blocks) - 1:
            assert len(value) >= target, f"block {number} of {len(blocks)}: {len(value)} bytes < {target}"
        if len(recs) > 1:
            assert spec_size(lengths[:-1]) < target, f"block {number} went on after reaching {target}"
        for i, n in enumerate(lengths):
            if n >= target:
                assert i == len(lengths) - 1, f"block {number}: a {n}-byte record is not the last of its block"
        key += len(recs)
    assert key == len(stream)


@pytest.mark.parametrize("kind", ["1000 B", "264 B", "64 B", "mixed", "big among small"])
def test_pack_blocks_ends_each_block_once_it_reaches_1_mib(kind):
    rng = random.Random(1)
    stream = {
        "1000 B": [bytes(1000)] * 3000,
        "264 B": [bytes(264)] * 9000,
        "64 B": [bytes(64)] * 40_000,
        "mixed": [bytes(rng.randrange(1, 70_000)) for _ in range(100)],
        "big among small": [bytes(10)] * 3 + [bytes(2 << 20)] + [bytes(10)] * 3 + [bytes(3 << 20)] * 2 + [bytes(5)],
    }[kind]
    check_boundaries(stream, BLOCK_TARGET)


def test_pack_blocks_boundaries_with_a_small_target():
    rng = random.Random(2)
    for trial in range(200):
        target = rng.choice([64, 100, 1000, 4096])
        size = rng.choice([1, 5, 40, 300, 5000, 70_000])
        equal = trial % 3 == 0
        n = rng.randrange(1, 60)
        stream = [bytes(size)] * n if equal else [rng.randbytes(rng.randrange(1, size + 1)) for _ in range(n)]
        check_boundaries(stream, target)


def test_encode_block_refuses_what_is_not_a_block():
    class Huge(bytes):  # a record's length as LMDB would have to store it; never joined
        def __len__(self) -> int:
            return 1 << 32

    with pytest.raises(BlockError):
        encode_block([], 0)
    with pytest.raises(ArgumentError, match="an empty record"):
        encode_block([b"a", b""], 0)
    with pytest.raises(ArgumentError, match="a record of 4294967296 bytes: a shard holds records below 4 GiB"):
        encode_block([b"a", Huge(b"x")], 0)


# ---------------------------------------------------------------------------------------------------------------
# Crafted shards.

def write_values(path: Path, values: list[bytes]) -> None:
    """Write ``values`` under keys 0..n-1 (8-byte big-endian) as the shard writer does: build, compacting copy."""
    path.unlink(missing_ok=True)
    _shard_writer.write_values(path, values)


def lmdb_values(shard: Path) -> list[bytes]:
    return shard_edit.read_values(shard)


def set_manifest(dataset: Path, **changes) -> None:
    """Make the manifest agree with the shard's bytes (size, hash), with ``changes`` to its top level."""
    doc = json.loads((dataset / "manifest.json").read_text())
    doc["shards"][0]["bytes"] = (dataset / SHARD).stat().st_size
    doc["shards"][0]["hash"] = file_hash(dataset / SHARD)
    doc.update(changes)
    (dataset / "manifest.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, list[bytes], list[dict]]:
    """A one-shard v4 dataset of 150 records of 272 bytes, its records (bound) and its samples."""
    out = tmp_path_factory.mktemp("blocks") / "ds"
    rng = np.random.default_rng(0)
    fastload.write_arrays(out, {"image": rng.integers(0, 255, (RECORDS, 3, 8, 8), dtype=np.uint8),
                                "y": np.arange(RECORDS, dtype=np.int64) * 7}, codec={"image": "raw"},
                          samples_per_shard=1000)
    assert json.loads((out / "manifest.json").read_text())["format_version"] == 4
    records = []
    for value in lmdb_values(out / SHARD):
        records += parse(value)[2]
    assert len(records) == RECORDS and {len(r) for r in records} == {24 + 2 * 24 + 192 + 8}
    ds = fastload.ShardDataset(out)
    samples = [{k: v.numpy().copy() for k, v in ds[i].items()} for i in range(len(ds))]
    ds.close()
    return out, records, samples


def parts(records: list[bytes]) -> tuple[list[bytes], list[bytes], list[bytes]]:
    a, b, c, d = SPLIT
    return records[a:b], records[b:c], records[c:d]


def lengths_with(records: list[bytes], i: int, delta: int) -> list[int]:
    lengths = [len(r) for r in records]
    lengths[i] += delta
    return lengths


# (name, block values from the three parts of the records, the block named, the native message after "block N: "
# as a regex, a regex the reference unpack_block's message matches too, or None where only the shard knows).
def cases(records: list[bytes]) -> list[tuple[str, list[bytes], int | None, str, str | None]]:
    A, B, C = parts(records)
    a, c = block(A, 0, 2), block(C, 100, 4)  # the good blocks around the damaged one
    n = len(B)
    out = [
        ("bad magic", block(B, 50, magic=b"FLBX"), 1, "bad magic, not a block of records", "bad magic"),
        ("block version 3", block(B, 50, version=3), 1, "block version 3 in a version 4 dataset", None),
        ("block version 5", block(B, 50, version=5), 1, "block version 5 in a version 4 dataset", None),
        ("index width 1", block(B, 50, 1), 1, "index width 1, expected 0, 2 or 4", None),
        ("index width 3", block(B, 50, 3), 1, "index width 3, expected 0, 2 or 4", None),
        ("index width 8", block(B, 50, 8), 1, "index width 8, expected 0, 2 or 4", None),
        ("reserved byte set", block(B, 50, reserved=0x80), 1, "reserved byte 128, expected 0", None),
        ("first key + 1", block(B, 51), 1, r"first key 51, expected 50 \(blocks out of order\)", None),
        ("first key 0", block(B, 0), 1, r"first key 0, expected 50 \(blocks out of order\)", None),
        ("count 0", block(B, 50, count=0), 1, "holds no records", None),
        ("width 0 with L = 0", block(B, 50, 0, common=0), 1, "record length 0 with index width 0", None),
        ("width 2 with L != 0", block(B, 50, 2, common=272), 1, "record length 272 with index width 2", None),
        ("width 4 with L != 0", block(B, 50, 4, common=1), 1, "record length 1 with index width 4", None),
        ("index longer than the value", block(B, 50, 4, count=2**32 - 1), 1,
         r"an index of 4294967295 records does not fit in its \d+ bytes", "an index of 4294967295 records"),
        ("index of 2 longer than the value", block(B, 50, 2, count=10**6), 1,
         r"an index of 1000000 records does not fit in its \d+ bytes", "an index of 1000000 records"),
        ("shorter than a header", block(B, 50)[:23], 1, r"23 bytes, shorter than a block header \(24\)",
         r"23 bytes, shorter than a block header"),
        ("a zero length", block(B, 50, 2, lengths=[272, 272, 0, 544] + [272] * (n - 4)), 1,
         r"record 52 has length 0, shorter than a record \(48\)", "record 52 has length 0"),
        # Each span the reader keeps costs 16 bytes: records shorter than a record's header are refused, so a
        # crafted shard cannot make it hold much more memory than the file's size.
        ("a 47-byte record", block(B, 50, 2, lengths=[272, 272, 47, 497] + [272] * (n - 4)), 1,
         r"record 52 has length 47, shorter than a record \(48\)", None),
        ("records of 47 bytes", block(B, 50, 0, common=47), 1, r"records of 47 bytes, shorter than a record \(48\)",
         None),
        ("lengths sum past the value", block(B, 50, 2, lengths=lengths_with(B, n - 1, 1)), 1,
         r"its records' lengths run past its 13600 bytes of records", "its records"),
        ("lengths sum short of the value", block(B, 50, 2, lengths=lengths_with(B, n - 1, -1)), 1,
         r"its records take 13599 bytes, the block holds 13600", "its records"),
        ("first length past the value", block(B, 50, 4, lengths=lengths_with(B, 0, 10**6)), 1,
         r"its records' lengths run past its 13600 bytes of records", "its records"),
        # A u32 sum would wrap to exactly the value's bytes: 2 * (2**31 + 272) = 2**32 + 544.
        ("u32 lengths sum past 2**32", block(B, 50, 4, lengths=[2**31 + 272] * 2 + [272] * (n - 2)), 1,
         r"its records' lengths run past its 13600 bytes of records", "its records"),
        # A u32 product would wrap to exactly the value's bytes: 50 * (2**31 + 272) = 25 * 2**32 + 13600.
        ("n * L wrapping 32 bits", block(B, 50, 0, common=2**31 + 272), 1,
         r"50 records of 2147483920 bytes do not fill its 13600 bytes of records", "its records"),
        ("n * L near 2**64", block(B, 50, 0, count=50, common=2**32 - 1), 1,
         r"50 records of 4294967295 bytes do not fill its 13600 bytes of records", "its records"),
        # 2**32-1 records: more than the shard holds, found before their lengths (the reference
        # unpack_block is checked with these in a process of bounded memory below).
        ("n = L = 2**32-1", block(B, 50, 0, count=2**32 - 1, common=2**32 - 1), 1,
         r"its records run past the shard's 150", None),
    ]
    cases = [(name, [a, value, c], number, native, ref) for name, value, number, native, ref in out]
    cases += [
        ("blocks hold more records than the shard", [a, block(B, 50), block(C + [C[-1]], 100)], 2,
         "its records run past the shard's 150", None),
        ("blocks hold fewer records than the shard", [a, block(B, 50), block(C[:-1], 100)], None,
         "holds 149 records, the manifest says 150", None),
        ("two blocks swapped", [a, c, block(B, 50)], 1, r"first key 100, expected 50 \(blocks out of order\)",
         r"first key 100, expected 50"),
        ("first two blocks swapped", [block(B, 50), a, c], 0, r"first key 50, expected 0 \(blocks out of order\)",
         "first key 50, expected 0"),
        ("one record per key (v3 layout)", list(records), 0, "bad magic, not a block of records", "bad magic"),
        ("a block missing", [a, c], 1, r"first key 100, expected 50 \(blocks out of order\)",
         r"first key 100, expected 50"),
    ]
    return cases


def case_names() -> list[str]:
    return [c[0] for c in cases([bytes(272)] * RECORDS)]


@pytest.mark.parametrize("name", case_names())
def test_crafted_block_is_refused_by_every_reader(pristine, tmp_path, name):
    source, records, samples = pristine
    _name, values, number, native_reason, _reference = next(c for c in cases(records) if c[0] == name)
    dataset = tmp_path / "ds"
    shutil.copytree(source, dataset)
    shard = dataset / SHARD
    write_values(shard, values)
    set_manifest(dataset)
    where = "" if number is None else f"block {number}: "
    message = re.compile(re.escape(f"open: {shard}: {where}") + native_reason + "$")

    # Both structure validators refuse it with one message.
    with pytest.raises(CorruptShardError) as native:
        validate_shard(str(shard), RECORDS, use_native=True, packed=True)
    assert native.value.path == str(shard)
    assert message.match(str(native.value))
    with pytest.raises(CorruptShardError) as python:
        validate_shard(str(shard), RECORDS, use_native=False, packed=True)
    assert str(python.value) == str(native.value) and python.value.path == str(shard)

    # The readers refuse the shard at open: no sample comes out of it.
    ds = fastload.ShardDataset(dataset)
    for index in (0, RECORDS - 1):
        with pytest.raises(CorruptShardError) as err:
            ds[index]
        assert message.match(str(err.value)) and err.value.path == str(shard)
    ds.close()
    for backend in ("native", "torch"):
        seen = []
        with pytest.raises(CorruptShardError) as err:
            for batch in fastload.ShardLoader(dataset, batch_size=16, backend=backend, num_workers=0):
                seen.append(batch)
        assert not seen and message.match(str(err.value)), (backend, str(err.value))

    # The reference unpack_block (the pure-Python validator's) refuses the same values with the native message.
    with pytest.raises(BlockError) as reference_error:
        list(iter_block_records(values, records=RECORDS))
    assert re.fullmatch(f"{where}{native_reason}", str(reference_error.value)), str(reference_error.value)


def test_crafted_blocks_that_are_sound_read_back_every_sample(pristine, tmp_path):
    """The control: blocks of widths 2, 4 and 0 (not what the writer picks) and inline values read as written."""
    source, records, samples = pristine
    A, B, C = parts(records)
    for values in ([block(A, 0, 2), block(B, 50, 4), block(C, 100, 0)], [block(records[:3], 0)] +
                   [block(records[k:k + 1], k, 2) for k in range(3, RECORDS)]):
        dataset = tmp_path / f"ds{len(values)}"
        shutil.copytree(source, dataset)
        write_values(dataset / SHARD, values)
        set_manifest(dataset)
        for native in (True, False):
            validate_shard(str(dataset / SHARD), RECORDS, use_native=native, packed=True)
        ds = fastload.ShardDataset(dataset)
        assert all(_same(ds[i], samples[i]) for i in range(RECORDS))
        ds.close()
        for backend in ("native", "torch"):
            got = [s for b in fastload.ShardLoader(dataset, batch_size=16, backend=backend, num_workers=0)
                   for s in _rows(b)]
            assert len(got) == RECORDS and all(_same(g, s) for g, s in zip(got, samples))


def _same(sample: dict, expected: dict) -> bool:
    return sample.keys() == expected.keys() and all(np.array_equal(np.asarray(sample[k]), expected[k])
                                                    for k in sample)


def _rows(batch: dict) -> list[dict]:
    n = len(next(iter(batch.values())))
    return [{k: v[i].numpy() for k, v in batch.items()} for i in range(n)]


def test_a_damaged_run_header_of_a_block_is_refused_at_open(pristine, tmp_path):
    """The loader's walk leaves run headers to the reader; a block's is checked when the shard opens."""
    source, records, _samples = pristine
    dataset = tmp_path / "ds"
    shutil.copytree(source, dataset)
    shard = dataset / SHARD
    A, B, C = parts(records)
    write_values(shard, [block(A, 0), block(B, 50), block(C, 100)])
    data = bytearray(shard.read_bytes())
    at = data.find(block(B, 50))
    assert at % 4096 == 16  # block 1 starts its own overflow run
    data[at - 16 + 10:at - 16 + 12] = (0).to_bytes(2, "little")  # no longer P_OVERFLOW
    shard.write_bytes(bytes(data))
    set_manifest(dataset)
    page = (at - 16) // 4096
    with pytest.raises(CorruptShardError, match=f"block 1: page {page} is not the start of an overflow run"):
        fastload.ShardDataset(dataset)[0]
    with pytest.raises(CorruptShardError, match=f"block 1: page {page} is not the start of an overflow run"):
        list(fastload.ShardLoader(dataset, batch_size=16, backend="native", num_workers=0))
    with pytest.raises(CorruptShardError) as native:
        validate_shard(str(shard), RECORDS, use_native=True, packed=True)
    assert f"page {page} is not the start of an overflow run" in str(native.value)
    with pytest.raises(CorruptShardError) as python:
        validate_shard(str(shard), RECORDS, use_native=False, packed=True)
    assert str(python.value) == str(native.value)


@pytest.mark.parametrize("count", [RECORDS, 1])
def test_a_v4_shard_read_as_v3_is_refused(pristine, tmp_path, count):
    """The manifest edited to format 3: the blocks are not records (one block of one record: its value is read
    as a record and refused), never a wrong sample."""
    source, records, _samples = pristine
    dataset = tmp_path / "ds"
    shutil.copytree(source, dataset)
    if count == 1:
        write_values(dataset / SHARD, [block(records[:1], 0)])
        doc = json.loads((dataset / "manifest.json").read_text())
        doc["shards"][0]["count"] = doc["total"] = 1
        (dataset / "manifest.json").write_text(json.dumps(doc))
    set_manifest(dataset, format_version=3)
    shard = re.escape(str(dataset / SHARD))
    error, message = ((CorruptShardError, f"^open: {shard}: holds 1 records, the manifest says {RECORDS}$")
                      if count == RECORDS else (CorruptRecordError, f"^decode: {shard} record 0: bad magic"))
    ds = fastload.ShardDataset(dataset)
    assert ds.manifest.format_version == 3 and not ds.manifest.packed
    with pytest.raises(error, match=message):
        ds[0]
    ds.close()
    for backend in ("native", "torch"):
        seen = []
        with pytest.raises(error, match=message):
            for batch in fastload.ShardLoader(dataset, batch_size=16, backend=backend, num_workers=0):
                seen.append(batch)
        assert not seen


@pytest.mark.no_asan  # a pure-Python check in a process under RLIMIT_AS, which ASan's shadow reservations defeat
def test_unpack_block_refuses_4_billion_records_without_allocating_them():
    """n = L = 2**32-1 in a 24-byte value: refused at once (no list of 2**32 lengths), in a process whose
    address space is bounded so that a per-record allocation is a MemoryError, not the machine's memory."""
    resource = pytest.importorskip("resource")
    assert resource is not None
    spec = importlib.util.find_spec("fastload.format._blocks")
    assert spec is not None and spec.origin is not None
    code = f"""
import resource, struct, sys
sys.path.insert(0, {str(Path(spec.origin).parents[2])!r})
import fastload.format._blocks as blocks  # imported before the bound: the bound is on what it then allocates
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
value = struct.pack("<4sHBBQII", b"FLBK", 4, 0, 0, 0, 2**32 - 1, 2**32 - 1)
try:
    blocks.unpack_block(value, 0, 0)
except blocks.BlockError as err:
    print("BlockError", err)
"""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("BlockError block 0: "), r.stdout + r.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# The size goal.

@pytest.mark.parametrize("record_bytes", [64, 264, 3 * 1024, 49 * 1024, 64 * 1024])
def test_a_shard_is_within_3_percent_of_its_records(tmp_path, record_bytes):
    fields = 1
    payload = record_bytes - 24 - 24 * fields  # a raw field: the record is its header, entry and bytes
    n = (4 << 20) // record_bytes
    rng = np.random.default_rng(record_bytes)
    fastload.write_arrays(tmp_path / "ds", {"x": rng.integers(0, 256, (n, payload), dtype=np.uint8)},
                          codec={"x": "raw"}, samples_per_shard=10**6)
    shard = tmp_path / "ds" / SHARD
    values = lmdb_values(shard)
    assert sum(len(parse(v)[2]) for v in values) == n
    assert {len(r) for v in values for r in parse(v)[2]} == {record_bytes}
    assert shard.stat().st_size <= 1.03 * n * record_bytes, (shard.stat().st_size, n * record_bytes)
