"""Conversion into object storage: write_dataset and preprocess_tiles with an s3:// output (moto on 127.0.0.1).

The promise: the published objects are byte for byte the files of a local run with the same options, the
manifest appears last (an interrupted publish leaves no manifest: the dataset looks incomplete, and a
rerun completes it), an existing dataset is replaced only when asked, and what is published reads back
as the local copy does.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import preprocess_two_classes
from ctrl_c_steps import ctrl_c_at_step
from test_remote import BUCKET, batches, s3, same  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.conversion._shard_targets import RemoteShards
from fastload.errors import ArgumentError, RemoteError
from fastload.format._record import Field, RecordEncoder

pytestmark = pytest.mark.slow  # tier: the moto S3 server, preprocess_tiles processes and a Dask cluster


def samples(n: int = 300):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (n, 3, 16, 16), dtype=np.uint8)
    return [{"image": images[i], "label": np.int64(i % 5)} for i in range(n)]


def objects(client, prefix: str) -> dict[str, bytes]:
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"].split("/", 1)[1]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            for o in listing}


def test_write_dataset_to_a_url_publishes_the_local_bytes_and_reads_back(s3, tmp_path):  # noqa: F811
    _, client, options = s3
    kwargs = {"codec": "zstd", "samples_per_shard": 64, "progress": False}
    local = tmp_path / "local"
    fastload.write_dataset(samples(), local, **kwargs)
    url = f"s3://{BUCKET}/out-a"
    manifest = fastload.write_dataset(samples(), url, storage_options=options, cache_dir=tmp_path / "cache", **kwargs)
    assert manifest.total == 300
    stored = objects(client, "out-a")
    written = {p.name: p.read_bytes() for p in local.iterdir() if p.is_file() and not p.name.startswith(".")}
    shard_names = {n for n in written if n.endswith(".lmdb")}
    assert set(stored) == set(written)
    assert all(stored[n] == written[n] for n in shard_names)  # byte for byte
    assert not list((tmp_path / "cache" / "publish").iterdir())  # the staging is gone once published
    loader = fastload.ShardLoader(url, batch_size=50, shuffle=True, seed=3, storage_options=options,
                                  cache_dir=tmp_path / "read")
    assert same(batches(loader), batches(fastload.ShardLoader(str(local), batch_size=50, shuffle=True, seed=3)))


def test_an_existing_dataset_is_replaced_only_when_asked(s3, tmp_path):  # noqa: F811
    _, client, options = s3
    url = f"s3://{BUCKET}/out-b"
    common = {"samples_per_shard": 100, "progress": False, "storage_options": options, "cache_dir": tmp_path}
    fastload.write_dataset(samples(200), url, **common)
    with pytest.raises(FileExistsError, match="out-b: holds a dataset"):
        fastload.write_dataset(samples(300), url, **common)
    fastload.write_dataset(samples(300), url, overwrite=True, **common)
    assert len(fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "read")) == 300
    with pytest.raises(ArgumentError, match="storage_options and cache_dir are for an output in object storage"):
        fastload.write_dataset(samples(10), tmp_path / "plain", samples_per_shard=5, storage_options=options)


def test_an_interrupted_publish_leaves_no_manifest_and_a_resumed_run_completes_it(s3, tmp_path, monkeypatch):  # noqa: F811
    _, client, options = s3
    url = f"s3://{BUCKET}/out-c"
    common = {"samples_per_shard": 50, "progress": False, "storage_options": options, "cache_dir": tmp_path}
    fastload.write_dataset(samples(100), url, **common)  # an old version, to be replaced
    import fastload.storage._publish as publish_module

    real_put = publish_module._obstore().put
    sent = []

    def failing_put(store, name, data, *args, **kwargs):
        if len(sent) == 3:
            raise ConnectionError("the link went down")
        sent.append(name)
        return real_put(store, name, data, *args, **kwargs)

    monkeypatch.setattr(publish_module._obstore(), "put", failing_put)
    with pytest.raises(RemoteError, match="out-c/shard-00003.lmdb: PUT failed"):
        fastload.write_dataset(samples(300), url, overwrite=True, **common)
    monkeypatch.undo()
    assert "manifest.json" not in objects(client, "out-c")  # the old manifest went first; the new one never came
    with pytest.raises(RemoteError, match="not found"):
        fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "read")
    fastload.write_dataset(samples(300), url, resume=True, **common)
    assert len(fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "read2")) == 300


def s3_env(s3) -> dict[str, str]:  # noqa: F811
    """The environment a user sets for an S3-compatible store (credentials never on the command line)."""
    endpoint, _, options = s3
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": options["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": options["secret_access_key"], "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}


def test_preprocess_tiles_to_a_url_with_splits_publishes_the_local_bytes(s3, tmp_path, two_class_pngs):  # noqa: F811
    image_dir = two_class_pngs
    _, client, options = s3
    env = {**s3_env(s3), "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")}
    local = preprocess_two_classes(image_dir, str(tmp_path / "local"))
    remote = preprocess_two_classes(image_dir, f"s3://{BUCKET}/tiles-out", env=env)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert "published s3://fastload-tests/tiles-out" in remote.stdout
    assert options["secret_access_key"] not in remote.stdout + remote.stderr
    stored = objects(client, "tiles-out")
    written = {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes()
               for p in (tmp_path / "local").rglob("*") if p.is_file() and not p.name.startswith(".")}
    assert set(stored) == set(written)
    assert all(stored[n] == written[n] for n in written if n.endswith(".lmdb"))  # byte for byte
    for split in ("train", "val"):
        remote_ds = fastload.ShardDataset(f"s3://{BUCKET}/tiles-out", split=split, storage_options=options,
                                          cache_dir=tmp_path / "read")
        local_ds = fastload.ShardDataset(tmp_path / "local", split=split)
        assert len(remote_ds) == len(local_ds) > 0
        assert all(int(remote_ds[i]["label"]) == int(local_ds[i]["label"]) for i in range(len(local_ds)))
    again = preprocess_two_classes(image_dir, f"s3://{BUCKET}/tiles-out", env=env)
    assert again.returncode == 2 and "holds a dataset" in again.stderr  # not replaced unless asked
    assert preprocess_two_classes(image_dir, f"s3://{BUCKET}/tiles-out", "--overwrite", env=env).returncode == 0


def test_write_dataset_on_a_dask_cluster_to_a_url_publishes_the_one_machine_bytes(s3, tmp_path):  # noqa: F811
    distributed = pytest.importorskip("distributed", reason="fastload[dask] (distributed) is not installed")
    _, client, options = s3
    kwargs = {"codec": "lz4", "samples_per_shard": 40, "progress": False}
    fastload.write_dataset(samples(), tmp_path / "local", **kwargs)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as dask_client:
        fastload.write_dataset(samples(), f"s3://{BUCKET}/dask-out", client=dask_client, storage_options=options,
                               cache_dir=tmp_path / "cache", **kwargs)
    stored = objects(client, "dask-out")
    written = {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir() if p.name.endswith(".lmdb")}
    assert written and all(stored[n] == written[n] for n in written)


def test_a_shard_larger_than_a_part_is_uploaded_in_parts_and_arrives_whole(s3, tmp_path):  # noqa: F811
    """A 13 MB shard goes up as a multipart upload (obstore's parts are 5 MB); the object is the shard."""
    _, client, options = s3
    rng = np.random.default_rng(2)
    big = [{"x": rng.integers(0, 255, 65536, dtype=np.uint8)} for _ in range(200)]
    fastload.write_dataset(big, tmp_path / "local", samples_per_shard=200, progress=False)
    fastload.write_dataset(big, f"s3://{BUCKET}/big-out", samples_per_shard=200, progress=False,
                           storage_options=options, cache_dir=tmp_path / "cache")
    shard = (tmp_path / "local" / "shard-00000.lmdb").read_bytes()
    assert len(shard) > 10 << 20
    head = client.head_object(Bucket=BUCKET, Key="big-out/shard-00000.lmdb")
    assert "-" in head["ETag"]  # a multipart upload's ETag: "<md5 of the parts' md5s>-<parts>"
    assert client.get_object(Bucket=BUCKET, Key="big-out/shard-00000.lmdb")["Body"].read() == shard


def test_resume_and_overwrite_at_a_url_behave_as_for_a_directory(s3, tmp_path, monkeypatch):  # noqa: F811
    """resume=True on a finished URL changes nothing; an interrupted, staged conversion is refused without resume
    or overwrite; a new layout replaces an old one's manifests everywhere (none of the old splits stays visible)."""
    _, client, options = s3
    url = f"s3://{BUCKET}/out-d"
    common = {"samples_per_shard": 50, "progress": False, "storage_options": options, "cache_dir": tmp_path}
    fastload.write_dataset(samples(100), url, **common)
    before = {o["Key"]: o["LastModified"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="out-d/")["Contents"]}
    manifest = fastload.write_dataset(samples(100), url, resume=True, **common)
    after = {o["Key"]: o["LastModified"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="out-d/")["Contents"]}
    assert manifest.total == 100 and before == after  # complete already: nothing written again

    import fastload.storage._publish as publish_module

    def no_publish(*args, **kwargs):
        raise KeyboardInterrupt  # the conversion is staged, then interrupted before its publication

    monkeypatch.setattr("fastload.conversion._remote_output.publish", no_publish)
    with pytest.raises(KeyboardInterrupt):
        fastload.write_dataset(samples(200), url, overwrite=True, **common)
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match="interrupted conversion to it is staged"):
        fastload.write_dataset(samples(200), url, **common)
    assert fastload.write_dataset(samples(200), url, resume=True, **common).total == 200
    client.put_object(Bucket=BUCKET, Key="out-d/train/manifest.json", Body=b"{}")  # an old layout's split
    client.put_object(Bucket=BUCKET, Key="out-d/train/shard-00000.lmdb", Body=b"x")
    client.put_object(Bucket=BUCKET, Key="out-d/splits.json", Body=b"{}")
    client.put_object(Bucket=BUCKET, Key="out-d/test/manifest.json", Body=b"{}")  # no split fastload writes
    fastload.write_dataset(samples(60), url, overwrite=True, **common)
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="out-d/")["Contents"]}
    assert not keys & {"out-d/train/manifest.json", "out-d/train/shard-00000.lmdb", "out-d/splits.json"}
    assert "out-d/test/manifest.json" in keys  # not the dataset's: never touched
    keys.discard("out-d/test/manifest.json")
    assert sorted(k for k in keys if k.endswith(".lmdb")) == ["out-d/shard-00000.lmdb", "out-d/shard-00001.lmdb"]
    assert len(fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "read")) == 60
    assert publish_module.staging_dir(tmp_path, url).exists() is False


