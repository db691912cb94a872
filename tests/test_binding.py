"""Format v3 (and v4): every shard is bound to its dataset and its position; consistent-but-wrong datasets are refused.

Each attack of issue 22 (item 4) is here: shards swapped with their manifest entries, a same-numbered
shard of another dataset with its entry refreshed, a shard rewritten in place (same size) while readers
have it open, and a manifest emptied beside its shard files. Every reader refuses them with a typed
error (never a wrong sample) and ``fastload verify`` reports them.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload.errors import CorruptRecordError, DatasetError
from fastload.format._manifest import MANIFEST_NAME, file_hash

N, PER_SHARD = 96, 32
BOUND = r"written under another schema, for another dataset or for another shard position"

READERS = {
    "dataset": lambda p: [fastload.ShardDataset(p)[i] for i in range(N)],
    "native": lambda p: list(fastload.ShardLoader(p, batch_size=8, backend="native", num_threads=2)),
    "torch": lambda p: list(fastload.ShardLoader(p, batch_size=8, backend="torch", num_workers=0)),
}


def values(offset: int) -> dict[str, np.ndarray]:
    x = (np.arange(N * 12, dtype=np.int64).reshape(N, 12) + offset) % 251
    return {"x": x.astype(np.uint8), "y": np.arange(N, dtype=np.int64) + offset}


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    """Two datasets of one schema and shard layout (their shard files have equal sizes), different samples."""
    a, b = tmp_path / "a", tmp_path / "b"
    fastload.write_arrays(a, values(0), samples_per_shard=PER_SHARD)
    fastload.write_arrays(b, values(1000), samples_per_shard=PER_SHARD)
    for i in range(N // PER_SHARD):
        name = f"shard-{i:05d}.lmdb"
        assert (a / name).stat().st_size == (b / name).stat().st_size
    return a, b


def manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text())


def save(directory: Path, doc: dict) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(doc))


def refresh(directory: Path) -> None:
    """Make every manifest entry agree with its file again (as a sync tool or an attacker would)."""
    doc = manifest(directory)
    for s in doc["shards"]:
        s["bytes"] = (directory / s["file"]).stat().st_size
        s["hash"] = file_hash(directory / s["file"])
    save(directory, doc)


def verify_output(directory: Path) -> str:
    r = run_cli("fastload", "verify", str(directory))
    assert r.returncode == 1, r.stdout
    return r.stdout


@pytest.mark.parametrize("how", list(READERS))
def test_two_shards_swapped_with_their_entries_are_refused(pair, how):
    a, _ = pair
    s0, s1 = a / "shard-00000.lmdb", a / "shard-00001.lmdb"
    tmp = a / "swap"
    s0.rename(tmp)
    s1.rename(s0)
    tmp.rename(s1)
    doc = manifest(a)
    e0, e1 = doc["shards"][0], doc["shards"][1]
    for key in ("count", "bytes", "hash"):
        e0[key], e1[key] = e1[key], e0[key]
    save(a, doc)
    with pytest.raises(CorruptRecordError, match=r"shard-00000\.lmdb record 0: " + BOUND) as err:
        READERS[how](a)
    assert err.value.path == str(s0)
    out = verify_output(a)
    assert f"{s0} record 0: {BOUND.replace(chr(92), '')}" in out and f"{s1} record 31: " in out


@pytest.mark.parametrize("how", list(READERS))
def test_same_numbered_shard_of_another_dataset_is_refused(pair, how):
    a, b = pair
    shutil.copyfile(b / "shard-00001.lmdb", a / "shard-00001.lmdb")
    refresh(a)  # the manifest entry agrees with the foreign file
    with pytest.raises(CorruptRecordError, match=r"shard-00001\.lmdb record 0: " + BOUND):
        READERS[how](a)
    assert "shard-00001.lmdb record 0: written under another schema, for another dataset" in verify_output(a)


def rewrite_in_place(target: Path, source: Path) -> None:
    """Overwrite ``target``'s bytes with ``source``'s (same size) without replacing the file: readers keep it open."""
    data = source.read_bytes()
    assert len(data) == target.stat().st_size
    with open(target, "r+b") as f:
        f.write(data)


@pytest.mark.parametrize("source", ["another dataset", "another shard"])
def test_rewrite_in_place_under_the_native_loader_is_detected(pair, source):
    a, b = pair
    donor = b / "shard-00002.lmdb" if source == "another dataset" else a / "shard-00001.lmdb"
    if source == "another shard":  # the same layout: one shard's file made the size of another's
        assert donor.stat().st_size == (a / "shard-00002.lmdb").stat().st_size
    expected = values(0)
    loader = fastload.ShardLoader(a, batch_size=8, backend="native", num_threads=2, shuffle=False, prefetch=2)
    delivered = 0
    it = iter(loader)
    with pytest.raises(CorruptRecordError, match=r"shard-00002\.lmdb record \d+: " + BOUND):
        for i, batch in enumerate(it):
            if i == 0:
                rewrite_in_place(a / "shard-00002.lmdb", donor)  # shard 2 starts at batch 8: not read yet
            rows = slice(delivered, delivered + len(batch["y"]))
            assert np.array_equal(batch["x"].numpy(), expected["x"][rows])  # never a wrong sample
            assert np.array_equal(batch["y"].numpy(), expected["y"][rows])
            delivered += len(batch["y"])
    assert delivered == 2 * PER_SHARD


@pytest.mark.parametrize("source", ["another dataset", "another shard"])
def test_rewrite_in_place_under_a_shard_dataset_is_detected(pair, source):
    a, b = pair
    donor = b / "shard-00002.lmdb" if source == "another dataset" else a / "shard-00001.lmdb"
    ds = fastload.ShardDataset(a)
    assert int(ds[2 * PER_SHARD]["y"]) == 2 * PER_SHARD  # the shard's LMDB environment is open now
    rewrite_in_place(a / "shard-00002.lmdb", donor)
    for i in (2 * PER_SHARD, 2 * PER_SHARD + 5, N - 1):
        with pytest.raises(CorruptRecordError, match=BOUND):
            ds[i]
    with pytest.raises(CorruptRecordError, match=BOUND):
        ds.read_batch([0, 2 * PER_SHARD + 1])
    assert int(ds[PER_SHARD]["y"]) == PER_SHARD  # the other shards still read
    ds.close()


@pytest.mark.parametrize("how", list(READERS))
def test_empty_manifest_beside_shard_files_is_refused(pair, how):
    a, _ = pair
    doc = manifest(a)
    doc["shards"], doc["total"] = [], 0
    doc["empty"] = True  # even a manifest claiming to be empty on purpose
    save(a, doc)
    with pytest.raises(DatasetError, match=r"shards: none listed, but shard files lie beside it \(shard-00000"):
        READERS[how](a)
    assert "shard files lie beside it" in verify_output(a)


def test_manifest_that_lost_its_shards_is_refused_without_shard_files(pair):
    a, _ = pair
    doc = manifest(a)
    doc["shards"], doc["total"] = [], 0
    save(a, doc)
    for shard in a.glob("shard-*.lmdb"):
        shard.unlink()
    with pytest.raises(DatasetError, match=r"no shards, but the dataset was not written empty"):
        fastload.ShardDataset(a)
    assert "was not written empty" in verify_output(a)


def test_old_empty_manifest_beside_shard_files_is_refused(tmp_path):
    from test_format_v2 import write_old_dataset

    out = tmp_path / "v2"
    write_old_dataset(out, np.zeros((10, 4), np.int32), np.arange(10, dtype=np.int64), version=2)
    doc = manifest(out)
    doc["shards"], doc["total"] = [], 0
    save(out, doc)
    with pytest.raises(DatasetError, match=r"shard files lie beside it"):
        fastload.ShardDataset(out)


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_dataset_written_empty_still_opens(tmp_path, backend):
    out = tmp_path / "empty"
    fastload.write_arrays(out, {"x": np.zeros((0, 4), np.uint8)})
    doc = manifest(out)
    assert doc["format_version"] == 4 and doc["empty"] is True and doc["shards"] == []
    assert len(fastload.ShardDataset(out)) == 0
    assert list(fastload.ShardLoader(out, batch_size=4, backend=backend)) == []
    assert run_cli("fastload", "verify", str(out)).returncode == 0


def test_empty_flag_with_shards_is_refused(pair):
    a, _ = pair
    doc = manifest(a)
    doc["empty"] = True
    save(a, doc)
    with pytest.raises(DatasetError, match=r"empty: true, but the manifest lists shards"):
        fastload.ShardDataset(a)


@pytest.mark.parametrize("value, problem", [(None, "missing key 'dataset_id'"),
                                            ("ABC", r"dataset_id: 'ABC' is not 32 lowercase hex digits"),
                                            (7, r"dataset_id: 7 is not a string")])
def test_v3_manifest_needs_its_dataset_id(pair, value, problem):
    a, _ = pair
    doc = manifest(a)
    if value is None:
        del doc["dataset_id"]
    else:
        doc["dataset_id"] = value
    save(a, doc)
    with pytest.raises(DatasetError, match=problem):
        fastload.ShardDataset(a)


def test_a_changed_dataset_id_is_refused(pair):
    a, b = pair
    doc = manifest(a)
    doc["dataset_id"] = manifest(b)["dataset_id"]
    save(a, doc)
    with pytest.raises(CorruptRecordError, match=r"shard-00000\.lmdb record 0: " + BOUND):
        READERS["native"](a)


def test_dataset_id_is_a_function_of_what_is_written(tmp_path, pair):
    a, b = pair
    again = tmp_path / "again"
    fastload.write_arrays(again, values(0), samples_per_shard=PER_SHARD)
    assert manifest(again)["dataset_id"] == manifest(a)["dataset_id"] != manifest(b)["dataset_id"]
    for i in range(N // PER_SHARD):
        name = f"shard-{i:05d}.lmdb"
        assert (again / name).read_bytes() == (a / name).read_bytes()
    other = tmp_path / "other"
    fastload.write_arrays(other, values(0), samples_per_shard=PER_SHARD // 2)  # another shard size: another id
    assert manifest(other)["dataset_id"] != manifest(a)["dataset_id"]


def test_verify_recommends_rewriting_old_datasets(tmp_path):
    from test_format_v2 import write_old_dataset

    out = tmp_path / "v2"
    write_old_dataset(out, np.zeros((10, 4), np.int32), np.arange(10, dtype=np.int64), version=2)
    r = run_cli("fastload", "verify", str(out))
    assert r.returncode == 0
    assert "note: " in r.stdout and "format version 2: its shards are not bound" in r.stdout
    assert "run `fastload upgrade` on it to get format 4" in r.stdout


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_concatenation_of_v2_and_v3_datasets_reads_each_with_its_binding(tmp_path, backend):
    from test_format_v2 import write_old_dataset

    old, new = tmp_path / "v2", tmp_path / "v3"
    v = np.arange(40, dtype=np.int32).reshape(10, 4)
    write_old_dataset(old, v, np.arange(10, dtype=np.int64), version=2)
    fastload.write_arrays(new, {"v": v + 100, "label": np.arange(10, dtype=np.int64) + 10}, codec={"v": "zstd"},
                          samples_per_shard=3)
    both = fastload.concat([fastload.ShardDataset(old), fastload.ShardDataset(new)])
    batches = list(fastload.ShardLoader(both, batch_size=4, backend=backend, shuffle=False))
    assert np.array_equal(np.concatenate([b["label"].numpy() for b in batches]), np.arange(20))
    assert np.array_equal(np.concatenate([b["v"].numpy() for b in batches]), np.concatenate([v, v + 100]))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_concatenation_of_v3_datasets_checks_each_shard_against_its_own_dataset(pair, backend):
    a, b = pair
    both = fastload.concat([fastload.ShardDataset(a), fastload.ShardDataset(b)])
    batches = list(fastload.ShardLoader(both, batch_size=16, backend=backend, shuffle=False))
    assert np.array_equal(np.concatenate([x["y"].numpy() for x in batches]),
                          np.concatenate([values(0)["y"], values(1000)["y"]]))
    shutil.copyfile(b / "shard-00001.lmdb", a / "shard-00001.lmdb")  # b's shard 1 in a: refused there only
    refresh(a)
    both = fastload.concat([fastload.ShardDataset(a), fastload.ShardDataset(b)])
    extra = {"num_workers": 0} if backend == "torch" else {}
    with pytest.raises(CorruptRecordError, match=r"a/shard-00001\.lmdb record 0: " + BOUND):
        list(fastload.ShardLoader(both, batch_size=16, backend=backend, shuffle=False, **extra))


def test_shard_writer_refuses_records_of_another_schema(tmp_path):
    from fastload.conversion._shard_writer import write_shard
    from fastload.errors import SchemaMismatchError
    from fastload.format._record import Field, RecordEncoder

    fields = [Field("x", "uint8", (4,))]
    record = RecordEncoder([Field("x", "int8", (4,))]).encode({"x": np.zeros(4, np.int8)})
    with pytest.raises(SchemaMismatchError, match=r"shard 0 record 0: encoded for another schema"):
        write_shard(tmp_path, 0, [record], (fields, "0" * 32))
    with pytest.raises(ValueError, match=r"need \(schema, dataset id\)"):
        write_shard(tmp_path, 0, [record])


def test_info_names_the_dataset_id(pair):
    a, _ = pair
    r = run_cli("fastload", "info", str(a))
    assert r.returncode == 0 and f"format version 4, dataset id {manifest(a)['dataset_id']}," in r.stdout
