"""``fastload upgrade``: v1, v2 and v3 datasets rewritten in place as format v4, safely."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import lmdb
import numpy as np
import pytest
import shard_edit
from conftest import run_cli

import fastload
from fastload.conversion import _upgrade
from fastload.conversion._shard_writer import write_shard
from fastload.errors import DatasetError, FastloadError
from fastload.format._blocks import iter_block_records
from fastload.format._manifest import MANIFEST_NAME, Manifest, file_hash, load_manifest, write_json_atomic
from fastload.format._record import Field, RecordEncoder
from fastload.format._shard_files import record_key
from fastload.format._splits import write_splits
from fastload.format._verify import verify_dataset

FIELDS = [
    Field("image", "uint8", (3, 32, 32)),  # 3 KB raw: a record of v1-v3 takes a 4 KiB overflow page of its own
    Field("vec", "int32", (16,), "zstd"),
    Field("mask", "uint8", (16, 16), "png"),
    Field("label", "int64", ()),
]
V3_ID = "00112233445566778899aabbccddeeff"
EXTRA = {"classes": ["cat", "dog", "owl"], "sources": [{"path": "a.tif", "first_sample": 0, "samples": 3}],
         "order": {"kind": "source"}, "someone_elses_key": {"kept": [1, 2, 3]}}
PROVENANCE = {"tool": "fastload test", "created": "2020-01-01T00:00:00+00:00", "options": {"x": 1}}


def sample(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 256, (3, 32, 32), dtype=np.uint8),
            "vec": (np.arange(16, dtype=np.int32) * (i + 1)) % 11 - 5,
            "mask": (np.arange(256, dtype=np.uint8).reshape(16, 16) // (i + 2)).astype(np.uint8),
            "label": np.int64(i % 3)}


def write_old(out: Path, version: int, n: int = 20, per_shard: int = 7, start: int = 0) -> Path:
    """Write a dataset of format ``version`` (1 to 3) of samples start..start+n-1, as fastload once did."""
    out.mkdir(parents=True)
    encoder = RecordEncoder(FIELDS, version=version)
    did = V3_ID if version >= 3 else None
    shards = []
    for index, first in enumerate(range(start, start + n, per_shard)):
        records = [encoder.encode(sample(i)) for i in range(first, min(start + n, first + per_shard))]
        shards.append(write_shard(out, index, records, binding=(FIELDS, did) if did else None))
    manifest = Manifest(FIELDS, shards, dict(PROVENANCE), dict(EXTRA), format_version=version, dataset_id=did)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return out


def read_all(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every sample by ShardDataset, and every batch of ShardLoader's two backends, stacked per field."""
    ds = fastload.ShardDataset(path)
    out = {"dataset": {f.name: np.stack([ds[i][f.name].numpy() for i in range(len(ds))]) for f in FIELDS}}
    for backend, options in (("native", {"num_threads": 2}), ("torch", {"num_workers": 0})):
        batches = list(fastload.ShardLoader(path, batch_size=4, backend=backend, **options))
        out[backend] = {f.name: np.concatenate([np.asarray(b[f.name].numpy()).reshape(-1, *f.shape) for b in batches])
                        for f in FIELDS}
    return out