def test_an_overwrite_interrupted_at_any_step_is_finished_by_resume(s3, tmp_path):  # noqa: F811
    # An overwrite interrupted before its staging directory held a file, then resumed, gave back the URL's
    # old dataset as complete (found by a review): the run now marks itself started before it writes
    _, client, options = s3
    common = {"samples_per_shard": 5, "progress": False, "storage_options": options}
    reference = f"s3://{BUCKET}/out-ref"
    fastload.write_dataset(samples(12), reference, cache_dir=tmp_path / "ref", **common)
    expected = objects(client, "out-ref")
    k = 0
    while True:
        k += 1
        url, cache = f"s3://{BUCKET}/out-k{k}", tmp_path / f"cache{k}"
        fastload.write_dataset(samples(40), url, cache_dir=cache, **common)  # the old dataset
        with ctrl_c_at_step(k) as taken:
            try:
                fastload.write_dataset(samples(12), url, overwrite=True, cache_dir=cache, **common)
            except KeyboardInterrupt:
                pass
        if taken[0] < k:
            break
        assert fastload.write_dataset(samples(12), url, resume=True, cache_dir=cache, **common).total == 12, k
        stored = objects(client, f"out-k{k}")
        assert sorted(stored) == sorted(expected), f"interrupted at step {k}"
        assert all(stored[n] == expected[n] for n in expected if n.endswith(".lmdb")), f"interrupted at step {k}"
        assert not list((cache / "publish").iterdir()), f"interrupted at step {k}: staging left"
    assert k > 10


