"""Format v2: each record names its key and its schema; v1 and v2 datasets stay readable (writers write v4)."""

import json
from pathlib import Path

import lmdb
import numpy as np
import pytest
from conftest import run_cli
from shard_edit import read_records, replace_record

import fastload
from fastload.conversion._shard_writer import write_shard
from fastload.errors import CorruptRecordError
from fastload.format._manifest import MANIFEST_NAME, Manifest, file_hash, write_json_atomic
from fastload.format._record import Field, RecordEncoder
from fastload.format._shard_files import record_key

LOADERS = {
    "dataset": lambda p: [fastload.ShardDataset(p)[i] for i in range(len(fastload.ShardDataset(p)))],
    "native": lambda p: list(fastload.ShardLoader(p, batch_size=4, backend="native", num_threads=2)),
    "torch": lambda p: list(fastload.ShardLoader(p, batch_size=4, backend="torch", num_workers=0)),
}


def write_old_dataset(out: Path, values: np.ndarray, labels: np.ndarray, per_shard: int = 5,
                      version: int = 1) -> None:
    """Write a format v1 or v2 dataset, as fastload before v2 or v3 did (tests only: writers write v4)."""
    out.mkdir(parents=True)
    fields = [Field("v", "int32", tuple(values.shape[1:]), "zstd"), Field("label", "int64", ())]
    encoder = RecordEncoder(fields, version=version)
    shards = []
    for index, start in enumerate(range(0, len(values), per_shard)):
        records = [encoder.encode({"v": values[i], "label": labels[i]}) for i in range(start, start + per_shard)]
        shards.append(write_shard(out, index, records))
    manifest = Manifest(fields, shards, {"tool": "test"}, format_version=version)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())


def write_v1_dataset(out: Path, values: np.ndarray, labels: np.ndarray, per_shard: int = 5) -> None:
    write_old_dataset(out, values, labels, per_shard, version=1)


def rehash(directory: Path) -> None:
    """Make the manifest's sizes and hashes match the shard files again (as an attacker would)."""
    doc = json.loads((directory / MANIFEST_NAME).read_text())
    for s in doc["shards"]:
        s["bytes"] = (directory / s["file"]).stat().st_size
        s["hash"] = file_hash(directory / s["file"])
    (directory / MANIFEST_NAME).write_text(json.dumps(doc))


def edit_manifest(directory: Path, change) -> None:
    doc = json.loads((directory / MANIFEST_NAME).read_text())
    change(doc)
    (directory / MANIFEST_NAME).write_text(json.dumps(doc))


@pytest.fixture
def values():
    return np.arange(20 * 4, dtype=np.int32).reshape(20, 4) * 3


@pytest.fixture
def v2_dataset(tmp_path, values) -> Path:
    out = tmp_path / "v2"
    write_old_dataset(out, values, np.arange(20, dtype=np.int64), version=2)
    return out


