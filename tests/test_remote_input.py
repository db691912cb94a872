"""Conversion from object storage: preprocess_tiles --data-dir s3://... (moto on 127.0.0.1).

The promise: the shards are byte for byte those of the same conversion from a local copy of the
folder, for the local process pool and a Dask cluster; a bad file gets the local policy (an error
naming its URL, or skipped with --skip-bad); a missing bucket, an empty prefix or a server that dies
is a typed error naming the URL, never a credential, and nothing looks complete; an interrupted run
resumes to the same bytes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import preprocess_two_classes, run_cli
from test_remote import BUCKET, SECRET, mortal_server, s3, short_retries, upload  # noqa: F401  (s3: the fixture)
from test_remote_output import objects, s3_env

import fastload
from fastload.conversion._preprocess_plan import probe_source
from fastload.conversion.preprocess import build_parser, run
from fastload.errors import ImageReadError, RemoteError
from fastload.storage import RemoteFolder

pytestmark = pytest.mark.slow  # tier: the moto S3 server, preprocess_tiles processes and a Dask cluster


@pytest.fixture(scope="module")
def remote_pngs(s3, two_class_pngs):  # noqa: F811
    """``two_class_pngs`` uploaded to the test bucket: its URL."""
    _, client, _ = s3
    return upload(client, two_class_pngs, "pngs-in")


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.lmdb"))}


def manifest_without_run_fields(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc["provenance"].pop("created")
    doc["provenance"].pop("source_root")
    return doc


def test_a_folder_in_object_storage_converts_to_the_local_bytes(s3, tmp_path, two_class_pngs, remote_pngs):  # noqa: F811
    local = preprocess_two_classes(two_class_pngs, tmp_path / "local", "--workers", "2")
    remote = preprocess_two_classes(remote_pngs, tmp_path / "remote", "--workers", "2", env=s3_env(s3))
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert SECRET not in remote.stdout + remote.stderr
    written = shard_bytes(tmp_path / "local")
    assert len(written) > 2 and shard_bytes(tmp_path / "remote") == written
    for split in ("train", "val"):
        theirs = tmp_path / "remote" / split / "manifest.json"
        assert manifest_without_run_fields(theirs) == manifest_without_run_fields(tmp_path / "local" / split /
                                                                                  "manifest.json")
        assert json.loads(theirs.read_text())["provenance"]["source_root"] == remote_pngs
    assert "MB/s of source files" in remote.stdout


def test_a_dask_cluster_converts_a_bucket_into_a_bucket_with_the_local_bytes(s3, tmp_path, two_class_pngs,  # noqa: F811
                                                                             remote_pngs, monkeypatch):
    """Workers take credentials from their own environment, as any Dask job reading a bucket does."""
    distributed = pytest.importorskip("distributed", reason="fastload[dask] (distributed) is not installed")
    _, client, _ = s3
    env = {**s3_env(s3), "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # inherited by the cluster's worker processes
    assert preprocess_two_classes(two_class_pngs, tmp_path / "local").returncode == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        done = preprocess_two_classes(remote_pngs, f"s3://{BUCKET}/from-dask", "--scheduler",
                                      cluster.scheduler_address, env=env)
    assert done.returncode == 0, done.stderr
    stored = {n: b for n, b in objects(client, "from-dask").items() if n.endswith(".lmdb")}
    assert stored == shard_bytes(tmp_path / "local")


def test_a_bad_file_is_named_by_its_url_or_skipped(s3, tmp_path, two_class_pngs):  # noqa: F811
    _, client, _ = s3
    url = upload(client, two_class_pngs, "pngs-bad")
    whole = (two_class_pngs / "cats" / "0.png").read_bytes()
    client.put_object(Bucket=BUCKET, Key="pngs-bad/cats/9.png", Body=whole[: len(whole) // 2])
    failed = preprocess_two_classes(url, tmp_path / "failed", env=s3_env(s3))
    assert failed.returncode == 1
    assert f"{url}/cats/9.png" in failed.stderr and "fastload-source-" not in failed.stderr
    assert not list((tmp_path / "failed").rglob("manifest.json"))
    skipped = preprocess_two_classes(url, tmp_path / "skipped", "--skip-bad", env=s3_env(s3))
    assert skipped.returncode == 0, skipped.stderr
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "skipped").rglob("manifest.json")]
    assert [s["path"] for m in manifests for s in m["skipped"]] == ["cats/9.png"]


def test_missing_bucket_and_empty_prefix_are_errors_naming_the_url(s3, tmp_path):  # noqa: F811
    missing = run_cli("preprocess_tiles", "--data-dir", "s3://no-such-bucket/images", "--output-dir",
                      str(tmp_path / "a"), env=s3_env(s3))
    assert missing.returncode == 1 and "s3://no-such-bucket" in missing.stderr
    assert SECRET not in missing.stderr and "Traceback" not in missing.stderr
    empty = run_cli("preprocess_tiles", "--data-dir", f"s3://{BUCKET}/nothing-here", "--output-dir",
                    str(tmp_path / "b"), env=s3_env(s3))
    assert empty.returncode == 1 and f"s3://{BUCKET}/nothing-here: no images found" in empty.stderr
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def test_labels_from_a_csv_and_hdf5_stacks(s3, tmp_path, remote_pngs, two_class_pngs):  # noqa: F811
    csv = tmp_path / "labels.csv"
    relpaths = sorted(p.relative_to(two_class_pngs).as_posix() for p in two_class_pngs.rglob("*.png"))
    csv.write_text("path,label\n" + "".join(f"{p},{i % 3}\n" for i, p in enumerate(relpaths)))
    out = tmp_path / "labelled"
    done = run_cli("preprocess_tiles", "--data-dir", remote_pngs, "--output-dir", str(out), "--labels", str(csv),
                   "--order", "source", env=s3_env(s3))
    assert done.returncode == 0, done.stderr
    ds = fastload.ShardDataset(out)
    assert [int(ds[i]["label"]) for i in range(len(ds))] == [i % 3 for i in range(len(relpaths))]
    csv.write_text("path,label\ncats/0.png,0\ncats/missing.png,1\n")
    wrong = run_cli("preprocess_tiles", "--data-dir", remote_pngs, "--output-dir", str(tmp_path / "w"), "--labels",
                    str(csv), env=s3_env(s3))
    assert wrong.returncode == 1 and "cats/missing.png names a file missing from" in wrong.stderr
    stacks = run_cli("preprocess_tiles", "--data-dir", remote_pngs, "--output-dir", str(tmp_path / "h"),
                     "--h5-dataset", "x", env=s3_env(s3))
    assert stacks.returncode == 2 and "--h5-dataset" in stacks.stderr


def test_an_interrupted_run_from_a_bucket_resumes_to_the_same_bytes(s3, tmp_path, two_class_pngs, remote_pngs):  # noqa: F811
    out = tmp_path / "out"
    assert preprocess_two_classes(two_class_pngs, tmp_path / "local").returncode == 0
    args = ["--data-dir", remote_pngs, "--output-dir", str(out), "--tile-size", "32", "--stride", "24",
            "--labels-from-dirs", "--codec", "zstd", "--shard-size", "20KB", "--val-fraction", "0.3", "--no-progress"]
    env = {**s3_env(s3), "FASTLOAD_TEST_SHARD_DELAY": "1.0"}
    proc = subprocess.Popen([sys.executable, "-m", "fastload.preprocess", *args], env={**os.environ,
                            **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # SIGINT's default even where this test run ignores it (a background job of a
                            # non-interactive shell): else the child inherits the ignore and Ctrl-C is lost
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(out.rglob("shard-*.lmdb")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and not (out / "splits.json").exists()
    resumed = run_cli("preprocess_tiles", *args, "--resume", env=s3_env(s3))
    assert resumed.returncode == 0, resumed.stderr
    assert shard_bytes(out) == shard_bytes(tmp_path / "local")


@contextmanager
def stopped_after_the_first_shard(server, out: Path) -> Iterator[None]:
    """Stop ``server`` (from another thread) once ``out`` holds a shard, while the block runs."""
    def stop() -> None:
        deadline = time.monotonic() + 120
        while not list(out.glob("shard-*.lmdb")) and time.monotonic() < deadline:
            time.sleep(0.02)
        server.stop()

    stopper = threading.Thread(target=stop)
    stopper.start()
    try:
        yield
    finally:
        stopper.join()


def test_a_server_that_dies_mid_conversion_is_a_typed_error_and_nothing_looks_complete(tmp_path, two_class_pngs,
                                                                                       monkeypatch):
    server, endpoint, url = mortal_server(two_class_pngs, "dying-pngs")
    monkeypatch.setenv("FASTLOAD_TEST_SHARD_DELAY", "0.5")
    monkeypatch.setenv("FASTLOAD_SOURCE_SPOOL_BYTES", "0")  # no spool: the encodes download their sources again
    out = tmp_path / "out"
    args = build_parser().parse_args(["--data-dir", url, "--output-dir", str(out), "--tile-size", "32",
                                      "--labels-from-dirs", "--shard-size", "10KB", "--no-progress",
                                      "--order", "source"])  # sources still read after the first shard
    args.storage_options = short_retries(endpoint)

    started = time.monotonic()
    with stopped_after_the_first_shard(server, out), pytest.raises(RemoteError,
                                                                   match="s3://fastload-tests/dying-pngs/"):
        run(args)
    assert time.monotonic() - started < 90
    assert list(out.glob("shard-*.lmdb")) and not (out / "manifest.json").exists()


def test_each_source_is_downloaded_once_the_encodes_read_the_probes_copies(tmp_path, two_class_pngs, monkeypatch):
    """The spool (issue 44): with the store gone once the first shard is written, the run still completes."""
    server, endpoint, url = mortal_server(two_class_pngs, "spooled-pngs")
    monkeypatch.setenv("FASTLOAD_TEST_SHARD_DELAY", "0.5")
    out = tmp_path / "out"
    args = build_parser().parse_args(["--data-dir", url, "--output-dir", str(out), "--tile-size", "32",
                                      "--labels-from-dirs", "--shard-size", "10KB", "--no-progress",
                                      "--order", "source"])
    args.storage_options = short_retries(endpoint)

    with stopped_after_the_first_shard(server, out):
        run(args)
    local = tmp_path / "local"
    local_args = build_parser().parse_args(["--data-dir", str(two_class_pngs), "--output-dir", str(local),
                                            "--tile-size", "32", "--labels-from-dirs", "--shard-size", "10KB",
                                            "--no-progress", "--order", "source"])
    run(local_args)
    shards = sorted(p.name for p in local.glob("shard-*.lmdb"))
    assert len(shards) > 1 and sorted(p.name for p in out.glob("shard-*.lmdb")) == shards
    assert all((out / n).read_bytes() == (local / n).read_bytes() for n in shards)


def test_folder_markers_hidden_files_and_odd_names_as_in_a_local_folder(s3, tmp_path, two_class_pngs):  # noqa: F811
    """Consoles make empty "folder/" objects; keys may hold '#', spaces or names too long for a local file."""
    _, client, _ = s3
    local = tmp_path / "local-in"
    shutil.copytree(two_class_pngs, local)
    png = (two_class_pngs / "dogs" / "1.png").read_bytes()
    odd = {"dogs/odd #1?.png": png, "cats/" + "n" * 300 + ".png": png, "cats/.hidden.png": b"not a png",
           ".cache/x.png": b"not a png"}
    url = upload(client, two_class_pngs, "pngs-odd")
    for key, body in odd.items():
        client.put_object(Bucket=BUCKET, Key=f"pngs-odd/{key}", Body=body)
    for marker in ("pngs-odd/", "pngs-odd/cats/", "pngs-odd/dogs/"):
        client.put_object(Bucket=BUCKET, Key=marker, Body=b"")
    for key, body in odd.items():
        if len(key) < 200:  # the long name cannot be a local file: the local copy has it under a short one
            (local / key).parent.mkdir(exist_ok=True)
            (local / key).write_bytes(body)
    (local / "cats" / ("n" * 200 + ".png")).write_bytes(png)  # sorts where the long key does
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**s3_env(s3), "TMPDIR": str(scratch)}
    remote = preprocess_two_classes(url, tmp_path / "remote", "--workers", "2", env=env)
    assert remote.returncode == 0, remote.stderr
    assert "ignoring" not in remote.stdout + remote.stderr  # no marker taken for a file
    assert list(scratch.iterdir()) == []  # the copies and their directory are gone
    theirs = [json.loads(p.read_text()) for p in sorted((tmp_path / "remote").rglob("manifest.json"))]
    paths = sorted(s["path"] for m in theirs for s in m["sources"])
    assert "dogs/odd #1?.png" in paths and len(paths) == 12
    assert preprocess_two_classes(local, tmp_path / "mine").returncode == 0
    mine = [json.loads(p.read_text()) for p in sorted((tmp_path / "mine").rglob("manifest.json"))]
    assert [m["total"] for m in theirs] == [m["total"] for m in mine]


def test_an_object_gone_since_the_listing_is_an_unreadable_file_named_by_its_url(s3, tmp_path, two_class_pngs):  # noqa: F811
    _, client, options = s3
    url = upload(client, two_class_pngs, "pngs-gone")
    folder = RemoteFolder(url, options)
    assert "cats/3.png" in folder.list()
    client.delete_object(Bucket=BUCKET, Key="pngs-gone/cats/3.png")
    with pytest.raises(ImageReadError, match=f"{url}/cats/3.png: not found"):
        probe_source(url, folder, "cats/3.png", "auto", "keep")
    assert probe_source(url, folder, "cats/2.png", "auto", "keep").height == 70


def test_a_plain_web_server_cannot_list_a_folder_and_the_error_says_why(tmp_path, two_class_pngs):
    """obstore lists http(s):// through WebDAV; Python's http.server (no PROPFIND) refuses: a typed error naming it."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(two_class_pngs)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/cats"
        args = build_parser().parse_args(["--data-dir", url, "--output-dir", str(tmp_path / "out"), "--no-progress"])
        args.storage_options = {"allow_http": True, "max_retries": 0}
        with pytest.raises(RemoteError, match=f"{url}.*PROPFIND"):
            run(args)
        assert not (tmp_path / "out").exists()
    finally:
        server.shutdown()
        server.server_close()


