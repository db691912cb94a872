"""Shards written by the tasks of a Dask cluster themselves, on a plan made before anything is encoded.

The promise: when the shard boundaries can be planned (a sample count per shard, or records of one
size), each task writes one whole shard (a hidden name in a shared directory renamed by the driver
once checked, or an upload to object storage) and no record travels to the driver, which writes only
the first shard; the output is the one-machine output byte for byte, with bad files skipped or
named as locally, and an interrupted run resumes to the same bytes, also in a bucket.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import struct
import zlib

import numpy as np
import pytest
from conftest import preprocess_two_classes
from test_conversion_dask import Tiles, assert_identical, small_chunks  # noqa: F401  (autouse: ~20 samples a task)
from test_remote import BUCKET, s3  # noqa: F401  (s3: the fixture)
from test_remote_output import objects

import fastload
from fastload.conversion import _shard_targets
from fastload.conversion._shard_plan import plan_shards, record_bound, record_size, shard_capacity
from fastload.conversion._shard_targets import LocalShards
from fastload.conversion._write_groups import GroupedOrder, group_samples_for
from fastload.errors import PreprocessError
from fastload.format._manifest import ShardInfo
from fastload.format._record import Field

distributed = pytest.importorskip("distributed", reason="fastload[dask] (distributed) is not installed")

pytestmark = pytest.mark.slow  # tier: Dask clusters


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with distributed.Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def driver_writes(monkeypatch):
    """The shards this process (the driver) writes itself, by index; tasks run in the workers, not counted."""
    written: list[int] = []
    real = _shard_targets.write_shard

    def counting(directory, index, records, binding=None, durable=True):
        written.append(index)
        return real(directory, index, records, binding, durable)

    monkeypatch.setattr(_shard_targets, "write_shard", counting)
    return written


def in_order_boundaries(counts: list[int], samples: int | None, max_bytes: int | None, size: int) -> list[list]:
    """The shards the one-machine writer fills as records arrive (``_dataset_writer._write_in_order``'s rule)."""
    shards, current, filled = [], [], 0
    for source, n in enumerate(counts):
        for t in range(n):
            if max_bytes and current and filled + size > max_bytes:
                shards.append(current)
                current, filled = [], 0
            current.append((source, t))
            filled += size
            if samples and len(current) == samples:
                shards.append(current)
                current, filled = [], 0
    if current:
        shards.append(current)
    return shards


def test_the_plan_is_the_one_machine_rule_for_any_counts_and_limits():
    rng = random.Random(0)
    for _ in range(400):
        counts = [rng.choice([0, 0, 1, 2, 3, 7, 16, 40]) for _ in range(rng.randint(0, 12))]
        fields = (Field("image", "uint8", (rng.randint(1, 5000),)), Field("label", "int64", ()))
        size = record_size(fields)
        samples = rng.choice([None, 1, 2, 5, 16, 64])
        max_bytes = rng.choice([None, 1, size, size * 3 - 1, size * 3, size * 3 + 1, 10 * size + 7])
        if samples is None and max_bytes is None:
            samples = 4
        capacity = shard_capacity(samples, max_bytes, fields)
        planned = plan_shards(counts, (0, 0), 0, capacity)
        expected = in_order_boundaries(counts, samples, max_bytes, size)
        got = [[(s, t) for s, a, b in shard.pieces for t in range(a, b)] for shard in planned]
        assert got == expected, (counts, samples, max_bytes, size)
        assert [shard.index for shard in planned] == list(range(len(planned)))
        for before, after in itertools.pairwise(planned):  # each shard says where the next starts
            following = plan_shards(counts, (before.next_source, before.next_tile), before.index + 1, capacity)
            assert following[0].pieces == after.pieces


def test_compressed_records_plan_by_count_only_when_the_byte_limit_cannot_be_reached():
    raw = (Field("image", "uint8", (3, 8, 8)), Field("label", "int64", ()))
    zstd = (Field("image", "uint8", (3, 8, 8), "zstd", {"level": 3}), Field("label", "int64", ()))
    size = record_size(raw)
    assert size is not None and size > 3 * 8 * 8 + 8
    assert record_size(zstd) is None
    assert shard_capacity(None, 1 << 20, zstd) is None  # sizes decide
    assert shard_capacity(16, 1000, zstd) is None  # 16 records may reach 1000 bytes
    assert shard_capacity(16, 1 << 20, zstd) == 16  # they cannot reach 1 MB: the count decides
    assert shard_capacity(16, None, zstd) == 16
    assert shard_capacity(None, 10, raw) == 1  # a shard holds at least one record
    assert shard_capacity(None, 10 * size + 3, raw) == 10


SHAPES = [(1, 8, 8), (3, 17, 9), (3, 64, 64), (4, 33, 40)]


@pytest.mark.parametrize(("codec", "shape"), [(c, s) for c in ("zstd", "zstd-shuffle", "lz4", "lz4-shuffle", "png",
                                                               "jpeg") for s in SHAPES if c != "jpeg" or s[0] != 4])
def test_no_record_exceeds_its_bound(codec, shape):
    from fastload.format._codecs import default_options
    from fastload.format._record import RecordEncoder

    options = default_options(codec, None, "chw" if codec in ("png", "jpeg") else None,
                              100 if codec == "jpeg" else None, "444" if codec == "jpeg" else None)
    fields = (Field("image", "uint8", shape, codec, options), Field("label", "int64", ()))
    encoder = RecordEncoder(fields)
    rng = np.random.default_rng(0)
    for sample in (rng.integers(0, 256, shape, dtype=np.uint8), np.zeros(shape, np.uint8)):  # noise: the worst
        assert len(encoder.encode({"image": sample, "label": np.int64(3)})) <= record_bound(fields)


def test_tasks_write_the_shards_and_the_bytes_are_the_one_machine_bytes(tmp_path, client, driver_writes):
    options = dict(codec={"image": "zstd"}, samples_per_shard=16, progress=False)
    fastload.write_dataset(Tiles(300), tmp_path / "local", **options)
    driver_writes.clear()
    manifest = fastload.write_dataset(Tiles(300), tmp_path / "dask", client=client, **options)
    assert len(manifest.shards) == 19
    assert driver_writes == [0]  # the first shard (it fixes the dataset's id); the tasks wrote the other 18
    assert_identical(tmp_path / "local", tmp_path / "dask")
    assert not (tmp_path / "dask" / _shard_targets.TASKS_DIR).exists()


def png_that_probes_but_does_not_decode(png: bytes) -> bytes:
    """``png`` with its pixel data cut in half, every chunk's CRC still right: the probe passes, decoding fails."""
    out, at = [png[:8]], 8
    while at < len(png):
        length = struct.unpack(">I", png[at:at + 4])[0]
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + length]
        if kind == b"IDAT":
            data = data[: len(data) // 2]
        out.append(struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data)))
        at += 12 + length
    return b"".join(out)


