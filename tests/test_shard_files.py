"""Shard files before anything reads them: FIFOs, empty files, links out of the dataset, path traversal."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload import _native
from fastload.errors import CorruptShardError, DatasetError
from fastload.format._lmdb_check import validate_shard

BACKENDS = ["native", "torch"]


@pytest.fixture
def dataset(tmp_path) -> Path:
    out = tmp_path / "ds"
    fastload.write_arrays(out, {"x": np.arange(40, dtype=np.int64)}, samples_per_shard=20)
    return out


@pytest.mark.timeout(60)
def test_fifo_in_place_of_a_shard_is_refused_without_blocking(dataset):
    shard = dataset / "shard-00001.lmdb"
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(CorruptShardError, match="not a regular file"):
        fastload.ShardDataset(dataset)
    with pytest.raises(CorruptShardError, match="not a regular file"):
        _native.ShardSet([str(shard)], [20], [True])
    for native in (True, False):
        with pytest.raises(CorruptShardError, match="not a regular file"):
            validate_shard(str(shard), 20, use_native=native, packed=True)
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1 and "not a regular file" in r.stdout


def test_empty_shard_has_a_clear_message(dataset):
    shard = dataset / "shard-00000.lmdb"
    shard.write_bytes(b"")
    with pytest.raises(CorruptShardError, match=r"the file is empty \(0 bytes\)"):
        fastload.ShardDataset(dataset)
    with pytest.raises(CorruptShardError, match=r"shard-00000.lmdb: the file is empty \(0 bytes\)"):
        _native.ShardSet([str(shard)], [20], [True])
    for native in (True, False):
        with pytest.raises(CorruptShardError, match=r"the file is empty \(0 bytes\)"):
            validate_shard(str(shard), 20, use_native=native, packed=True)


def test_shard_linked_from_outside_the_dataset_needs_opt_in(dataset, tmp_path):
    outside = tmp_path / "elsewhere.lmdb"
    shutil.move(dataset / "shard-00001.lmdb", outside)
    (dataset / "shard-00001.lmdb").symlink_to(outside)
    for backend in BACKENDS:
        with pytest.raises(CorruptShardError, match="outside the dataset directory.*allow_external_shards=True"):
            fastload.ShardLoader(dataset, batch_size=8, backend=backend, num_workers=0)
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1 and "outside the dataset directory" in r.stdout
    # With the opt-in both backends read every sample and verify passes.
    for backend in BACKENDS:
        loader = fastload.ShardLoader(dataset, batch_size=8, backend=backend, num_workers=0,
                                      allow_external_shards=True)
        assert sorted(int(v) for b in loader for v in b["x"]) == list(range(40))
    r = run_cli("fastload", "verify", "--allow-external-shards", str(dataset))
    assert r.returncode == 0, r.stdout + r.stderr


def test_link_inside_the_dataset_is_fine(dataset):
    inner = dataset / "sub"
    inner.mkdir()
    shutil.move(dataset / "shard-00000.lmdb", inner / "real.lmdb")
    (dataset / "shard-00000.lmdb").symlink_to(inner / "real.lmdb")
    loader = fastload.ShardLoader(dataset, batch_size=8, backend="native")
    assert sorted(int(v) for b in loader for v in b["x"]) == list(range(40))


def test_path_traversal_stays_refused(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["shards"][0]["file"] = "../ds/shard-00000.lmdb"
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="plain file name"):
        fastload.ShardDataset(dataset)
    with pytest.raises(DatasetError, match="plain file name"):
        fastload.ShardDataset(dataset, allow_external_shards=True)


def test_native_shards_are_validated_once_per_process_while_in_use(dataset):
    def opened(loader):  # the first pass opens the shards
        assert sorted(int(v) for b in loader for v in b["x"]) == list(range(40))
        return loader._shards

    first = fastload.ShardLoader(dataset, batch_size=8, backend="native")
    second = fastload.ShardLoader(dataset, batch_size=8, backend="native")
    assert opened(first) is opened(second) is not None
    shard = dataset / "shard-00000.lmdb"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    third = fastload.ShardLoader(dataset, batch_size=8, backend="native")
    assert opened(third) is not first._shards  # a changed file is mapped and validated again