def test_the_spool_keeps_copies_within_its_budget_and_refuses_a_bad_setting(tmp_path, monkeypatch):
    from fastload.errors import RemoteError
    from fastload.storage._folder import _keep_in_spool, spool_bytes

    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setenv("FASTLOAD_SOURCE_SPOOL_BYTES", "2500")
    kept = []
    for i in range(4):
        copy = tmp_path / f"copy{i}.png"
        copy.write_bytes(b"x" * 1000)
        _keep_in_spool(copy, spool / f"{i}.png", spool)
        kept.append((spool / f"{i}.png").exists())
    assert kept == [True, True, False, False]  # 2000 bytes kept; a third would pass 2500
    assert (spool / ".bytes").read_text() == "2000"
    for bad in ("-1", "lots"):
        monkeypatch.setenv("FASTLOAD_SOURCE_SPOOL_BYTES", bad)
        with pytest.raises(RemoteError, match="FASTLOAD_SOURCE_SPOOL_BYTES"):
            spool_bytes()


@pytest.mark.parametrize("spool", ["all", "none"])
def test_encode_workers_are_forks_only_when_every_source_is_in_the_spool(tmp_path, two_class_pngs, monkeypatch,
                                                                           spool):
    """Forked workers make no request (the store's runtime does not survive a fork): only with every copy spooled."""
    from fastload.conversion import _dataset_writer

    server, endpoint, url = mortal_server(two_class_pngs, f"fork-pngs-{spool}")
    if spool == "none":
        monkeypatch.setenv("FASTLOAD_SOURCE_SPOOL_BYTES", "0")
    fresh: list[bool] = []
    real = _dataset_writer.ordered_map

    def recording(*args, **kwargs):
        fresh.append(kwargs["fresh_workers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_dataset_writer, "ordered_map", recording)
    options = ["--tile-size", "32", "--labels-from-dirs", "--shard-size", "10KB", "--no-progress", "--workers", "2"]
    args = build_parser().parse_args(["--data-dir", url, "--output-dir", str(tmp_path / "out"), *options])
    args.storage_options = short_retries(endpoint)
    try:
        run(args)
    finally:
        server.stop()
    assert fresh == [spool == "none"]
    monkeypatch.setattr(_dataset_writer, "ordered_map", real)
    run(build_parser().parse_args(["--data-dir", str(two_class_pngs), "--output-dir", str(tmp_path / "local"),
                                   *options]))
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "local")
