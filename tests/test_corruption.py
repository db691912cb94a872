import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from shard_edit import read_blocks, read_records, read_values, record_file_offset

import fastload
from fastload import _native
from fastload.errors import CorruptRecordError, CorruptShardError, DatasetError, ShardNotFoundError


@pytest.fixture
def dataset(tmp_path) -> Path:
    out = tmp_path / "ds"
    rng = np.random.default_rng(0)
    fastload.write_arrays(out, {"image": rng.integers(0, 255, (60, 3, 16, 16), dtype=np.uint8),
                                "label": np.arange(60, dtype=np.int64)}, samples_per_shard=20)
    return out


def flip_record_byte(shard: Path, key: int) -> None:
    """Flip the last payload byte of one record (inside its block), found in the shard file by its contents."""
    record_bytes = len(read_records(shard)[key])
    at = record_file_offset(shard, key)
    data = bytearray(shard.read_bytes())
    data[at + record_bytes - 1] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_flipped_byte_is_reported_by_verify_dataset_and_loader(dataset):
    shard = dataset / "shard-00001.lmdb"
    flip_record_byte(shard, 7)  # global sample 27
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1
    assert f"{shard} record 7: field 1: checksum mismatch" in r.stdout
    assert "content hash differs" in r.stdout

    ds = fastload.ShardDataset(dataset)
    assert ds[26]["label"] == 26
    with pytest.raises(CorruptRecordError, match=r"shard-00001\.lmdb record 7: field 1: checksum mismatch") as err:
        ds[27]
    assert err.value.path == str(shard) and err.value.record == 7

    for backend in ("native", "torch"):
        loader = fastload.ShardLoader(dataset, batch_size=10, backend=backend, num_workers=0)
        seen = []
        with pytest.raises(CorruptRecordError, match="record 7"):
            for batch in loader:
                seen.append(batch["label"].clone())
        assert len(seen) == 2  # batches 0 and 1 (samples 0..19) arrived intact
        assert all(np.array_equal(b.numpy(), np.arange(10 * i, 10 * i + 10)) for i, b in enumerate(seen))


def overflow_header_at(shard: Path, key: int) -> tuple[int, int]:
    """Return (block number, file offset of its overflow run's header) of the block holding record ``key``.

    The header is the 16 bytes before the block's value, on the first page of the block's own run.
    """
    sizes = [len(records) for records in read_blocks(shard)]
    number = next(b for b in range(len(sizes)) if key < sum(sizes[:b + 1]))
    value = read_values(shard)[number]
    data = shard.read_bytes()
    at = data.find(value)
    assert at >= 0 and data.find(value, at + 1) < 0 and (at - 16) % 4096 == 0  # a value on its own run
    return number, at - 16


@pytest.mark.parametrize("damage", ["flags", "run length"])
def test_a_damaged_overflow_run_header_is_caught_at_open(tmp_path, damage):
    # Format v4: an overflow run holds a whole block of records, and the readers check every block's run
    # header when they open the shard (a page per MiB of records), so a damaged one stops the shard at
    # open, naming the block, before any of its records is read; verify reports it the same way.
    out = tmp_path / "ds"
    rng = np.random.default_rng(0)
    fastload.write_arrays(out, {"image": rng.integers(0, 255, (40, 3, 128, 128), dtype=np.uint8),
                                "label": np.arange(40, dtype=np.int64)})
    shard = out / "shard-00000.lmdb"
    assert len(read_blocks(shard)) == 2  # 48 KiB records: about 21 per 1 MiB block
    block, header = overflow_header_at(shard, 25)
    assert block == 1
    data = bytearray(shard.read_bytes())
    if damage == "flags":
        data[header + 10:header + 12] = (0).to_bytes(2, "little")  # no longer P_OVERFLOW
        reason = f"page {header // 4096} is not the start of an overflow run"
    else:
        data[header + 12:header + 16] = (700).to_bytes(4, "little")  # 700 pages: not the length of a ~0.9 MiB block
        reason = f"overflow run of 700 pages at page {header // 4096} does not fit a"
    shard.write_bytes(bytes(data))

    r = run_cli("fastload", "verify", str(out))
    assert r.returncode == 1 and f"{shard}: block {block}: {reason}" in r.stdout

    for backend in ("native", "torch"):
        seen = []
        with pytest.raises(CorruptShardError, match=f"block {block}: {reason}") as err:
            loader = fastload.ShardLoader(out, batch_size=10, backend=backend, num_workers=0)
            for batch in loader:
                seen.append(batch["label"].clone())
        assert err.value.path == str(shard)
        assert seen == []  # caught when the shard is opened: no record of it was read
    ds = fastload.ShardDataset(out)
    with pytest.raises(CorruptShardError, match=f"block {block}: {reason}"):
        ds[0]  # a record of block 0, whose own run is sound: the shard as a whole is refused


