"""A damaged shard in the cache of a remote dataset is healed: set aside, downloaded again, the epoch exact.

Against the moto S3 server of tests/test_remote.py (no mock). A byte flipped in a cached shard (in a
record's payload, so its checksum fails, or in the LMDB structure) is found when the shard is read:
the file is hashed against the manifest, downloaded again, one FastloadWarning names it, and the
batches are bitwise the local copy's, for the native backend (1 and 2 threads), the torch backend's
forked workers and a dataset indexed directly. When the damage cannot be healed (the object in the
store is damaged too, or the damage is in the dataset as written), the typed error names the file
and the command to run. A local dataset's damage is the error it always was.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from shard_edit import read_records, record_file_offset
from test_remote import BUCKET, batches, s3, same, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.errors import CorruptRecordError, CorruptShardError, FastloadWarning, RemoteError
from fastload.format._manifest import file_hash

pytestmark = pytest.mark.slow  # tier: the moto S3 server

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def small(tmp_path_factory, s3):  # noqa: F811
    """6 shards of 40 samples (raw 3x8x8 images), local and uploaded: (local path, URL)."""
    local = tmp_path_factory.mktemp("heal") / "ds"
    rng = np.random.default_rng(7)
    fastload.write_arrays(local, {"image": rng.integers(0, 255, (240, 3, 8, 8), dtype=np.uint8),
                                  "label": np.arange(240, dtype=np.int64)}, samples_per_shard=40)
    return local, upload(s3[1], local, "heal")


def flip_record_byte(shard: Path, key: int) -> None:
    """Flip the last payload byte of record ``key`` in its block (found by its contents): its checksum fails."""
    size = len(read_records(shard)[key])
    at = record_file_offset(shard, key)
    data = bytearray(shard.read_bytes())
    data[at + size - 1] ^= 0xFF
    write_in_place(shard, bytes(data))


def break_structure(shard: Path) -> None:
    """Point the newer LMDB meta page's root past the file's last page: the shard no longer opens."""
    data = bytearray(shard.read_bytes())
    psize = struct.unpack_from("<I", data, 40)[0]
    meta = psize if struct.unpack_from("<Q", data, psize + 144)[0] > struct.unpack_from("<Q", data, 144)[0] else 0
    struct.pack_into("<Q", data, meta + 128, 10**6)
    write_in_place(shard, bytes(data))


def write_in_place(path: Path, data: bytes) -> None:
    """Overwrite ``path``'s bytes, same inode and size (what a disk that flips a bit does)."""
    with open(path, "r+b") as f:
        f.write(data)


def warm_cache(url: str, options: dict, cache: Path) -> Path:
    """Download every shard of ``url`` into ``cache``; return the version's directory."""
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=cache)
    for start in np.cumsum([0] + [s.count for s in dataset.manifest.shards])[:-1]:
        dataset[int(start)]
    path = dataset.path
    dataset._cached.release()
    return path


def heal_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FastloadWarning) and "damaged" in
            str(w.message)]


def read_all(dataset) -> list[dict[str, torch.Tensor]]:
    return [dataset[i] for i in range(len(dataset))]


def assert_healed(version: Path, shard: str, manifest_hash: str, caught: list[warnings.WarningMessage]) -> None:
    """One warning naming the file; the file matches its manifest again; nothing set aside is left."""
    messages = heal_warnings(caught)
    assert len(messages) == 1, messages
    assert str(version / shard) in messages[0] and f"s3://{BUCKET}/" in messages[0]
    assert file_hash(version / shard) == manifest_hash
    assert not [p for p in version.iterdir() if ".damaged-" in p.name]


READERS = [pytest.param({"backend": "native", "num_threads": 1}, id="native-1"),
           pytest.param({"backend": "native", "num_threads": 2}, id="native-2"),
           pytest.param({"backend": "torch", "num_workers": 2}, id="torch-2"),
           pytest.param(None, id="dataset")]