def expected(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {f.name: np.stack([np.asarray(sample(i)[f.name]) for i in range(start, start + n)]) for f in FIELDS}


def assert_reads(path: Path, want: dict[str, np.ndarray]) -> None:
    for how, got in read_all(path).items():
        for name, values in want.items():
            assert np.array_equal(got[name], values), (how, name)


def files(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (hidden ones too), by relative path."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("version", [1, 2, 3])
def test_upgrade_rewrites_as_v4_with_the_same_samples(tmp_path, version):
    ds = write_old(tmp_path / "ds", version)
    before_doc = json.loads((ds / MANIFEST_NAME).read_text())
    assert_reads(ds, expected(20))

    report = fastload.upgrade_dataset(ds)

    assert [(d.directory, d.from_version, d.shards, d.records, d.upgraded) for d in report.datasets] == \
        [(ds, version, 3, 20, True)]
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    assert doc["format_version"] == 4
    if version == 3:
        assert doc["dataset_id"] == V3_ID
    else:
        assert len(doc["dataset_id"]) == 32 and doc["dataset_id"] != V3_ID
    for key in ("schema", "total", "provenance", *EXTRA):  # everything else is kept as it was
        assert doc[key] == before_doc[key], key
    assert list(doc) == ["format", "format_version", "schema", "total", "shards", "provenance", "dataset_id", *EXTRA,
                         "upgraded_from"]
    assert doc["upgraded_from"]["format_version"] == version  # and the fingerprint loader states were saved with
    assert fastload.ShardDataset(ds).manifest.fingerprint == doc["upgraded_from"]["fingerprint"]
    for old, new in zip(before_doc["shards"], doc["shards"]):
        assert new["file"] == old["file"] and new["count"] == old["count"]
        assert new["bytes"] == (ds / new["file"]).stat().st_size and new["hash"] == file_hash(ds / new["file"])
        assert new["bytes"] < old["bytes"]  # 3 KB records packed into blocks, no longer a 4 KiB page each
    assert report.datasets[0].bytes_after == sum(s["bytes"] for s in doc["shards"]) < report.datasets[0].bytes_before
    assert sorted(p.name for p in ds.iterdir()) == [MANIFEST_NAME, "shard-00000.lmdb", "shard-00001.lmdb",
                                                   "shard-00002.lmdb"]
    assert_reads(ds, expected(20))
    checked = verify_dataset(ds)
    assert checked.ok and checked.records == 20 and not checked.notes


@pytest.mark.parametrize("version", [1, 2, 3])
def test_records_keep_their_payloads_and_get_the_v4_header(tmp_path, version):
    ds = write_old(tmp_path / "ds", version, n=5, per_shard=5)
    env = lmdb.open(str(ds / "shard-00000.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        old = [txn.get(record_key(k)) for k in range(5)]
    env.close()
    fastload.upgrade_dataset(ds)
    manifest = load_manifest(ds)
    env = lmdb.open(str(ds / "shard-00000.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        blocks = [value for _, value in txn.cursor()]
    env.close()
    new = list(iter_block_records(blocks))
    binding = manifest.record_fingerprints()[0]
    head = 8 if version == 1 else 24  # the v1 header has no key and fingerprint
    for key, (a, b) in enumerate(zip(old, new)):
        assert b[:4] == b"FLRC" and b[4:6] == b"\x04\x00" and b[6:8] == a[6:8]
        assert int.from_bytes(b[8:16], "little") == key and int.from_bytes(b[16:24], "little") == binding
        assert b[24:] == a[head:]  # field entries (checksums) and payloads byte for byte
    assert len(new) == 5


def test_v4_dataset_is_left_as_it_is(tmp_path):
    ds = write_old(tmp_path / "ds", 2)
    fastload.upgrade_dataset(ds)
    before = files(ds)
    report = fastload.upgrade_dataset(ds)
    assert files(ds) == before
    assert not report.upgraded and report.datasets[0].from_version == 4
    assert "already" in report.summary()


def test_two_copies_upgrade_to_identical_bytes(tmp_path):
    for name in ("a", "b"):
        write_old(tmp_path / name, 1)
        fastload.upgrade_dataset(tmp_path / name)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_empty_old_dataset(tmp_path):
    ds = tmp_path / "empty"
    ds.mkdir()
    write_json_atomic(ds / MANIFEST_NAME, Manifest(FIELDS, [], {}, format_version=2).to_json())
    fastload.upgrade_dataset(ds)
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    assert doc["format_version"] == 4 and doc["empty"] is True and doc["shards"] == []
    assert len(fastload.ShardDataset(ds)) == 0 and verify_dataset(ds).ok


def test_progress_prints_a_line_per_shard(tmp_path, capsys):
    ds = write_old(tmp_path / "ds", 2)
    fastload.upgrade_dataset(ds, progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if ": shard " in line]
    assert [line.split(": shard ")[1].split()[:2] for line in lines] == [
        ["1/3", "shard-00000.lmdb:"], ["2/3", "shard-00001.lmdb:"], ["3/3", "shard-00002.lmdb:"]]
    fastload.upgrade_dataset(write_old(tmp_path / "quiet", 2))
    assert ": shard " not in capsys.readouterr().err


def test_a_root_with_splits_upgrades_every_split(tmp_path):
    root = tmp_path / "root"
    write_old(root / "train", 2, n=20)
    write_old(root / "val", 3, n=6, start=20)
    write_splits(root, {"train": {"path": "train", "samples": 20, "sources": 20, "class_counts": None},
                        "val": {"path": "val", "samples": 6, "sources": 6, "class_counts": None}}, {"tool": "test"})
    splits_before = (root / "splits.json").read_bytes()
    report = fastload.upgrade_dataset(root)
    assert [(d.directory.name, d.from_version) for d in report.datasets] == [("train", 2), ("val", 3)]
    assert (root / "splits.json").read_bytes() == splits_before
    for split, want in (("train", expected(20)), ("val", expected(6, start=20))):
        assert json.loads((root / split / MANIFEST_NAME).read_text())["format_version"] == 4
        ds = fastload.ShardDataset(root, split=split)
        for name, values in want.items():
            assert np.array_equal(np.stack([ds[i][name].numpy() for i in range(len(ds))]), values)
    r = run_cli("fastload", "verify", str(root), "--no-progress")
    assert r.returncode == 0, r.stdout


def damage_a_record(ds: Path, shard: str, key: int, rehash: bool) -> None:
    """Flip a byte of a record's raw image payload (LMDB stays sound); with ``rehash`` the manifest agrees."""
    env = lmdb.open(str(ds / shard), subdir=False, lock=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        record = bytearray(txn.get(record_key(key)))
        record[-500] ^= 0x40
        txn.put(record_key(key), bytes(record))
    env.close()
    if rehash:
        doc = json.loads((ds / MANIFEST_NAME).read_text())
        for s in doc["shards"]:
            s["bytes"], s["hash"] = (ds / s["file"]).stat().st_size, file_hash(ds / s["file"])
        (ds / MANIFEST_NAME).write_text(json.dumps(doc))


@pytest.mark.parametrize("rehash", [False, True], ids=["hash-differs", "only-the-record"])
@pytest.mark.parametrize("version", [1, 3])
def test_a_damaged_dataset_is_refused_and_left_as_it_is(tmp_path, version, rehash):
    ds = write_old(tmp_path / "ds", version)
    damage_a_record(ds, "shard-00001.lmdb", 2, rehash)
    before = files(ds)
    with pytest.raises(DatasetError, match="not upgraded") as err:
        fastload.upgrade_dataset(ds)
    assert f"{ds / 'shard-00001.lmdb'} record 2: field 0: checksum mismatch" in str(err.value)
    assert files(ds) == before and not (ds / ".upgrade").exists()


def test_a_root_with_one_damaged_split_changes_no_split(tmp_path):
    root = tmp_path / "root"
    write_old(root / "a", 2, n=8)
    write_old(root / "b", 2, n=8)
    write_splits(root, {n: {"path": n, "samples": 8, "sources": 8, "class_counts": None} for n in "ab"}, {})
    damage_a_record(root / "b", "shard-00000.lmdb", 0, rehash=True)
    before = files(root)
    with pytest.raises(DatasetError, match="1 problem"):
        fastload.upgrade_dataset(root)
    assert files(root) == before


def test_remote_urls_are_refused(tmp_path):
    with pytest.raises(FastloadError, match="upgrade the local copy, then upload it"):
        fastload.upgrade_dataset("s3://bucket/datasets/x")


def test_an_incomplete_dataset_is_refused(tmp_path):
    ds = write_old(tmp_path / "ds", 2)
    (ds / MANIFEST_NAME).unlink()
    with pytest.raises(DatasetError, match="incomplete dataset"):
        fastload.upgrade_dataset(ds)


def test_a_staging_path_that_is_not_a_directory_is_refused(tmp_path):
    ds = write_old(tmp_path / "ds", 2)
    (ds / ".upgrade").write_text("mine")
    with pytest.raises(DatasetError, match=r"\.upgrade: not a directory"):
        fastload.upgrade_dataset(ds)
    assert (ds / ".upgrade").read_text() == "mine"


class Crash(BaseException):
    """A crash (power cut, kill -9): nothing after it runs, no cleanup, no except Exception."""


STEPS = ("replace", "fsync", "unlink", "rmdir", "mkdir")  # every step that changes or flushes the file system


def crash_after(monkeypatch, k: int) -> list[int]:
    """Make the k-th (from 0) file system step of the process raise Crash; return the count of steps made."""
    calls = [0]
    for name in STEPS:
        real = getattr(os, name)

        def step(*args, _real=real, **kwargs):
            if calls[0] == k:
                raise Crash
            calls[0] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, step)
    return calls


def reads_whole_or_refuses(ds: Path, want: dict[str, np.ndarray]) -> str:
    """After a crash: readers see the old dataset or the new one, complete, or refuse it; never a mix."""
    try:
        ds_ = fastload.ShardDataset(ds)
    except DatasetError as err:
        assert "incomplete dataset" in str(err)
        return "refused"
    got = np.stack([ds_[i]["image"].numpy() for i in range(len(ds_))])
    assert np.array_equal(got, want["image"])
    assert verify_dataset(ds).ok
    return f"v{ds_.manifest.format_version}"


@pytest.mark.parametrize("version", [1, 3])
def test_an_interruption_at_any_step_then_a_rerun_gives_the_same_dataset(tmp_path, monkeypatch, version):
    pristine = write_old(tmp_path / "pristine", version, n=6, per_shard=3)
    reference = tmp_path / "reference"
    shutil.copytree(pristine, reference)
    fastload.upgrade_dataset(reference)
    want_files, want = files(reference), expected(6)
    seen = set()
    k = 0
    while True:
        ds = tmp_path / f"crash-{k}"
        shutil.copytree(pristine, ds)
        with monkeypatch.context() as m:
            calls = crash_after(m, k)
            try:
                fastload.upgrade_dataset(ds)
                crashed = False
            except Crash:
                crashed = True
        if not crashed:
            assert calls[0] == k  # every step was interrupted once
            break
        seen.add(reads_whole_or_refuses(ds, want))
        report = fastload.upgrade_dataset(ds)  # the rerun finishes the upgrade or starts it over
        # (a crash while the staging directory was removed, after the commit marker: the dataset is v4 already)
        assert report.datasets[0].from_version in (version, 4)
        assert files(ds) == want_files, k
        shutil.rmtree(ds)
        k += 1
    assert k > 20 and seen == {f"v{version}", "refused", "v4"}  # every phase was hit


def test_a_rerun_after_the_commit_reports_that_it_finished(tmp_path, monkeypatch):
    ds = write_old(tmp_path / "ds", 2)
    real, moved = os.replace, []

    def replace(src, dst):  # crash once the first old shard has been replaced by its new one
        if Path(dst).name.startswith("shard-") and Path(dst).parent == ds:
            if moved:
                raise Crash
            moved.append(dst)
        return real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        with pytest.raises(Crash):
            fastload.upgrade_dataset(ds)
    assert not (ds / MANIFEST_NAME).exists() and (ds / ".upgrade" / "COMMIT").exists()
    with pytest.raises(DatasetError, match=r"incomplete dataset.*run `fastload upgrade .*` to finish it"):
        fastload.ShardDataset(ds)
    report = fastload.upgrade_dataset(ds)
    assert report.datasets[0].resumed and report.datasets[0].from_version == 2
    assert "an interrupted upgrade finished" in report.summary()
    assert_reads(ds, expected(20))


def test_a_manifest_changed_after_the_commit_is_not_overwritten(tmp_path, monkeypatch):
    ds = write_old(tmp_path / "ds", 2)
    with monkeypatch.context() as m:
        m.setattr(_upgrade, "_finish", lambda *a: (_ for _ in ()).throw(Crash()))
        with pytest.raises(Crash):
            fastload.upgrade_dataset(ds)
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    doc["provenance"]["note"] = "edited"
    (ds / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="changed since the upgrade committed"):
        fastload.upgrade_dataset(ds)
    assert json.loads((ds / MANIFEST_NAME).read_text())["provenance"]["note"] == "edited"


def test_cli_upgrades_verifies_and_reports(tmp_path):
    ds = write_old(tmp_path / "ds", 1)
    r = run_cli("fastload", "upgrade", str(ds))
    assert r.returncode == 0, r.stderr
    assert f"{ds}: format 1 -> 4: 3 shards, 20 records" in r.stdout
    assert "shard 3/3 shard-00002.lmdb" in r.stderr
    r = run_cli("fastload", "verify", str(ds), "--no-progress")
    assert r.returncode == 0 and "OK" in r.stdout and "note:" not in r.stdout
    r = run_cli("fastload", "upgrade", str(ds), "--no-progress")
    assert r.returncode == 0 and "format 4 already; nothing to do" in r.stdout and r.stderr == ""
    assert_reads(ds, expected(20))


def test_cli_refusals(tmp_path):
    ds = write_old(tmp_path / "ds", 2)
    damage_a_record(ds, "shard-00002.lmdb", 1, rehash=False)
    r = run_cli("fastload", "upgrade", str(ds), "--no-progress")
    assert r.returncode == 1
    assert r.stderr.startswith(f"fastload: error: {ds}: not upgraded (nothing was changed)")
    assert "fastload verify finds 2 problem(s)" in r.stderr
    assert f"\n  {ds / 'shard-00002.lmdb'}: " in r.stderr  # its size or hash differs from the manifest's
    assert f"\n  {ds / 'shard-00002.lmdb'} record 1: field 0: checksum mismatch\n" in r.stderr
    r = run_cli("fastload", "upgrade", "s3://bucket/ds")
    assert r.returncode == 1 and "upgrade the local copy, then upload it" in r.stderr
    r = run_cli("fastload", "upgrade", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "no such dataset directory" in r.stderr


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_loader_state_from_before_the_upgrade_resumes_after_it(tmp_path, backend):
    ds = write_old(tmp_path / "ds", 3)
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 5, "backend": backend}
    if backend == "torch":
        kwargs["num_workers"] = 0
    before = fastload.ShardLoader(ds, **kwargs)
    it = iter(before)
    next(it), next(it)
    state = before.state_dict()
    rest = [b["label"].tolist() for b in it]
    old_fingerprint = fastload.ShardDataset(ds).manifest.fingerprint
    fastload.upgrade_dataset(ds)  # the shard hashes change; the content, and so the fingerprint, do not
    upgraded = fastload.ShardDataset(ds).manifest
    assert upgraded.format_version == 4 and upgraded.fingerprint == old_fingerprint
    assert upgraded.extra["upgraded_from"] == {"format_version": 3, "fingerprint": old_fingerprint,
                                               "content": upgraded.content_fingerprint}
    after = fastload.ShardLoader(ds, **kwargs)
    after.load_state_dict(state)
    assert [b["label"].tolist() for b in after] == rest and rest


@pytest.mark.parametrize("reader", ["dataset", "native", "torch-workers"])
def test_a_reader_opened_before_the_upgrade_names_the_change_instead_of_corrupt_shards(tmp_path, reader):
    """Shards open when first read: a reader opened before the upgrade meets v4 shards under its v3 manifest.

    It refuses them as a dataset changed since it was opened (open it again), not as corrupt shards; a shard
    it had already opened keeps reading the old file it maps."""
    ds = write_old(tmp_path / "ds", 3)
    want = expected(20)
    if reader == "dataset":
        opened = fastload.ShardDataset(ds)
        assert np.array_equal(opened[0]["label"].numpy(), want["label"][0])  # shard 0 open before the upgrade
    else:
        options = {"num_threads": 2} if reader == "native" else {"backend": "torch", "num_workers": 2}
        opened = fastload.ShardLoader(ds, batch_size=4, **options)
    fastload.upgrade_dataset(ds)
    with pytest.raises(DatasetError, match=rf"{ds}: the dataset changed after it was opened: its manifest was "
                                           rf"rewritten .*open the dataset again \(open: .*shard-0000"):
        if reader == "dataset":
            assert np.array_equal(opened[1]["label"].numpy(), want["label"][1])  # the old file, still mapped
            opened[len(opened) - 1]
        else:
            list(opened)
    assert_reads(ds, want)  # opened again: the upgraded dataset reads as before


def test_a_dataset_whose_shard_is_damaged_is_still_reported_corrupt_when_its_manifest_is_unchanged(tmp_path):
    ds = write_old(tmp_path / "ds", 3)
    opened = fastload.ShardDataset(ds)
    shard = ds / "shard-00001.lmdb"
    data = bytearray(shard.read_bytes())
    data[:8192] = bytes(8192)  # both LMDB meta pages: the file no longer opens
    shard.write_bytes(bytes(data))
    with pytest.raises(fastload.errors.CorruptShardError, match="shard-00001") as caught:
        opened[7]  # shard 1's first record
    assert "changed after it was opened" not in str(caught.value)


def test_upgraded_from_is_checked_like_the_rest_of_the_manifest(tmp_path):
    ds = write_old(tmp_path / "ds", 3)
    fastload.upgrade_dataset(ds)
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    good = doc["upgraded_from"]
    for bad, problem in [({"format_version": 3}, "missing key"), ({**good, "format_version": 9}, "out of range"),
                         ({**good, "fingerprint": "xyz"}, "16 lowercase hex digits"),
                         ({**good, "content": "0" * 15}, "16 lowercase hex digits")]:
        (ds / MANIFEST_NAME).write_text(json.dumps({**doc, "upgraded_from": bad}))
        with pytest.raises(DatasetError, match=f"upgraded_from.*{problem}"):
            fastload.ShardDataset(ds)


@pytest.mark.skipif(os.name != "posix", reason="the lock is POSIX flock")
def test_two_upgrades_of_one_directory_at_once_are_refused(tmp_path):
    import fcntl

    ds = write_old(tmp_path / "ds", 2)
    fd = os.open(ds, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running upgrade holds
        with pytest.raises(DatasetError, match="another fastload upgrade is running on it"):
            fastload.upgrade_dataset(ds)
    finally:
        os.close(fd)
    assert fastload.upgrade_dataset(ds).upgraded


def test_upgraded_from_copied_onto_another_dataset_gives_it_no_other_fingerprint(tmp_path):
    """The former fingerprint stands only for the content the upgrade wrote: copied elsewhere it is ignored."""
    a, b = write_old(tmp_path / "a", 3), write_old(tmp_path / "b", 3, n=24, start=100)
    state = fastload.ShardLoader(a, batch_size=4, backend="torch", num_workers=0).state_dict()
    fastload.upgrade_dataset(a)
    fastload.upgrade_dataset(b)
    doc_a, doc_b = (json.loads((d / MANIFEST_NAME).read_text()) for d in (a, b))
    doc_b["upgraded_from"] = doc_a["upgraded_from"]
    (b / MANIFEST_NAME).write_text(json.dumps(doc_b))
    manifest = fastload.ShardDataset(b).manifest
    assert manifest.fingerprint == manifest.content_fingerprint != doc_a["upgraded_from"]["fingerprint"]
    with pytest.raises(fastload.StateError, match="another dataset"):
        fastload.ShardLoader(b, batch_size=4, backend="torch", num_workers=0).load_state_dict(state)


def test_a_shard_changed_after_the_check_is_not_bound_into_the_upgrade(tmp_path, monkeypatch):
    """Records swapped between the first check and the rewrite: refused, not laundered into a dataset that verifies."""
    ds = write_old(tmp_path / "ds", 3)
    before = {p.name: p.read_bytes() for p in ds.iterdir() if p.is_file()}
    real = _upgrade.verify_dataset
    calls = []

    def check_then_swap(directory, **kwargs):
        report = real(directory, **kwargs)
        if not calls:
            shard = ds / "shard-00000.lmdb"
            values = shard_edit.read_values(shard)
            values[0], values[1] = values[1], values[0]
            shard_edit.put_values(shard, values)
            before["shard-00000.lmdb"] = shard.read_bytes()
        calls.append(directory)
        return report

    monkeypatch.setattr(_upgrade, "verify_dataset", check_then_swap)
    with pytest.raises(DatasetError, match="changed after it was checked"):
        fastload.upgrade_dataset(ds)
    assert {p.name: p.read_bytes() for p in ds.iterdir() if p.is_file()} == before
    assert not (ds / ".upgrade").exists()


def test_a_shard_that_is_a_symbolic_link_is_refused_with_nothing_changed(tmp_path):
    ds = write_old(tmp_path / "ds", 3)
    store = tmp_path / "store"
    store.mkdir()
    (ds / "shard-00001.lmdb").rename(store / "one.lmdb")
    (ds / "shard-00001.lmdb").symlink_to(store / "one.lmdb")
    with pytest.raises(DatasetError, match=r"shard-00001.lmdb: a symbolic link \(to .*one.lmdb\)"):
        fastload.upgrade_dataset(ds)
    assert (ds / "shard-00001.lmdb").is_symlink()
    assert json.loads((ds / MANIFEST_NAME).read_text())["format_version"] == 3
