import json
import os
from pathlib import Path

import lmdb
import numpy as np
import pytest
from conftest import run_cli

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
    """Flip the last payload byte of one record, found in the shard file by its contents."""
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        record = txn.get(key.to_bytes(8, "big"))
    env.close()
    data = bytearray(shard.read_bytes())
    at = data.find(record)
    assert at >= 0 and data.find(record, at + 1) < 0
    data[at + len(record) - 1] ^= 0xFF
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


def overflow_header_at(shard: Path, key: int) -> int:
    """The file offset of the header of the overflow run holding one record (the 16 bytes before its value)."""
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        record = bytes(txn.get(key.to_bytes(8, "big")))
    env.close()
    data = shard.read_bytes()
    at = data.find(record)
    assert at >= 0 and data.find(record, at + 1) < 0 and (at - 16) % 4096 == 0  # a value on its own run
    return at - 16


@pytest.mark.parametrize("damage", ["flags", "run length"])
def test_a_damaged_overflow_run_header_is_caught_when_its_record_is_read(tmp_path, damage):
    # The loader's validation leaves each record's run header to the read (it lies on the record's own
    # first page: checking it at open touched a page of every record); verify checks it up front.
    out = tmp_path / "ds"
    rng = np.random.default_rng(0)
    fastload.write_arrays(out, {"image": rng.integers(0, 255, (40, 3, 32, 32), dtype=np.uint8),
                                "label": np.arange(40, dtype=np.int64)})
    shard = out / "shard-00000.lmdb"
    header = overflow_header_at(shard, 25)
    data = bytearray(shard.read_bytes())
    if damage == "flags":
        data[header + 10:header + 12] = (0).to_bytes(2, "little")  # no longer P_OVERFLOW
        reason = f"page {header // 4096} is not the start of an overflow run"
    else:
        data[header + 12:header + 16] = (7).to_bytes(4, "little")  # a run of 7 pages for a 2-page value
        reason = f"overflow run of 7 pages at page {header // 4096} does not fit a"
    shard.write_bytes(bytes(data))

    r = run_cli("fastload", "verify", str(out))
    assert r.returncode == 1 and reason in r.stdout

    for backend in ("native", "torch"):
        loader = fastload.ShardLoader(out, batch_size=10, backend=backend, num_workers=0)
        seen = []
        with pytest.raises(CorruptRecordError, match=f"record 25: {reason}") as err:
            for batch in loader:
                seen.append(batch["label"].clone())
        assert err.value.path == str(shard) and err.value.record == 25
        assert [b.tolist() for b in seen] == [list(range(0, 10)), list(range(10, 20))]  # those before are intact
    ds = fastload.ShardDataset(out)
    assert ds[24]["label"] == 24
    with pytest.raises(CorruptRecordError, match="record 25"):
        ds[25]


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
        _native.ShardSet([str(shard)], [20])


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
        _native.ShardSet([str(dataset / "shard-00000.lmdb")], [20])


def test_record_count_mismatch_and_garbage_file(dataset):
    with pytest.raises(CorruptShardError, match="holds 20 records, the manifest says 21"):
        _native.ShardSet([str(dataset / "shard-00000.lmdb")], [21])
    garbage = dataset / "garbage.lmdb"
    garbage.write_bytes(b"\x01" * 20000)
    with pytest.raises(CorruptShardError, match="not a readable LMDB file"):
        _native.ShardSet([str(garbage)], [1])


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