@pytest.mark.parametrize("damage", ["record", "structure"])
@pytest.mark.parametrize("reading", READERS)
def test_a_damaged_cached_shard_is_healed_and_the_epoch_is_exact(small, s3, tmp_path, reading, damage):  # noqa: F811
    local, url = small
    cache = tmp_path / "cache"
    version = warm_cache(url, s3[2], cache)
    shard = "shard-00003.lmdb"
    good = file_hash(version / shard)
    if damage == "record":
        flip_record_byte(version / shard, 17)
    else:
        break_structure(version / shard)
    assert file_hash(version / shard) != good
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if reading is None:
            dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache)
            got, expected = read_all(dataset), read_all(fastload.ShardDataset(local))
        else:
            kwargs = {"batch_size": 16, "shuffle": True, "seed": 3, **reading}
            loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, **kwargs)
            got, expected = batches(loader), batches(fastload.ShardLoader(str(local), **kwargs))
            loader.set_epoch(1)  # the next epoch reads the healed file: no second warning
            again = fastload.ShardLoader(str(local), **kwargs)
            again.set_epoch(1)
            got, expected = got + batches(loader), expected + batches(again)
    assert same(got, expected)
    assert_healed(version, shard, good, caught)


def test_two_damaged_shards_are_healed_in_one_pass_each_warned_once(small, s3, tmp_path):  # noqa: F811
    local, url = small
    cache = tmp_path / "cache"
    version = warm_cache(url, s3[2], cache)
    flip_record_byte(version / "shard-00001.lmdb", 30)
    break_structure(version / "shard-00004.lmdb")
    kwargs = {"batch_size": 16, "shuffle": True, "seed": 11, "num_threads": 2, "backend": "native"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, **kwargs))
    assert same(got, batches(fastload.ShardLoader(str(local), **kwargs)))
    messages = heal_warnings(caught)
    assert sorted(m.split(":")[0] for m in messages) == [str(version / "shard-00001.lmdb"),
                                                          str(version / "shard-00004.lmdb")], messages


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_windowed_dataset_heals_a_damaged_shard_and_resumes_exactly(small, s3, tmp_path, backend):  # noqa: F811
    local, url = small
    largest = max(p.stat().st_size for p in local.glob("*.lmdb"))
    kwargs = {"batch_size": 16, "shuffle": False, "seed": 1, "backend": backend}
    if backend == "torch":
        kwargs["num_workers"] = 2
    limit = 2 * largest + largest // 2 + 8192
    cache = tmp_path / "cache"
    first = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, cache_limit=limit, **kwargs)
    assert first.dataset._cached.window is not None
    version = first.dataset.path
    batches(first)  # the last shards of the epoch stay in the cache
    present = sorted(p.name for p in version.glob("*.lmdb"))
    assert "shard-00005.lmdb" in present
    good = file_hash(version / "shard-00005.lmdb")
    flip_record_byte(version / "shard-00005.lmdb", 30)  # sample 230: read after the resume
    del first
    local_loader = fastload.ShardLoader(str(local), **kwargs)
    state = None
    for b, _ in enumerate(local_loader):  # the state after batch 12: the rest reads shards 4 and 5
        if b == 12:
            state = local_loader.state_dict()
            break
    assert state is not None
    expected_loader = fastload.ShardLoader(str(local), **kwargs)
    expected_loader.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, cache_limit=limit, **kwargs)
        loader.load_state_dict(state)
        got = batches(loader)
    assert same(got, batches(expected_loader)) and len(got) == 2
    messages = heal_warnings(caught)
    assert len(messages) == 1 and str(version / "shard-00005.lmdb") in messages[0], messages
    if (version / "shard-00005.lmdb").exists():
        assert file_hash(version / "shard-00005.lmdb") == good


@pytest.mark.parametrize("reading", [{"backend": "native", "num_threads": 2}, {"backend": "torch", "num_workers": 0},
                                     {"backend": "torch", "num_workers": 2}, None],
                         ids=["native", "torch-0", "torch-2", "dataset"])
