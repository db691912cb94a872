"""Datasets in object storage: the S3 protocol through moto's server, started here on 127.0.0.1.

No mock of the client library: obstore talks HTTP to a real S3-protocol server. What is checked is
the promise: the same batches as a local copy for any backend and thread count; a cache that is
trusted only after the manifest's hash matched, shared by processes, bounded by cache_limit; typed
errors naming the URL (never a credential) for what is missing, corrupt or unreachable; a state
that resumes from another cache directory.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from moto_s3 import moto_s3, s3_options, start_moto

import fastload
from fastload.errors import ArgumentError, RemoteError, RemoteNotFoundError
from fastload.storage._cache import UNVERIFIED_SUFFIX, boot_id, parse_cache_limit

moto_server = pytest.importorskip("moto.server", reason="the S3 test server (moto[server]) is not installed")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("obstore", reason="fastload[remote] (obstore) is not installed")

pytestmark = pytest.mark.slow  # tier: the moto S3 server

SECRET = "SECRET-do-not-show-42"
BUCKET = "fastload-tests"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (a free port): (endpoint URL, boto3 client, storage_options for it)."""
    with moto_s3(BUCKET, secret=SECRET) as server:
        yield server


def upload(client, local: Path, prefix: str) -> str:
    """Upload every file under ``local`` to ``s3://BUCKET/prefix/``; return that URL."""
    for path in sorted(local.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local).as_posix()}")
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def tiles(tmp_path_factory, s3):
    """A 700-sample dataset (zstd images, 11 shards), local and uploaded: (local path, URL)."""
    _, client, _ = s3
    local = tmp_path_factory.mktemp("tiles") / "ds"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (700, 3, 12, 12), dtype=np.uint8)
    fastload.write_arrays(local, {"image": images, "label": np.arange(700) % 7}, codec={"image": "zstd"},
                          samples_per_shard=64)
    return local, upload(client, local, "tiles")


def batches(loader) -> list[dict[str, torch.Tensor]]:
    return [dict(b) for b in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def touch_every_shard(dataset) -> None:
    """Read one sample of every shard (each is fetched when it is first read)."""
    starts = np.cumsum([0] + [s.count for s in dataset.manifest.shards])[:-1]
    for start in starts:
        dataset[int(start)]


def cached_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


@pytest.mark.parametrize(("backend", "threads"), [("native", 1), ("native", 2), ("torch", 2)])
def test_the_same_batches_as_the_local_copy(tiles, s3, tmp_path, backend, threads):
    local, url = tiles
    kwargs = {"batch_size": 48, "shuffle": True, "seed": 5, "backend": backend}
    if backend == "native":
        kwargs["num_threads"] = threads
    else:
        kwargs["num_workers"] = threads
    expected = batches(fastload.ShardLoader(str(local), **kwargs))
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "cache", **kwargs)
    assert same(batches(loader), expected)
    loader.set_epoch(1)
    again = fastload.ShardLoader(str(local), **kwargs)
    again.set_epoch(1)
    assert same(batches(loader), batches(again))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_shard_window_shuffle_gives_the_same_batches_as_the_local_copy(tiles, s3, tmp_path, backend):
    local, url = tiles
    kwargs = {"batch_size": 32, "shuffle": True, "shuffle_window": 3, "seed": 2, "backend": backend}
    for epoch in (0, 1):
        expected, remote = fastload.ShardLoader(str(local), **kwargs), fastload.ShardLoader(
            url, storage_options=s3[2], cache_dir=tmp_path / "cache", **kwargs)
        expected.set_epoch(epoch)
        remote.set_epoch(epoch)
        assert same(batches(remote), batches(expected))


def test_shard_dataset_split_root_and_fields(tmp_path, s3):
    _, client, options = s3
    root = tmp_path / "root"
    rng = np.random.default_rng(1)
    for name, n in (("train", 90), ("val", 30)):
        fastload.write_arrays(root / name, {"image": rng.integers(0, 255, (n, 2, 4, 4), dtype=np.uint8),
                                            "label": np.arange(n)}, samples_per_shard=32)
    from fastload.format._splits import write_splits
    write_splits(root, {n: {"path": n, "samples": c, "sources": 1, "class_counts": None}
                        for n, c in (("train", 90), ("val", 30))}, {"tool": "tests"})
    url = upload(client, root, "splitroot")
    val = fastload.ShardDataset(url, split="val", storage_options=options, cache_dir=tmp_path / "c")
    local_val = fastload.ShardDataset(root, split="val")
    assert len(val) == 30 and all(torch.equal(val[i]["image"], local_val[i]["image"]) for i in range(30))
    assert repr(val).startswith(f"ShardDataset('{url}/val'")
    loader = fastload.ShardLoader(url, split="train", fields=["label"], batch_size=16, storage_options=options,
                                  cache_dir=tmp_path / "c")
    assert torch.equal(torch.cat([b["label"] for b in loader]), torch.arange(90))
    with pytest.raises(fastload.DatasetError, match="pass split="):
        fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "c")
    with pytest.raises(fastload.DatasetError, match="no split 'test'"):
        fastload.ShardDataset(url, split="test", storage_options=options, cache_dir=tmp_path / "c")


