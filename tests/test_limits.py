"""Sizes from a hostile manifest or record never wrap around: typed errors before any allocation.

The regression case of issue 10: a field of shape [2**60] uint8 (zstd) read in
batches of 16 made ``batch_capacity * decoded_bytes`` wrap to 128 bytes, and a
zstd frame declaring 2**60 content bytes was then decompressed past that
buffer. Run under ASan by ``make test-asan`` as well.
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import _native
from fastload.conversion._shard_writer import write_shard
from fastload.errors import DatasetError, FastloadError
from fastload.format._manifest import file_hash
from fastload.format._record import MAX_SAMPLE_BYTES_ENV, RecordDecodeError, decode_record_into

HUGE = 2**60


def zstd_frame_declaring(content_size: int, raw_bytes: int) -> bytes:
    """A well-formed zstd frame header announcing ``content_size`` bytes, then ``raw_bytes`` in raw blocks."""
    frame = struct.pack("<IBQ", 0xFD2FB528, 0xE0, content_size)  # single segment, 8-byte content size
    block = 128 << 10
    for start in range(0, raw_bytes, block):
        size = min(block, raw_bytes - start)
        last = start + size >= raw_bytes
        frame += (int(last) | size << 3).to_bytes(3, "little") + bytes([start // block % 251]) * size
    return frame


def hostile_record(decoded: int, payload: bytes, key: int, fields: list) -> bytes:
    """One record of one zstd field whose header agrees with a schema of ``decoded`` bytes."""
    from fastload.format._record import record_prefix

    return record_prefix(fields, key) + struct.pack("<B3xIQQ", 1, len(payload), decoded, 0) + payload


@pytest.fixture
def huge_dataset(tmp_path) -> Path:
    """A dataset whose manifest says shape [2**60] (zstd) and whose 20 records agree, with 1 MiB frames."""
    out = tmp_path / "huge"
    fastload.write_arrays(out, {"x": np.zeros((20, 4), np.uint8)}, codec="zstd")
    doc = json.loads((out / "manifest.json").read_text())
    doc["schema"][0]["shape"] = [HUGE]
    fields = [fastload.Field("x", "uint8", (HUGE,), "zstd")]
    payload = zstd_frame_declaring(HUGE, 1 << 20)
    (out / "shard-00000.lmdb").unlink()
    records = [hostile_record(HUGE, payload, k, fields) for k in range(20)]
    info = write_shard(out, 0, records, (fields, doc["dataset_id"]))
    doc["shards"] = [info.to_json()]
    (out / "manifest.json").write_text(json.dumps(doc))
    assert file_hash(out / "shard-00000.lmdb") == info.hash
    return out


def test_sample_over_the_bound_is_refused_by_the_manifest(huge_dataset):
    for make in (lambda: fastload.ShardDataset(huge_dataset),
                 lambda: fastload.ShardLoader(huge_dataset, batch_size=16, backend="native"),
                 lambda: fastload.ShardLoader(huge_dataset, batch_size=16, backend="torch", num_workers=0)):
        with pytest.raises(DatasetError, match=r"manifest\.json: schema: a sample of 1152921504606846976 decoded "
                                               r"bytes exceeds the limit of 2147483648 bytes"):
            make()


def test_slot_size_overflow_is_a_typed_error_before_any_allocation(huge_dataset, monkeypatch):
    monkeypatch.setenv(MAX_SAMPLE_BYTES_ENV, str(2**62))  # let the manifest through: the core must still refuse
    for make in (lambda: fastload.ShardDataset(huge_dataset),
                 lambda: fastload.ShardLoader(huge_dataset, batch_size=16, backend="native", num_threads=2)):
        with pytest.raises(DatasetError, match=r"a sample of 1152921504606846976 decoded bytes does not fit in "
                                               r"this machine's memory"):
            make()
    shards = _native.ShardSet([str(huge_dataset / "shard-00000.lmdb")], [20], [True])
    with pytest.raises(FastloadError, match=r"BatchReader: batch slot of 16 samples: size overflow"):
        _native.BatchReader(shards, [(1, 1, HUGE)], [np.dtype("u1")], [[HUGE]], [True], 16, 2,
                            max_sample_bytes=2**62)
    # The pure-Python decoder on such a record: a typed error, at most the frame's 1 MiB decoded.
    raw = hostile_record(HUGE, zstd_frame_declaring(HUGE, 1 << 20), 0, [fastload.Field("x", "uint8", (HUGE,), "zstd")])
    with pytest.raises(RecordDecodeError, match=r"field 0: zstd"):
        decode_record_into(raw, [fastload.Field("x", "uint8", (HUGE,), "zstd")], [np.empty(16, np.uint8)], key=0)


def test_slot_larger_than_memory_is_refused(tmp_path):
    ds_path = tmp_path / "ds"
    fastload.write_arrays(ds_path, {"x": np.zeros((2, 4), np.uint8)})
    shards = _native.ShardSet([str(ds_path / "shard-00000.lmdb")], [2], [True])
    with pytest.raises(FastloadError, match=r"batch slot of 16 samples needs 4611686018427387904 bytes, "
                                            r"more than this machine's memory"):
        _native.BatchReader(shards, [(1, 1, 2**58)], [np.dtype("u1")], [[2**58]], [True], 16, 1,
                            max_sample_bytes=2**62)


def test_native_decoders_check_their_sizes():
    blob = np.zeros(64, np.uint8)
    offsets = np.arange(17, dtype=np.uint64)  # 16 one-byte "records"
    with pytest.raises(ValueError, match=r"decode_records: 16 records of field 0 \(1152921504606846976 bytes each\): "
                                         r"size overflow"):
        _native.decode_records(blob, offsets, [(1, 1, HUGE)], [np.zeros(128, np.uint8)])
    with pytest.raises(FastloadError, match=r"exceeds the limit of 2147483648 bytes"):
        _native.decode_record(blob, [(1, 1, HUGE)], [np.zeros(HUGE // 2**40, np.uint8)])
    with pytest.raises(FastloadError, match=r"schema: sample size: size overflow"):
        _native.BatchReader(_native.ShardSet([], [], []), [(1, 2, 2**63), (1, 2, 2**63)], [np.dtype("<u2")] * 2,
                            [[2**62], [2**62]], [True, True], 1, 1)
    with pytest.raises(ValueError, match=r"field 0's shape and dtype make 8 bytes, its decoded size is 4"):
        _native.BatchReader(_native.ShardSet([], [], []), [(0, 1, 4)], [np.dtype("u1")], [[8]], [True], 1, 1)