def test_resume_of_a_finished_url_with_other_options_is_refused(s3, tmp_path, two_class_pngs):  # noqa: F811
    _, client, options = s3
    url = f"s3://{BUCKET}/out-opts"
    common = {"progress": False, "storage_options": options, "cache_dir": tmp_path}
    fastload.write_dataset(samples(12), url, samples_per_shard=4, **common)
    with pytest.raises(ArgumentError, match=r"(?s)resume=True with options that differ.*"
                                            r"--codec: recorded raw, now zstd.*--samples-per-shard: recorded 4, now 6"):
        fastload.write_dataset(samples(12), url, samples_per_shard=6, codec="zstd", resume=True, **common)
    assert fastload.write_dataset(samples(12), url, samples_per_shard=4, resume=True, **common).total == 12

    cli_url = f"s3://{BUCKET}/out-opts-cli"  # with splits: the options recorded in splits.json
    env = {**s3_env(s3), "FASTLOAD_CACHE_DIR": str(tmp_path / "cli-cache")}
    missing = preprocess_two_classes(tmp_path / "no-such-folder", cli_url, env=env)
    assert missing.returncode != 0 and "no-such-folder" in missing.stderr  # refused: marks nothing started
    assert preprocess_two_classes(two_class_pngs, cli_url, env=env).returncode == 0
    r = preprocess_two_classes(two_class_pngs, cli_url, "--tile-size", "16", "--resume", env=env)
    assert r.returncode == 2 and "--tile-size: recorded 32x32, now 16x16" in r.stderr, r.stderr
    assert "splits.json" in r.stderr and options["secret_access_key"] not in r.stderr
    r = preprocess_two_classes(two_class_pngs, cli_url, "--resume", env=env)
    assert r.returncode == 0 and "complete already" in r.stdout, r.stderr
    client.put_object(Bucket=BUCKET, Key="out-opts-cli/train/manifest.json", Body=b"{")  # damaged since
    r = preprocess_two_classes(two_class_pngs, cli_url, "--resume", env=env)
    assert r.returncode == 1 and "out-opts-cli/train/manifest.json" in r.stderr and "complete" not in r.stdout