def test_truncated_shard(dataset):
    shard = dataset / "shard-00002.lmdb"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1 and f"{shard}: {size // 2} bytes, the manifest says {size}" in r.stdout
    with pytest.raises(CorruptShardError, match="truncated"):
        fastload.ShardDataset(dataset)
    with pytest.raises(CorruptShardError, match="truncated"):
        fastload.ShardLoader(dataset)
    # The native core checks on its own too, without the manifest's sizes.
    with pytest.raises(CorruptShardError, match=r"truncated: the file has \d+ bytes, its LMDB pages need"):
        _native.ShardSet([str(shard)], [20], [True])


def test_deleted_manifest_means_incomplete(dataset):
    os.remove(dataset / "manifest.json")
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1 and "incomplete dataset, no manifest.json" in r.stdout
    with pytest.raises(DatasetError, match="incomplete dataset"):
        fastload.ShardDataset(dataset)
    with pytest.raises(DatasetError, match="incomplete dataset"):
        fastload.ShardLoader(dataset)


def test_missing_shard(dataset):
    os.remove(dataset / "shard-00000.lmdb")
    with pytest.raises(ShardNotFoundError, match="shard-00000.lmdb: shard file not found"):
        fastload.ShardDataset(dataset)
    with pytest.raises(ShardNotFoundError):
        _native.ShardSet([str(dataset / "shard-00000.lmdb")], [20], [True])


def test_record_count_mismatch_and_garbage_file(dataset):
    with pytest.raises(CorruptShardError, match="holds 20 records, the manifest says 21"):
        _native.ShardSet([str(dataset / "shard-00000.lmdb")], [21], [True])
    garbage = dataset / "garbage.lmdb"
    garbage.write_bytes(b"\x01" * 20000)
    with pytest.raises(CorruptShardError, match="not a readable LMDB file"):
        _native.ShardSet([str(garbage)], [1], [True])


def test_invalid_manifests(dataset):
    path = dataset / "manifest.json"
    doc = json.loads(path.read_text())
    path.write_text("{not json")
    with pytest.raises(DatasetError, match="unreadable manifest"):
        fastload.ShardDataset(dataset)
    path.write_text(json.dumps({**doc, "format_version": 99}))
    with pytest.raises(DatasetError, match="format version 99"):
        fastload.ShardDataset(dataset)
    path.write_text(json.dumps({**doc, "total": 61}))
    with pytest.raises(DatasetError, match="total 61 differs"):
        fastload.ShardDataset(dataset)
    doc["shards"][0]["file"] = "../../etc/passwd"
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="plain file name"):
        fastload.ShardDataset(dataset)


def test_not_a_directory(tmp_path):
    with pytest.raises(DatasetError, match="no such dataset directory"):
        fastload.ShardLoader(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="not a directory"):
        fastload.ShardDataset(tmp_path / "file")


def test_verify_and_info_on_a_sound_dataset(dataset):
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 0 and "OK" in r.stdout
    r = run_cli("fastload", "info", str(dataset))
    assert r.returncode == 0 and "60 samples in 3 shards" in r.stdout and "image: uint8 [3, 16, 16]" in r.stdout
    r = run_cli("fastload", "info")
    assert r.returncode == 0 and "native extension: built" in r.stdout and "cpus:" in r.stdout