def test_v2_datasets_bind_records_to_their_keys(v2_dataset):
    assert json.loads((v2_dataset / MANIFEST_NAME).read_text())["format_version"] == 2
    env = lmdb.open(str(v2_dataset / "shard-00001.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        record = txn.get(record_key(3))
    env.close()
    assert record[4:6] == b"\x02\x00" and int.from_bytes(record[8:16], "little") == 3


@pytest.mark.parametrize("how", list(LOADERS))
def test_v1_datasets_stay_readable(tmp_path, values, how):
    write_v1_dataset(tmp_path / "v1", values, np.arange(20, dtype=np.int64))
    got = LOADERS[how](tmp_path / "v1")
    stacked = np.concatenate([np.atleast_2d(b["v"].numpy()) for b in got])
    assert np.array_equal(stacked, values)
    assert run_cli("fastload", "verify", str(tmp_path / "v1")).returncode == 0


def swap_records(shard: Path, a: int, b: int) -> None:
    """Store record b under key a and record a under key b: what a damaged LMDB index does."""
    env = lmdb.open(str(shard), subdir=False, lock=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        ra, rb = txn.get(record_key(a)), txn.get(record_key(b))
        txn.put(record_key(a), rb)
        txn.put(record_key(b), ra)
    env.close()


@pytest.mark.parametrize("how", list(LOADERS))
def test_record_delivered_for_another_key_is_corrupt(v2_dataset, how):
    shard = v2_dataset / "shard-00001.lmdb"
    swap_records(shard, 0, 1)
    rehash(v2_dataset)  # even a manifest that agrees with the damaged file does not help
    with pytest.raises(CorruptRecordError, match=r"shard-00001\.lmdb record 0: record of key 1 found under key 0 "
                                                 r"\(the shard's index is damaged\)") as err:
        LOADERS[how](v2_dataset)
    assert err.value.path == str(shard) and err.value.record == 0


def test_verify_reports_a_record_under_another_key(v2_dataset):
    swap_records(v2_dataset / "shard-00002.lmdb", 2, 4)
    rehash(v2_dataset)
    r = run_cli("fastload", "verify", str(v2_dataset))
    assert r.returncode == 1
    assert "shard-00002.lmdb record 2: record of key 4 found under key 2" in r.stdout
    assert "shard-00002.lmdb record 4: record of key 2 found under key 4" in r.stdout


SAME_SIZE_CHANGES = {
    "dtype int32 -> float32": lambda doc: doc["schema"][0].update(dtype="float32"),
    "shape [4] -> [2, 2]": lambda doc: doc["schema"][0].update(shape=[2, 2]),
    "field renamed": lambda doc: doc["schema"][1].update(name="target"),
    "label int64 -> float64": lambda doc: doc["schema"][1].update(dtype="float64"),
}


@pytest.mark.parametrize("change", list(SAME_SIZE_CHANGES))
@pytest.mark.parametrize("how", list(LOADERS))
def test_schema_changed_to_the_same_byte_size_is_detected(v2_dataset, change, how):
    edit_manifest(v2_dataset, SAME_SIZE_CHANGES[change])
    expected = r"shard-00000\.lmdb record 0: written under another schema \(fingerprint [0-9a-f]{16}, the manifest's"
    with pytest.raises(CorruptRecordError, match=expected + r" schema has [0-9a-f]{16}\)"):
        LOADERS[how](v2_dataset)


def test_v1_cannot_detect_a_same_size_schema_change(tmp_path, values):
    """The documented limit of v1 (docs/FORMAT.md): records name neither their key nor their schema."""
    write_v1_dataset(tmp_path / "v1", values, np.arange(20, dtype=np.int64))
    edit_manifest(tmp_path / "v1", SAME_SIZE_CHANGES["dtype int32 -> float32"])
    assert fastload.ShardDataset(tmp_path / "v1")[0]["v"].dtype.is_floating_point  # silently reinterpreted


@pytest.mark.parametrize("how", list(LOADERS))
def test_format_version_must_match_the_records(tmp_path, values, v2_dataset, how):
    write_v1_dataset(tmp_path / "v1", values, np.arange(20, dtype=np.int64))
    edit_manifest(tmp_path / "v1", lambda doc: doc.update(format_version=2))
    with pytest.raises(CorruptRecordError, match=r"record version 1 in a version 2 dataset"):
        LOADERS[how](tmp_path / "v1")
    edit_manifest(v2_dataset, lambda doc: doc.update(format_version=1))
    with pytest.raises(CorruptRecordError, match=r"record version 2 in a version 1 dataset"):
        LOADERS[how](v2_dataset)


@pytest.mark.parametrize("how", list(LOADERS))
def test_bool_bytes_other_than_0_and_1_are_corrupt(tmp_path, how):
    flags = np.zeros((8, 3), dtype=bool)
    out = tmp_path / "b"
    fastload.write_arrays(out, {"flag": flags}, codec="zstd")
    # Re-encode sample 5 with a byte 2 (and a matching checksum): only the bool check can catch it.
    bad = RecordEncoder([Field("flag", "uint8", (3,), "zstd")]).encode({"flag": np.array([0, 2, 1], np.uint8)})
    shard = out / "shard-00000.lmdb"
    good = read_records(shard)[5]
    replace_record(shard, 5, good[:24] + bad[24:])  # the bool record's bound header with the uint8 payload
    rehash(out)
    with pytest.raises(CorruptRecordError, match=r"record 5: field 0: bool element 1 holds byte 2, not 0 or 1"):
        LOADERS[how](out)