def test_a_warm_cache_downloads_no_shard_again(tiles, s3, tmp_path):
    _, url = tiles
    cache = tmp_path / "cache"
    first = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache)
    assert not [p for p in cached_files(cache) if p.suffix == ".lmdb"]  # opening fetches the manifest only
    touch_every_shard(first)
    files = cached_files(cache)
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}
    assert len([p for p in files if p.suffix == ".lmdb"]) == len(first.manifest.shards)
    second = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache)
    touch_every_shard(second)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cached_files(cache)} == stamps
    assert second.path == first.path


def test_missing_dataset_and_bucket_are_typed_errors_naming_the_url(s3, tmp_path):
    options = s3[2]
    with pytest.raises(RemoteNotFoundError, match=f"s3://{BUCKET}/no-such-dataset/manifest.json"):
        fastload.ShardLoader(f"s3://{BUCKET}/no-such-dataset", batch_size=4, storage_options=options,
                             cache_dir=tmp_path)
    with pytest.raises(RemoteNotFoundError, match="s3://no-such-bucket/x/manifest.json"):
        fastload.ShardDataset("s3://no-such-bucket/x", storage_options=options, cache_dir=tmp_path)


def test_credentials_never_show(tiles, s3, tmp_path):
    _, url = tiles
    options = dict(s3[2])
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)
    loader = fastload.ShardLoader(dataset, batch_size=8)
    assert SECRET not in repr(dataset) + repr(loader) + str(dataset.__dict__.get("url"))
    with pytest.raises(RemoteError) as caught:
        fastload.ShardDataset(f"s3://{BUCKET}/absent", storage_options=options, cache_dir=tmp_path)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    with pytest.raises(ArgumentError) as bad_key:
        fastload.ShardDataset(url, storage_options={**options, "not_a_setting": SECRET}, cache_dir=tmp_path)
    assert "not_a_setting" in str(bad_key.value) and SECRET not in str(bad_key.value)


def test_a_corrupt_object_is_fetched_again_then_refused(tiles, s3, tmp_path):
    local, _ = tiles
    client = s3[1]
    url = upload(client, local, "corrupt")
    shard = sorted(local.glob("*.lmdb"))[3]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=f"corrupt/{shard.name}", Body=bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/corrupt/{shard.name}: content hash differs.*3 times"):
        list(fastload.ShardLoader(url, batch_size=8, storage_options=s3[2], cache_dir=cache))
    assert not [p for p in cached_files(cache) if p.name.startswith(shard.name)], "a bad download was kept"
    client.put_object(Bucket=BUCKET, Key=f"corrupt/{shard.name}", Body=shard.read_bytes()[:-100])
    with pytest.raises(RemoteError, match=r"bytes, the manifest says"):
        list(fastload.ShardLoader(url, batch_size=8, storage_options=s3[2], cache_dir=cache))
    client.upload_file(str(shard), BUCKET, f"corrupt/{shard.name}")  # repaired: the loader works
    assert sum(len(b["label"]) for b in fastload.ShardLoader(url, batch_size=64, storage_options=s3[2],
                                                             cache_dir=cache)) == 700