def test_the_driver_says_when_it_writes_the_shards_itself_and_why(tmp_path, client, capsys):
    from test_conversion_dask import streamed

    fastload.write_dataset(Tiles(60), tmp_path / "zstd", codec="zstd", shard_size="8KB", client=client)
    fastload.write_dataset(streamed(60), tmp_path / "stream", samples_per_shard=16, client=client)
    fastload.write_dataset(Tiles(60), tmp_path / "planned", codec="zstd", samples_per_shard=16, client=client)
    out = capsys.readouterr().out
    assert "dask: zstd: the driver writes the shards (their boundaries depend on the compressed sizes" in out
    assert "dask: stream: the driver writes the shards (an iterable dataset" in out
    assert "dask: planned:" not in out


def test_raw_tiles_with_a_byte_limit_are_planned_and_a_bad_image_is_skipped_as_locally(tmp_path, two_class_pngs,
                                                                                       cluster):
    data = tmp_path / "data"
    shutil.copytree(two_class_pngs, data)
    bad = png_that_probes_but_does_not_decode((data / "dogs" / "2.png").read_bytes())
    (data / "dogs" / "2.png").write_bytes(bad)  # found by the encode tasks, not by the probe
    raw = ("--codec", "raw", "--shard-size", "10KB")  # 3 tiles of 3x32x32 a shard: images span shards
    skip = ("--skip-bad", "--order", "source")  # a shuffled order cannot skip a file found bad in decoding
    local = preprocess_two_classes(data, tmp_path / "local", *raw, *skip)
    dask = preprocess_two_classes(data, tmp_path / "dask", *raw, *skip, "--scheduler", cluster.scheduler_address)
    assert local.returncode == 0 and dask.returncode == 0, local.stderr + dask.stderr
    assert "skipping dogs/2.png" in local.stdout and "skipping dogs/2.png" in dask.stdout  # by an encode task
    assert_identical(tmp_path / "local", tmp_path / "dask")
    skipped = [json.loads((tmp_path / "dask" / s / "manifest.json").read_text())["skipped"] for s in ("train", "val")]
    assert [s["path"] for part in skipped for s in part] == ["dogs/2.png"]
    assert len(json.loads((tmp_path / "dask" / "train" / "manifest.json").read_text())["shards"]) > 3

    (data / "cats" / "1.png").write_bytes(png_that_probes_but_does_not_decode((data / "cats" / "1.png").read_bytes()))
    runs = [preprocess_two_classes(data, tmp_path / name, *raw, *engine)
            for name, engine in (("refused-local", ()), ("refused", ("--scheduler", cluster.scheduler_address)))]
    assert runs[0].returncode == runs[1].returncode == 1, runs[0].stderr + runs[1].stderr
    assert runs[1].stderr == runs[0].stderr  # the same bad files named, in the same words, as locally
    assert str(data / "cats" / "1.png") in runs[1].stderr and "failed to decode" in runs[1].stderr
    assert not list((tmp_path / "refused").rglob("manifest.json"))
    assert not list((tmp_path / "refused").rglob("shard-*.lmdb")) or (tmp_path / "refused" / "train" /
                                                                       ".progress.json").exists()