def test_a_store_whose_object_is_damaged_too_gives_the_typed_error_naming_what_to_run(small, s3, tmp_path,  # noqa: F811
                                                                                     reading):
    local, _ = small
    prefix = "heal-bad-store-" + ("dataset" if reading is None else "-".join(map(str, reading.values())))
    url = upload(s3[1], local, prefix)
    cache = tmp_path / "cache"
    version = warm_cache(url, s3[2], cache)
    flip_record_byte(version / "shard-00002.lmdb", 3)
    damaged = bytearray((local / "shard-00002.lmdb").read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    s3[1].put_object(Bucket=BUCKET, Key=f"{prefix}/shard-00002.lmdb", Body=bytes(damaged))
    workers = reading is not None and reading.get("num_workers", 0) > 0
    # Forked workers race: one finds the damage and sets the file aside; another that reads the shard for the
    # first time then finds it absent and fetches it itself, and that download's RemoteError may come first.
    with pytest.raises((CorruptRecordError, RemoteError) if workers else CorruptRecordError) as caught:
        if reading is None:
            read_all(fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache))
        else:
            batches(fastload.ShardLoader(url, batch_size=16, storage_options=s3[2], cache_dir=cache, **reading))
    message = str(caught.value)
    if isinstance(caught.value, RemoteError):
        assert f"{url}/shard-00002.lmdb: content hash differs" in message and "tried 3 times" in message
    else:
        if not workers:  # (a worker's error is rebuilt in this process from its message)
            assert caught.value.path == str(version / "shard-00002.lmdb") and caught.value.record == 3
        assert f"{version / 'shard-00002.lmdb'} record 3: field" in message
        assert f"fastload verify {url}" in message and ("downloading it again failed" in message
                                                       or "downloaded again, which failed" in message)
    assert "content hash differs" in message and s3[2]["secret_access_key"] not in message


def make_damaged_as_written(local: Path, out: Path) -> Path:
    """Copy ``local`` with record 9 of shard 1 damaged and the manifest's hash of that shard made to match."""
    shutil.copytree(local, out)
    flip_record_byte(out / "shard-00001.lmdb", 9)
    doc = json.loads((out / "manifest.json").read_text())
    for entry in doc["shards"]:
        if entry["file"] == "shard-00001.lmdb":
            entry["hash"] = file_hash(out / "shard-00001.lmdb")
    (out / "manifest.json").write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize("reading", [{"backend": "native", "num_threads": 1}, {"backend": "torch", "num_workers": 2},
                                     None], ids=["native", "torch-2", "dataset"])
def test_damage_in_the_dataset_as_written_is_the_typed_error_naming_what_to_run(small, s3, tmp_path,  # noqa: F811
                                                                                reading):
    local, _ = small
    written = make_damaged_as_written(local, tmp_path / "written")
    prefix = f"heal-as-written-{'dataset' if reading is None else reading['backend']}"
    url = upload(s3[1], written, prefix)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CorruptRecordError) as error:
            if reading is None:
                read_all(fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache))
            else:
                batches(fastload.ShardLoader(url, batch_size=16, storage_options=s3[2], cache_dir=cache, **reading))
    message = str(error.value)
    assert "shard-00001.lmdb record 9: field" in message and "checksum mismatch" in message
    assert f"fastload verify {url}" in message and "matches its manifest's hash" in message
    assert not heal_warnings(caught)
    assert list(cache.rglob("shard-00001.lmdb")), "a file that matches its manifest was deleted"


@pytest.mark.parametrize("backend", ["native", "torch", "dataset"])
def test_a_local_datasets_damage_is_the_error_it_always_was(small, tmp_path, backend):
    local, _ = small
    copy = tmp_path / "ds"
    shutil.copytree(local, copy)
    flip_record_byte(copy / "shard-00001.lmdb", 9)
    before = (copy / "shard-00001.lmdb").read_bytes()
    with pytest.raises(CorruptRecordError) as error:
        if backend == "dataset":
            read_all(fastload.ShardDataset(copy))
        else:
            batches(fastload.ShardLoader(copy, batch_size=16, backend=backend, num_workers=0))
    assert "fastload verify" not in str(error.value) and "record 9" in str(error.value)
    assert (copy / "shard-00001.lmdb").read_bytes() == before
    break_structure(copy / "shard-00002.lmdb")
    with pytest.raises(CorruptShardError, match="shard-00002.lmdb") as shard_error:
        batches(fastload.ShardLoader(copy, batch_size=16, backend="native"))
    assert "fastload verify" not in str(shard_error.value)