def test_a_task_given_up_on_leaves_no_staged_shard_even_after_the_next_run_ended(s3, tmp_path):  # noqa: F811
    # On a Dask cluster, a task still running when its run was interrupted uploaded its staged shard after the
    # resumed run had cleaned .tasks/ and finished: a stray object in the finished dataset (found by a review)
    _, client, options = s3
    url = f"s3://{BUCKET}/out-tasks"
    fields = [Field("x", "uint8", (4,))]
    records = [RecordEncoder(fields).encode({"x": np.full(4, i, np.uint8)}) for i in range(3)]
    binding = (fields, "00112233445566778899aabbccddeeff")
    interrupted = RemoteShards(url, url, options)  # the driver of the interrupted run
    interrupted.clean_staged()
    interrupted.open_staging()
    task = pickle.loads(pickle.dumps(interrupted))  # what its task got
    info, key = task.stage(0, records, binding)  # while the run is open: kept, for the driver to commit
    assert key.startswith(".tasks/") and f"out-tasks/{key}" in objects_named(client, "out-tasks/.tasks/")
    resumed = RemoteShards(url, url, options)  # the next run: cleans at its start and at its end
    resumed.clean_staged()
    assert objects_named(client, "out-tasks/.tasks/") == []
    resumed.open_staging()
    late_info, late_key = task.stage(1, records, binding)  # the old task's upload ends after the clean
    assert late_info.count == 3 and objects_named(client, "out-tasks/.tasks/") == \
        [f"out-tasks/.tasks/{resumed._run}.open"]  # it deleted what it uploaded: its run's mark is gone
    resumed.commit(pickle.loads(pickle.dumps(resumed)).stage(0, records, binding))  # the resumed run's own task
    resumed.clean_staged()
    assert objects_named(client, "out-tasks/") == ["out-tasks/shard-00000.lmdb"]


def objects_named(client, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def test_a_url_holding_other_objects_is_written_beside_them_only_when_asked(s3, tmp_path):  # noqa: F811
    # Writing to a URL deleted another dataset in a folder of it, and any .lmdb under it, without overwrite
    _, client, options = s3
    common = {"samples_per_shard": 5, "progress": False, "storage_options": options, "cache_dir": tmp_path}
    child = f"s3://{BUCKET}/parent/child"
    fastload.write_dataset(samples(12), child, **common)
    client.put_object(Bucket=BUCKET, Key="parent/notes/model.lmdb", Body=b"weights")
    before = objects(client, "parent")
    with pytest.raises(FileExistsError, match="is not empty and holds no dataset"):
        fastload.write_dataset(samples(7), f"s3://{BUCKET}/parent", **common)
    with pytest.raises(FileExistsError, match="is not empty and holds no dataset"):
        fastload.write_dataset(samples(7), f"s3://{BUCKET}/parent", resume=True, **common)
    assert objects(client, "parent") == before
    fastload.write_dataset(samples(7), f"s3://{BUCKET}/parent", overwrite=True, **common)
    after = objects(client, "parent")
    assert all(after[name] == data for name, data in before.items())  # every object there before, unchanged
    assert len(fastload.ShardDataset(child, storage_options=options, cache_dir=tmp_path / "r1")) == 12
    assert len(fastload.ShardDataset(f"s3://{BUCKET}/parent", storage_options=options,
                                     cache_dir=tmp_path / "r2")) == 7


def test_a_call_refused_for_its_arguments_changes_nothing_at_a_url(s3, tmp_path):  # noqa: F811
    # The started mark was made before the arguments were checked: the next plain call was refused as
    # "an interrupted conversion to it is staged", and an overwrite refused for a typo was later resumed
    _, client, options = s3
    common = {"samples_per_shard": 5, "progress": False, "storage_options": options, "cache_dir": tmp_path}
    url = f"s3://{BUCKET}/out-typo"
    with pytest.raises(ArgumentError, match="unknown codec"):
        fastload.write_dataset(samples(12), url, codec="bogus", **common)
    fastload.write_dataset(samples(12), url, **common)
    before = objects(client, "out-typo")
    with pytest.raises(ArgumentError, match="unknown codec"):
        fastload.write_dataset(samples(30), url, codec="bogus", overwrite=True, **common)
    assert fastload.write_dataset(samples(12), url, resume=True, **common).total == 12
    assert objects(client, "out-typo") == before
    assert not list((tmp_path / "publish").iterdir())
    client.put_object(Bucket=BUCKET, Key="out-typo/splits.json", Body=b"{}")  # records no options: the manifest does
    with pytest.raises(ArgumentError, match="samples-per-shard: recorded 5, now 6"):
        fastload.write_dataset(samples(12), url, resume=True, **{**common, "samples_per_shard": 6})