def test_a_failed_run_leaves_only_checked_shards_and_resumes_to_the_same_bytes(tmp_path, client):
    options = dict(codec="lz4", samples_per_shard=16, progress=False)
    fastload.write_dataset(Tiles(), tmp_path / "whole", **options)
    out = tmp_path / "resumed"
    with pytest.raises(PreprocessError, match="disk gone at 150"):
        fastload.write_dataset(Tiles(fail_at=150), out, client=client, **options)
    progress = json.loads((out / ".progress.json").read_text())
    journaled = [s["file"] for s in progress["shards"]]
    order = GroupedOrder(0, None, len(Tiles()), group_samples_for(3 * 16 * 16 + 8 + 4))  # a sample per source
    at = int(np.flatnonzero(order.samples(0, len(Tiles())) == 150)[0])
    assert journaled == [f"shard-{i:05d}.lmdb" for i in range(at // 16)]  # the shards before the error's
    assert sorted(p.name for p in out.glob("*.lmdb")) == journaled  # a task's shard is named only once checked
    assert not (out / _shard_targets.TASKS_DIR).exists()  # what tasks staged went with the failed run
    fastload.write_dataset(Tiles(), out, resume=True, client=client, **options)
    assert_identical(tmp_path / "whole", out)
    assert not (out / _shard_targets.TASKS_DIR).exists()


def test_tasks_upload_the_shards_to_a_bucket_and_a_failed_run_resumes_there(tmp_path, s3, client,  # noqa: F811
                                                                            driver_writes):
    _, s3_client, storage = s3
    options = dict(codec="zstd", samples_per_shard=32, progress=False)
    fastload.write_dataset(Tiles(), tmp_path / "local", **options)
    url = f"s3://{BUCKET}/planned"
    remote = dict(storage_options=storage, cache_dir=tmp_path / "cache", client=client, **options)
    with pytest.raises(PreprocessError, match="disk gone at 200"):
        fastload.write_dataset(Tiles(fail_at=200), url, **remote)
    assert "manifest.json" not in objects(s3_client, "planned")  # nothing looks complete
    driver_writes.clear()
    fastload.write_dataset(Tiles(), url, resume=True, **remote)
    assert driver_writes == []  # the shards journaled were checked in the bucket (HEAD), not written again
    stored = objects(s3_client, "planned")
    local = {p.name: p.read_bytes() for p in (tmp_path / "local").glob("*.lmdb")}
    assert {n: b for n, b in stored.items() if n.endswith(".lmdb")} == local
    theirs = json.loads(stored["manifest.json"])
    ours = json.loads((tmp_path / "local" / "manifest.json").read_text())
    for doc in (theirs, ours):
        doc["provenance"].pop("created")
    assert theirs == ours


def test_a_task_given_up_on_cannot_replace_a_committed_shard_in_a_bucket(s3):  # noqa: F811
    """A task still running after a replan or Ctrl-C uploads only under a key of its own, never a shard's name."""
    from fastload.conversion._shard_targets import RemoteShards
    from fastload.storage._client import StorageOptions

    _, s3_client, storage = s3
    url = f"s3://{BUCKET}/staged"
    target = RemoteShards(url, url, StorageOptions.build(storage))
    fields = (Field("image", "uint8", (4,)),)
    from fastload.format._record import RecordEncoder

    encoder = RecordEncoder(fields)
    target.open_staging()  # the driver, before it submits the tasks
    ours = target.stage(3, [encoder.encode({"image": np.arange(4, dtype=np.uint8)})], (fields, "0" * 32))
    stale = target.stage(3, [encoder.encode({"image": np.ones(4, np.uint8)})], (fields, "0" * 32))
    assert ours[0].bytes == stale[0].bytes and ours[0].hash != stale[0].hash and ours[1] != stale[1]
    target.commit(ours)
    stored = objects(s3_client, "staged")
    assert sorted(stored) == [f".tasks/{target._run}.open", stale[1], "shard-00003.lmdb"]  # staged, not named
    target.clean_staged()
    stored = objects(s3_client, "staged")
    assert list(stored) == ["shard-00003.lmdb"]
    assert f"xxh3-128:{__import__('xxhash').xxh3_128(stored['shard-00003.lmdb']).hexdigest()}" == ours[0].hash


def test_a_relative_output_directory_is_the_driver_s_on_every_worker(tmp_path, client, monkeypatch):
    import os

    options = dict(codec="zstd", samples_per_shard=16, progress=False)
    fastload.write_dataset(Tiles(100), tmp_path / "local", **options)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = client.run(os.getcwd)
    client.run(os.chdir, str(elsewhere))  # the workers run in another directory than the driver
    try:
        monkeypatch.chdir(tmp_path)
        fastload.write_dataset(Tiles(100), "relative", client=client, **options)
    finally:
        for worker, cwd in before.items():
            client.run(os.chdir, cwd, workers=[worker])
    assert_identical(tmp_path / "local", tmp_path / "relative")
    assert not list(elsewhere.iterdir())


def test_a_bucket_output_of_preprocess_tiles_is_uploaded_by_the_tasks(tmp_path, s3, two_class_pngs,  # noqa: F811
                                                                      monkeypatch, capsys):
    """The workers take credentials from their own environment, as any Dask job writing a bucket does."""
    from test_remote_output import s3_env

    from fastload.conversion.preprocess import main

    _, s3_client, _ = s3
    for key, value in {**s3_env(s3), "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)  # inherited by the worker processes of the cluster started below
    raw = ("--codec", "raw", "--shard-size", "10KB")
    assert preprocess_two_classes(two_class_pngs, tmp_path / "local", *raw).returncode == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        argv = ["--data-dir", str(two_class_pngs), "--output-dir", f"s3://{BUCKET}/pre", "--tile-size", "32",
                "--stride", "24", "--labels-from-dirs", "--val-fraction", "0.3", "--no-progress", *raw,
                "--scheduler", cluster.scheduler_address]
        assert main(argv) == 0
    printed = capsys.readouterr().out
    published = float(printed.split("published ")[1].split(": ")[1].split(" MB")[0])
    assert published < 0.01  # the driver published the manifests; the shards were uploaded by the tasks
    stored = {n: b for n, b in objects(s3_client, "pre").items() if n.endswith(".lmdb")}
    local = {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes() for p in (tmp_path / "local").rglob("*.lmdb")}
    assert stored == local and len(stored) > 6
    assert not [n for n in objects(s3_client, "pre") if ".tasks" in n]  # every staged attempt committed or deleted


def test_four_pool_workers_write_the_shards_themselves_with_the_same_bytes(tmp_path, driver_writes, two_class_pngs):
    from fastload.conversion._dataset_writer import POOL_TASKS_WRITE_FROM

    options = dict(codec="zstd", samples_per_shard=16, progress=False)
    fastload.write_dataset(Tiles(300), tmp_path / "one", **options)
    driver_writes.clear()
    fastload.write_dataset(Tiles(300), tmp_path / "four", workers=POOL_TASKS_WRITE_FROM, **options)
    assert driver_writes == [0]  # the forked workers wrote the other 18
    assert_identical(tmp_path / "one", tmp_path / "four")

    data = tmp_path / "data"
    shutil.copytree(two_class_pngs, data)
    (data / "dogs" / "2.png").write_bytes(png_that_probes_but_does_not_decode((data / "dogs" / "2.png").read_bytes()))
    raw = ("--codec", "raw", "--shard-size", "10KB", "--skip-bad", "--order", "source")
    runs = [preprocess_two_classes(data, tmp_path / f"pre-{n}", *raw, "--workers", str(n))
            for n in (1, POOL_TASKS_WRITE_FROM)]
    assert runs[0].returncode == runs[1].returncode == 0, runs[0].stderr + runs[1].stderr
    assert "skipping dogs/2.png" in runs[1].stdout
    assert_identical(tmp_path / "pre-1", tmp_path / f"pre-{POOL_TASKS_WRITE_FROM}")


def test_a_shard_the_driver_cannot_see_is_an_error_naming_the_shared_filesystem(tmp_path):
    target = LocalShards(tmp_path)
    info = ShardInfo("shard-00003.lmdb", 4, 1234, "xxh3-128:0")
    with pytest.raises(PreprocessError, match="filesystem every worker shares"):
        target.commit((info, str(tmp_path / ".tasks" / "elsewhere" / "shard-00003.lmdb")))
    with pytest.raises(PreprocessError, match="no such directory on"):
        LocalShards(tmp_path / "not-here").stage(3, [b"x"], ((), "0" * 32))
    fields = (Field("image", "uint8", (4,)),)
    from fastload.format._record import RecordEncoder

    records = [RecordEncoder(fields).encode({"image": np.arange(4, dtype=np.uint8)})]
    with pytest.raises(PreprocessError, match="has ended"):  # a task still running after its run ended
        target.stage(3, records, (fields, "0" * 32))
    assert not (tmp_path / ".tasks").exists()
    target.open_staging()
    staged_ok = target.stage(3, records, (fields, "0" * 32))
    target.clean_staged()
    assert not (tmp_path / ".tasks").exists() and staged_ok[0].count == 1
    staged = tmp_path / ".tasks" / "a" / "shard-00003.lmdb"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(np.zeros(100, np.uint8).tobytes())
    with pytest.raises(PreprocessError, match="100 bytes, the task that wrote it reported 1234"):
        target.commit((info, str(staged)))
    assert not (tmp_path / "shard-00003.lmdb").exists()