def test_cache_limit_bounds_the_cache_and_evicts_only_what_nobody_reads(tiles, s3, tmp_path):
    local, url = tiles
    other = upload(s3[1], local, "tiles-copy")
    size = sum(p.stat().st_size for p in local.iterdir() if p.is_file())
    cache = tmp_path / "cache"
    with pytest.raises(RemoteError, match=r"cache_limit=1000 bytes.*largest shard"):
        fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache, cache_limit=1000)
    limit = int(size * 1.5)  # one copy fits, two do not
    held = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    assert held._cached.window is None
    assert [int(held[i]["label"]) for i in range(len(held))] == list(np.arange(700) % 7)  # all of it cached
    second = fastload.ShardDataset(other, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    # The held copy is not evicted: the second is read a window of shards at a time in the room left.
    assert second._cached.window is not None and second._cached.window <= limit - size
    assert [int(second[i]["label"]) for i in range(len(second))] == list(np.arange(700) % 7)
    assert sum(p.stat().st_size for p in cached_files(cache)) <= limit
    assert held[0]["label"] == 0 and len(list(held.path.glob("*.lmdb"))) == 11  # nothing taken from under it
    del held, second
    third = fastload.ShardDataset(other, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    assert third._cached.window is None  # the idle copy was evicted: this one fits whole now
    assert len(third) == 700
    assert sum(p.stat().st_size for p in cached_files(cache)) <= limit


def test_processes_share_one_cache(tiles, proxy, tmp_path):
    """Three processes open one URL at once into one cache: each shard is fetched once, none torn."""
    local, url = tiles
    fp, options = proxy
    cache = tmp_path / "cache"
    script = (f"import fastload, pickle, sys; options = pickle.loads(bytes.fromhex(sys.argv[1])); "
              f"ds = fastload.ShardDataset({url!r}, storage_options=options, cache_dir={str(cache)!r}); "
              f"print(sum(int(ds[i]['label']) for i in range(len(ds))))")
    procs = [subprocess.Popen([sys.executable, "-c", script, pickle.dumps(options).hex()], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert {o for o, _ in outs} == {f"{sum(np.arange(700) % 7)}\n"}
    assert not [p for p in cache.rglob("*.part-*")]
    shard_gets = {k: n for k, n in fp.seen.items() if k.startswith("GET ") and k.endswith(".lmdb")}
    assert len(shard_gets) == len(list(local.glob("*.lmdb"))) and set(shard_gets.values()) == {1}, shard_gets


def mortal_server(local: Path, prefix: str):
    """A moto server of this test's own (the test stops it) holding ``local`` at ``prefix``: (server, endpoint, URL)."""
    server, endpoint, client = start_moto(BUCKET, key_id="t")
    return server, endpoint, upload(client, local, prefix)


def short_retries(endpoint: str) -> dict:
    """Storage options for ``mortal_server`` at ``endpoint``, with few, short retries (a dead server fails fast)."""
    return s3_options(endpoint, key_id="t", max_retries=2, retry_timeout_s=3)


def test_a_dead_server_is_a_typed_error_within_a_bounded_time(tiles, tmp_path):
    local, _ = tiles
    server, endpoint, url = mortal_server(local, "dying")
    options = short_retries(endpoint)
    server.stop()
    started = time.monotonic()
    with pytest.raises(RemoteError, match=f"s3://{BUCKET}/dying/"):
        fastload.ShardLoader(url, batch_size=8, storage_options=options, cache_dir=tmp_path)
    assert time.monotonic() - started < 60


def test_resume_in_a_new_process_with_another_cache(tiles, s3, tmp_path):
    local, url = tiles
    kwargs = {"batch_size": 32, "shuffle": True, "seed": 9}
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "a", **kwargs)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "b", **kwargs)
    resumed.load_state_dict(state)
    reference = batches(fastload.ShardLoader(str(local), **kwargs))
    assert same(batches(resumed), reference[5:])
    clone = pickle.loads(pickle.dumps(fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "a",
                                                           **kwargs)))
    assert same(batches(clone), reference)


def test_storage_arguments_belong_to_urls(tiles):
    local, _ = tiles
    with pytest.raises(ArgumentError, match="cache_limit"):
        fastload.ShardLoader(str(local), batch_size=4, cache_limit="1GB")
    with pytest.raises(ArgumentError, match="storage_options"):
        fastload.ShardDataset(local, storage_options={"region": "x"})


def test_without_the_remote_extra_the_error_names_it(tiles, monkeypatch, tmp_path):
    _, url = tiles
    monkeypatch.setitem(sys.modules, "obstore", None)
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    with pytest.raises(RemoteError, match=r'pip install "fastload\[remote\]"'):
        fastload.ShardDataset(url, cache_dir=tmp_path)


@pytest.mark.parametrize(("limit", "expected"), [(None, None), (1024, 1024), ("50GB", 50 * 10**9),
                                                 ("1.5 GiB", int(1.5 * 2**30)), ("512MiB", 512 * 2**20)])
def test_cache_limit_sizes(limit, expected):
    assert parse_cache_limit(limit) == expected


@pytest.mark.parametrize("limit", ["50", "lots", "-1GB", 0, -5, True, 1.5, "1XB"])
def test_cache_limit_refuses_what_is_not_a_size(limit):
    with pytest.raises(ArgumentError):
        parse_cache_limit(limit)


def test_cli_info_and_verify_read_urls(tiles, s3, tmp_path, monkeypatch):
    _, url = tiles
    endpoint = s3[0]
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "tester", "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")}
    info = subprocess.run([sys.executable, "-m", "fastload.tools.cli", "info", url], env=env, capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert f"dataset {url}" in info.stdout and "700 samples in 11 shards" in info.stdout
    assert not list((tmp_path / "cache").rglob("*.lmdb")), "info fetched shards"
    verify = subprocess.run([sys.executable, "-m", "fastload.tools.cli", "verify", url, "--no-progress"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "700 records" in verify.stdout or "700" in verify.stdout
    assert SECRET not in info.stdout + info.stderr + verify.stdout + verify.stderr


@pytest.fixture
def proxy(s3):
    """A fault-injecting proxy in front of the S3 server (tests/fault_proxy.py), and storage_options through it."""
    from fault_proxy import FaultProxy

    proxy = FaultProxy(s3[0])
    options = {**s3[2], "endpoint": proxy.url, "max_retries": 2, "retry_timeout_s": 10}
    yield proxy, options
    proxy.close()


def test_transient_faults_are_retried_and_the_data_is_exact(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    shards = sorted(p.name for p in local.glob("*.lmdb"))
    fp.plan(shards[0], "503", "503")
    fp.plan(shards[1], "truncate", "truncate")
    fp.plan(shards[2], "drop")
    fp.plan(shards[3], "truncate", "503", "drop")
    loader = fastload.ShardLoader(url, batch_size=50, shuffle=True, seed=2, storage_options=options,
                                  cache_dir=tmp_path)
    assert same(batches(loader), batches(fastload.ShardLoader(str(local), batch_size=50, shuffle=True, seed=2)))
    assert len(fp.faults_served) == 8, fp.faults_served  # every planned fault met a request, and was survived


def test_a_transfer_that_keeps_failing_is_a_typed_error_and_nothing_is_kept(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    shard = sorted(p.name for p in local.glob("*.lmdb"))[4]
    fp.plan(shard, *["truncate"] * 20)
    loader = fastload.ShardLoader(url, batch_size=64, storage_options=options, cache_dir=tmp_path)
    with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/tiles/{shard}: .*tried 3 times") as caught:
        list(loader)
    assert SECRET not in str(caught.value)
    assert not [p for p in tmp_path.rglob(f"{shard}*") if not p.name.endswith(".lock")]
    fp.plans.clear()  # the store serves it again: the next pass tries again, and reads the whole epoch
    assert same(batches(loader), batches(fastload.ShardLoader(str(local), batch_size=64)))


def test_ctrl_c_during_a_download_leaves_nothing_a_later_run_trusts(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    fp.delay_s = 30.0
    shards = sorted(p.name for p in local.glob("*.lmdb"))
    for name in shards:
        fp.plan(name, "delay")  # every download hangs: the interrupt lands inside them
    cache = tmp_path / "cache"
    script = (f"import fastload, pickle, sys; options = pickle.loads(bytes.fromhex(sys.argv[1])); "
              f"print('opening', flush=True); "
              f"list(fastload.ShardLoader({url!r}, batch_size=64, storage_options=options, "
              f"cache_dir={str(cache)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", script, pickle.dumps(options).hex()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,  # SIGINT's default even in a run that ignores it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None and proc.stdout.readline() == "opening\n"
    deadline = time.monotonic() + 60
    while not list(cache.rglob("*.lmdb.part-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(cache.rglob("*.lmdb.part-*")), "no download started"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10, "Ctrl-C waited for the downloads in flight"
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    for path in cache.rglob("*.lmdb"):  # under its final name only when whole and right
        assert path.read_bytes() == (local / path.name).read_bytes(), path
    fp.plans.clear()
    fp.delay_s = 0.0
    again = fastload.ShardDataset(url, storage_options=options, cache_dir=cache)
    touch_every_shard(again)  # each shard's download clears the torn ones
    assert not list(cache.rglob("*.part-*"))
    assert all(torch.equal(again[i]["image"], fastload.ShardDataset(local)[i]["image"]) for i in (0, 350, 699))


def test_a_plain_http_server_serves_a_dataset(tiles, tmp_path):
    """``http://`` (an on-premises store behind a web server): Python's http.server on 127.0.0.1."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    local, _ = tiles

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(local.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{local.name}"
        kwargs = {"batch_size": 64, "shuffle": True, "seed": 4}
        remote = fastload.ShardLoader(url, storage_options={"allow_http": True}, cache_dir=tmp_path, **kwargs)
        assert same(batches(remote), batches(fastload.ShardLoader(str(local), **kwargs)))
        with pytest.raises(RemoteNotFoundError, match=f"{url}-missing/manifest.json"):
            fastload.ShardDataset(url + "-missing", storage_options={"allow_http": True}, cache_dir=tmp_path)
        with pytest.raises(RemoteError, match="builder error|allow_http|HTTP"):  # http refused unless allowed
            fastload.ShardDataset(url, cache_dir=tmp_path / "other", storage_options={"max_retries": 0})
    finally:
        server.shutdown()
        server.server_close()


def test_remote_and_local_datasets_compose(tiles, s3, tmp_path):
    local, url = tiles
    remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path)
    both = fastload.concat([remote, str(local)])
    expected = fastload.concat([str(local), str(local)])
    kwargs = {"batch_size": 100, "shuffle": True, "seed": 8}
    assert same(batches(fastload.ShardLoader(both, **kwargs)), batches(fastload.ShardLoader(expected, **kwargs)))
    mixed = fastload.mix([remote, str(local)], weights=[0.5, 0.5], stop="all_exhausted")
    reference = fastload.mix([str(local), str(local)], weights=[0.5, 0.5], stop="all_exhausted")
    assert same(batches(fastload.ShardLoader(mixed, fields=["label"], **kwargs)),
                batches(fastload.ShardLoader(reference, fields=["label"], **kwargs)))


def test_spawned_workers_open_the_cached_copy(tiles, s3, tmp_path):
    local, url = tiles
    kwargs = {"batch_size": 64, "shuffle": True, "seed": 6, "backend": "torch", "num_workers": 2,
              "multiprocessing_context": "spawn"}
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path, **kwargs)
    assert same(batches(loader), batches(fastload.ShardLoader(str(local), **{**kwargs, "num_workers": 0})))


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_a_full_cache_disk_is_a_typed_error(tiles, s3, tmp_path):
    """The cache's disk refuses writes past 16 KB (RLIMIT_FSIZE in a child): a RemoteError naming the file."""
    _, url = tiles
    cache = tmp_path / "cache"
    script = (f"import fastload, pickle, resource, signal, sys\n"
              f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\n"
              f"options = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
              f"try:\n"
              f"    list(fastload.ShardLoader({url!r}, batch_size=64, storage_options=options, "
              f"cache_dir={str(cache)!r}))\n"
              f"except fastload.errors.RemoteError as err:\n"
              f"    print(type(err).__name__, err)\n")
    done = subprocess.run([sys.executable, "-c", script, pickle.dumps(s3[2]).hex()], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CacheDiskError cache file ") and "File too large" in done.stdout, done.stdout
    assert not list(cache.rglob("*.lmdb")) and not list(cache.rglob("*.part-*"))


def test_a_token_in_the_url_never_reaches_a_path_or_a_message(tmp_path):
    from fastload.storage._cache import version_dir
    from fastload.storage._urls import redact

    url = f"https://user:{SECRET}@host.example/data/tiles?sig={SECRET}&se=2030"
    assert SECRET not in str(version_dir(tmp_path, url, b"{}"))
    assert redact(url) == "https://host.example/data/tiles"


def test_urls_with_credentials_and_bad_arguments_are_refused_typed(tiles, s3, tmp_path):
    from fastload.errors import ArgumentTypeError

    _, url = tiles
    for bad in (f"s3://user:{SECRET}@{BUCKET}/tiles", f"{url}?token={SECRET}", f"{url}#frag",
                "https://host:port/x"):
        with pytest.raises(ArgumentError) as caught:
            fastload.ShardDataset(bad, storage_options=s3[2], cache_dir=tmp_path)
        assert SECRET not in str(caught.value)
    with pytest.raises(ArgumentTypeError, match="cache_dir"):
        fastload.ShardDataset(url, storage_options=s3[2], cache_dir=42)
    with pytest.raises(ArgumentTypeError, match="storage_options"):
        fastload.ShardDataset(url, storage_options=[("endpoint", "x")], cache_dir=tmp_path)


def test_eviction_never_touches_what_fastload_did_not_make(tiles, s3, tmp_path):
    local, url = tiles
    other = upload(s3[1], local, "tiles-copy-2")
    cache = tmp_path / "shared-disk"
    keep = cache / "my-data-0123456789abcdef" / "0123456789abcdef"  # looks like a version, is the user's
    keep.mkdir(parents=True)
    (keep / "results.bin").write_bytes(b"x" * 1000)
    (cache / "notes.txt").write_text("mine")
    size = sum(p.stat().st_size for p in local.iterdir() if p.is_file())
    limit = int(size * 1.5) + 2000
    first = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    del first
    fastload.ShardDataset(other, storage_options=s3[2], cache_dir=cache, cache_limit=limit)  # evicts the first
    assert (keep / "results.bin").read_bytes() == b"x" * 1000 and (cache / "notes.txt").read_text() == "mine"
    assert len([p for p in cache.rglob("manifest.json")]) == 1


def test_an_unpickled_dataset_reads_its_cached_version_offline(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)
    dataset[0]  # shard 0 is fetched, the others not
    blob = pickle.dumps(dataset)
    fp.close()  # the store is unreachable from now on
    clone = pickle.loads(blob)
    assert clone.path == dataset.path
    assert all(torch.equal(clone[i]["image"], fastload.ShardDataset(local)[i]["image"]) for i in (0, 63))
    with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/tiles/shard-00010.lmdb"):  # not here: a typed error
        clone[699]


def test_an_unpickled_dataset_refuses_a_dataset_rewritten_at_its_url(tiles, s3, tmp_path):
    import shutil

    local, _ = tiles
    url = upload(s3[1], local, "rewritten")
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "c")
    blob = pickle.dumps(dataset)
    shutil.rmtree(dataset.path)  # evicted meanwhile
    rng = np.random.default_rng(9)
    other = tmp_path / "other"
    fastload.write_arrays(other, {"image": rng.integers(0, 255, (700, 3, 12, 12), dtype=np.uint8),
                                  "label": np.arange(700) % 7}, codec={"image": "zstd"}, samples_per_shard=64)
    upload(s3[1], other, "rewritten")
    with pytest.raises(RemoteError, match="changed in storage"):
        pickle.loads(blob)


# ---- reading while the shards download (the fetcher, the gate, forked workers) ----------------------


def test_batches_arrive_while_later_shards_download(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    fp.delay_s = 10.0
    for k in range(6, 11):  # the shards the second half of the epoch reads answer 10 s late
        fp.plan(f"shard-{k:05d}.lmdb", "delay")
    loader = fastload.ShardLoader(url, batch_size=64, storage_options=options, cache_dir=tmp_path / "c",
                                  num_threads=2)
    assert not list((tmp_path / "c").rglob("*.lmdb"))  # opening fetched the manifest only
    started = time.monotonic()
    it = iter(loader)
    first = next(it)
    waited = time.monotonic() - started
    here = {p.name for p in (tmp_path / "c").rglob("*.lmdb")}
    assert waited < 6.0 and "shard-00010.lmdb" not in here, (waited, here)  # served before the last shards came
    got = [first] + list(it)
    assert same(got, batches(fastload.ShardLoader(str(local), batch_size=64)))


def test_each_rank_fetches_only_the_shards_its_samples_read(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    indices = [i for k in range(32) for i in (k, 64 + k)]  # alternately shard 0 and shard 1
    for rank in (0, 1):  # positions r, r + 2, ...: rank 0 reads only shard 0, rank 1 only shard 1
        fp.seen.clear()
        loader = fastload.ShardLoader(url, batch_size=8, indices=indices, rank=rank, world_size=2,
                                      storage_options=options, cache_dir=tmp_path / f"rank{rank}")
        labels = torch.cat([b["label"] for b in loader]).tolist()
        assert labels == [i % 7 for i in indices[rank::2]]
        gets = sorted(k for k in fp.seen if k.startswith("GET ") and k.endswith(".lmdb"))
        assert gets == [f"GET /{BUCKET}/tiles/shard-{rank:05d}.lmdb"], gets


def test_a_users_dataloader_with_forked_workers_reads_a_remote_dataset(tiles, s3, tmp_path):
    """DataLoader workers forked from a process that used the store (obstore does not work after fork)."""
    local, url = tiles
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "c")
    dataset[0]  # the store used in this process before the fork
    loader = torch.utils.data.DataLoader(dataset, batch_size=50, num_workers=2, multiprocessing_context="fork")
    got = torch.cat([b["image"] for b in loader])
    expected = torch.cat([b["image"] for b in torch.utils.data.DataLoader(fastload.ShardDataset(local),
                                                                          batch_size=50)])
    assert torch.equal(got, expected)


def test_a_forked_worker_reports_a_missing_shard_as_a_typed_error_naming_it(tiles, s3, tmp_path):
    local, _ = tiles
    url = upload(s3[1], local, "holey")
    s3[1].delete_object(Bucket=BUCKET, Key="holey/shard-00003.lmdb")
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path)
    dataset[0]  # the store used in this process before the fork
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/holey/shard-00003.lmdb"):
        list(loader)


def test_a_server_that_dies_mid_epoch_is_a_typed_error_within_a_bounded_time(tiles, tmp_path):
    from fault_proxy import FaultProxy

    local, _ = tiles
    server, endpoint, url = mortal_server(local, "dies")
    fp = FaultProxy(endpoint, delay_s=3.0)
    for k in range(5, 11):  # the later shards are still on their way when the server dies
        fp.plan(f"shard-{k:05d}.lmdb", "delay")
    options = short_retries(fp.url)
    try:
        loader = fastload.ShardLoader(url, batch_size=64, storage_options=options, cache_dir=tmp_path)
        it = iter(loader)
        delivered = [next(it)]
        server.stop()
        started = time.monotonic()
        with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/dies/shard-000(0[1-9]|10).lmdb: "):
            for batch in it:
                delivered.append(batch)
        assert 1 <= len(delivered) <= 5 and time.monotonic() - started < 60, len(delivered)
    finally:
        fp.close()


def test_a_remote_dataset_reads_a_few_fields_before_its_shards_are_here(tiles, s3, tmp_path):
    local, url = tiles
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path)
    labels = torch.cat([b["label"] for b in fastload.ShardLoader(dataset, fields=["label"], batch_size=100)])
    assert labels.tolist() == [i % 7 for i in range(700)]
    weights = fastload.class_balanced_weights(fastload.ShardDataset(url, storage_options=s3[2],
                                                                    cache_dir=tmp_path / "other"), field="label")
    assert len(weights) == 700


def test_a_shard_that_failed_is_tried_again_when_it_is_read_again(tiles, proxy, tmp_path):
    local, url = tiles
    fp, options = proxy
    fp.plan("shard-00002.lmdb", *["503"] * 20)
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)
    with pytest.raises(RemoteError, match=rf"s3://{BUCKET}/tiles/shard-00002.lmdb"):
        dataset[130]
    fp.plans.clear()
    assert torch.equal(dataset[130]["image"], fastload.ShardDataset(local)[130]["image"])


def test_an_exclusive_lock_is_released_even_when_a_forked_child_holds_its_descriptor(tmp_path):
    from fastload.storage._locks import FileLock

    path = tmp_path / "x.lock"
    lock = FileLock(path, exclusive=True)
    copy = os.dup(lock._fd)  # what a child forked while the lock was being taken keeps
    try:
        lock.release()
        again = FileLock.try_exclusive(path)
        assert again is not None, "the lock stayed held through the copy of its descriptor"
        again.release()
    finally:
        os.close(copy)


def test_interpreter_exit_with_a_finished_remote_pass_still_referenced_is_quiet(tiles, s3, tmp_path):
    """A script that keeps its loader and iterator in globals: nothing is printed at exit, status 0.

    Found by hand: the pass's ``__del__`` ran late in shutdown and printed "Exception ignored"
    (``sys`` was None by then).
    """
    _, url = tiles
    script = textwrap.dedent("""
        import json, os, fastload
        options = json.loads(os.environ["OPTIONS"])
        loader = fastload.ShardLoader(os.environ["URL"], batch_size=64, shuffle=True, storage_options=options,
                                      cache_dir=os.environ["CACHE"])
        it = iter(loader)
        for batch in it:
            pass
        partial = iter(loader)  # a second pass left open
        first = next(partial)
    """)
    env = {**os.environ, "OPTIONS": json.dumps(s3[2]), "URL": url, "CACHE": str(tmp_path / "c")}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]


def test_a_warm_cache_is_read_through_planned_batches_and_a_cold_one_through_the_gate(tiles, s3, tmp_path):
    """A cache holding every shard needs no gate: the reader plans the batches (as for a local copy), same batches."""
    from fastload.loading import _native_backend

    local, url = tiles
    kwargs = {"batch_size": 32, "shuffle": True, "seed": 3, "num_threads": 2}
    expected = batches(fastload.ShardLoader(str(local), **kwargs))
    for phase, planned in (("cold", False), ("warm", True)):
        loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "c", **kwargs)
        it = iter(loader)
        got = [dict(next(it))]
        inner = it._inner
        assert isinstance(inner, _native_backend.NativeEpoch) and inner._planned == planned, phase
        got += batches(it)
        assert same(got, expected), phase
    evicted = next((tmp_path / "c").rglob("shard-00003.lmdb"))
    evicted.unlink()  # a shard gone from the cache: gated again, fetched again, the same batches
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "c", **kwargs)
    it = iter(loader)
    got = [dict(next(it))]
    assert not it._inner._planned
    assert same(got + batches(it), expected)


@pytest.mark.skipif(boot_id() is None, reason="no boot id on this platform: downloads are fsynced instead")
def test_after_a_restart_the_cache_is_hashed_again_before_it_is_trusted(tiles, proxy, tmp_path):
    """Downloads are not fsynced; a restart (another boot id) demotes them, and a torn shard is fetched again."""
    local, url = tiles
    fp, options = proxy
    cache = tmp_path / "c"
    expected = batches(fastload.ShardLoader(str(local), batch_size=100))
    assert same(batches(fastload.ShardLoader(url, batch_size=100, storage_options=options, cache_dir=cache)),
                expected)
    marker = cache / ".fastload-boot"
    assert marker.read_text() == boot_id()
    held = fastload.ShardDataset(url, storage_options=options, cache_dir=cache)  # read by a process of this boot
    marker.write_text("an-earlier-boot")
    again = fastload.ShardDataset(url, storage_options=options, cache_dir=cache)
    assert marker.read_text() == boot_id()
    assert not list(cache.rglob(f"*{UNVERIFIED_SUFFIX}"))  # a version being read is left alone
    del held, again
    gc.collect()
    marker.write_text("an-earlier-boot")  # the machine restarted
    torn = next(cache.rglob("shard-00002.lmdb"))
    data = bytearray(torn.read_bytes())
    data[len(data) // 2: len(data) // 2 + 4096] = bytes(4096)  # blocks a power loss left unwritten
    torn.write_bytes(bytes(data))
    fp.seen.clear()
    loader = fastload.ShardLoader(url, batch_size=100, storage_options=options, cache_dir=cache)
    assert marker.read_text() == boot_id()
    demoted = sorted(p.name for p in cache.rglob(f"*{UNVERIFIED_SUFFIX}"))
    assert len(demoted) == 11 and not list(cache.rglob("shard-*.lmdb")), demoted
    assert same(batches(loader), expected)
    gets = sorted(k for k in fp.seen if k.startswith("GET ") and k.endswith(".lmdb"))
    assert gets == [f"GET /{BUCKET}/tiles/shard-00002.lmdb"], gets  # the others matched their hash again
    assert not list(cache.rglob(f"*{UNVERIFIED_SUFFIX}")) and len(list(cache.rglob("shard-*.lmdb"))) == 11


def test_a_concat_of_other_layouts_with_a_warm_remote_dataset_is_planned_per_group(tiles, s3, tmp_path):
    """A concat whose datasets store records differently reads a reader per layout; a warm remote group plans too."""
    from fastload.loading import _native_backend, _native_groups

    local, url = tiles
    raw = tmp_path / "raw"
    source = fastload.ShardDataset(str(local))
    fastload.write_arrays(raw, {k: v.numpy() for k, v in source.read_batch(range(len(source))).items()},
                          samples_per_shard=100)  # raw images: another layout than the remote zstd ones
    remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "c")
    assert not fastload.concat([str(raw), remote]).same_layout
    kwargs = {"batch_size": 64, "shuffle": True, "seed": 6, "num_threads": 2}
    loader = fastload.ShardLoader(fastload.concat([str(raw), remote]), **kwargs)
    expected = fastload.ShardLoader(fastload.concat([str(raw), str(local)]), **kwargs)
    for epoch in range(2):  # cold (gated), then warm (planned)
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        it = iter(loader)
        got = [dict(next(it))]
        assert isinstance(it._inner, _native_groups.GroupedNativeEpoch)
        epochs = [e for e in it._inner._epochs if isinstance(e, _native_backend.NativeEpoch)]
        assert len(epochs) == 2 and all(e._planned for e in epochs) == (epoch == 1), epoch
        assert same(got + batches(it), batches(expected)), epoch
