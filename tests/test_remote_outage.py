"""A store's outage ridden out with the default retries: the epoch goes on, exact; beyond the budget a typed error.

Against the moto S3 server of tests/test_remote.py, through tests/fault_proxy.py's proxy on 127.0.0.1:
connections refused (the proxy stops listening, then listens again on the same port) or 503 answers
for a while in the middle of an epoch whose later shards are not downloaded yet give the local copy's
batches; an outage longer than a short ``retry_timeout_s`` is a RemoteError within about that long,
naming the URL once, the attempts and the seconds, never a credential; a 404 and a 403 are not
retried; the budget's value is checked.
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from test_remote import BUCKET, SECRET, batches, s3, same, tiles, upload  # noqa: F401  (s3, tiles: fixtures)

import fastload
from fastload.errors import ArgumentError, RemoteError, RemoteNotFoundError
from fastload.format._manifest import load_manifest
from fastload.storage._cache import DownloadStopped, fetch_shard
from fastload.storage._client import DEFAULT_RETRIES, RemoteRoot, StorageOptions

pytestmark = pytest.mark.slow  # tier: the moto S3 server behind a fault proxy; outages last real seconds

OUTAGE_S = 20.0


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    """Credentials are given: never ask an instance metadata service for them."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def proxy(s3):  # noqa: F811
    """A proxy in front of the S3 server, and storage_options through it with the default retries."""
    fp = FaultProxy(s3[0])
    options = {k: v for k, v in s3[2].items() if k not in DEFAULT_RETRIES} | {"endpoint": fp.url}
    yield fp, options
    fp.close()


def cached_shards(cache: Path) -> int:
    """Return how many shards are whole in the cache (under their final names)."""
    return len(list(cache.rglob("*.lmdb")))


def read_through(loader, fault) -> list:
    """Read ``loader``'s epoch, calling ``fault()`` after its first batch; return the batches."""
    it = iter(loader)
    got = [next(it)]
    fault()
    got.extend(it)
    return got


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_refused_connections_mid_epoch_are_ridden_out_with_the_defaults(tiles, proxy, tmp_path, backend):  # noqa: F811
    local, url = tiles
    fp, options = proxy
    kwargs = {"batch_size": 32, "shuffle": False, "backend": backend}
    kwargs |= {"num_threads": 1} if backend == "native" else {"num_workers": 2}
    loader = fastload.ShardLoader(url, storage_options=options, cache_dir=tmp_path, predownload=1, **kwargs)
    missing_at_outage = []

    def outage() -> None:
        """Note how many shards are still to come, and refuse connections for OUTAGE_S."""
        missing_at_outage.append(11 - cached_shards(tmp_path))
        fp.outage(OUTAGE_S)

    started = time.monotonic()
    got = read_through(loader, outage)
    assert missing_at_outage[0] >= 5, "the outage hit no download: the epoch's shards were already here"
    assert time.monotonic() - started >= OUTAGE_S - 1  # the later shards could only come after it
    assert fp.refused_since is None and cached_shards(tmp_path) == 11
    assert same(got, batches(fastload.ShardLoader(str(local), **kwargs)))


def test_503_answers_at_opening_and_mid_epoch_are_ridden_out(tiles, proxy, tmp_path):  # noqa: F811
    local, url = tiles
    fp, options = proxy
    kwargs = {"batch_size": 32, "shuffle": True, "shuffle_window": 2, "seed": 4}
    fp.fail_for(4.0)  # the manifest's HEAD and GET too
    loader = fastload.ShardLoader(url, storage_options=options, cache_dir=tmp_path, predownload=1, **kwargs)
    assert fp.faults_served, "no request met the 503s"
    served = len(fp.faults_served)
    got = read_through(loader, lambda: fp.fail_for(6.0))
    assert len(fp.faults_served) > served, "no download met the 503s"
    assert same(got, batches(fastload.ShardLoader(str(local), **kwargs)))


def failure_parts(message: str) -> tuple[int, float]:
    """Return (attempts, seconds) from a RemoteError's "(tried N times over S s)"."""
    match = re.search(r"\(tried (\d+) times? over ([0-9.]+) s\)", message)
    assert match is not None, message
    return int(match.group(1)), float(match.group(2))


def assert_names_the_url_once(message: str, url: str) -> None:
    """Assert that ``message`` names ``url`` and no other URL, once, and no credential."""
    assert message.count(url) == 1 and message.count("://") == 1, message  # not the endpoint's URL again
    assert SECRET not in message and "tester" not in message, message


def test_an_outage_longer_than_the_budget_is_a_typed_error_within_it(tiles, proxy, tmp_path):  # noqa: F811
    local, url = tiles
    fp, options = proxy
    budget = 3.0
    loader = fastload.ShardLoader(url, batch_size=32, storage_options={**options, "retry_timeout_s": budget},
                                  cache_dir=tmp_path, predownload=1, num_threads=1)
    it = iter(loader)
    next(it)
    fp.down()  # for good
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        list(it)
    waited = time.monotonic() - started
    message = str(caught.value)
    shard = re.search(rf"s3://{BUCKET}/tiles/shard-\d+\.lmdb", message)
    assert shard is not None, message
    assert_names_the_url_once(message, shard.group(0))
    attempts, seconds = failure_parts(message)
    assert attempts >= 3 and budget <= seconds < budget + 5, message
    assert "Connection refused" in message, message
    assert waited < budget + 20, waited  # (the last attempt starts at the budget; the shard in flight too)


def test_a_store_down_at_opening_is_a_typed_error_naming_the_manifest_once(tiles, proxy, tmp_path):  # noqa: F811
    _, url = tiles
    fp, options = proxy
    fp.down()
    with pytest.raises(RemoteError) as caught:
        fastload.ShardDataset(url, storage_options={**options, "retry_timeout_s": 1.5}, cache_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{url}/") and "GET failed" in message, message  # splits.json: the first request
    assert_names_the_url_once(message, message.split(": ", 1)[0])
    attempts, seconds = failure_parts(message)
    assert attempts >= 2 and seconds >= 1.5, message


def test_a_missing_object_is_not_retried(tiles, s3, proxy, tmp_path):  # noqa: F811
    local, _ = tiles
    fp, options = proxy
    url = upload(s3[1], local, "holey-outage")
    s3[1].delete_object(Bucket=BUCKET, Key="holey-outage/shard-00003.lmdb")
    started = time.monotonic()
    with pytest.raises(RemoteNotFoundError, match=rf"{url}-missing/manifest.json"):
        fastload.ShardDataset(url + "-missing", storage_options=options, cache_dir=tmp_path)
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)
    with pytest.raises(RemoteNotFoundError) as caught:
        dataset[3 * 64]
    assert time.monotonic() - started < 10  # the default budget is 120 s
    assert_names_the_url_once(str(caught.value), f"{url}/shard-00003.lmdb")
    assert [n for k, n in fp.seen.items() if k.endswith("shard-00003.lmdb")] == [1], fp.seen
    assert {n for k, n in fp.seen.items() if "missing" in k} == {1}, fp.seen  # (splits.json, manifest.json)


def test_opening_a_dataset_asks_for_each_file_once(tiles, s3, proxy, tmp_path):  # noqa: F811
    """A dataset opens with one GET of splits.json (its 404: not a root) and one of the manifest, no HEAD first."""
    _, url = tiles
    fp, options = proxy
    fastload.ShardLoader(url, batch_size=16, storage_options=options, cache_dir=tmp_path / "c")
    asked = {k: n for k, n in fp.seen.items() if ".lmdb" not in k}
    assert asked == {f"GET /{BUCKET}/tiles/splits.json": 1, f"GET /{BUCKET}/tiles/manifest.json": 1}, fp.seen


def test_a_manifest_or_splits_file_larger_than_its_kind_may_be_is_refused(tiles, s3, proxy, tmp_path,  # noqa: F811
                                                                         monkeypatch):
    """The size in the GET's own answer is checked before its body is read: a store can't make it hold more."""
    _, url = tiles
    fp, options = proxy
    monkeypatch.setattr("fastload.storage._remote.MAX_MANIFEST_BYTES", 100)
    with pytest.raises(RemoteError, match=r"manifest\.json: \d+ bytes, more than the 100 a file of its kind"):
        fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path / "c")
    s3[1].put_object(Bucket=BUCKET, Key="big-splits/splits.json", Body=b" " * 1000)
    monkeypatch.setattr("fastload.storage._remote.MAX_SPLITS_BYTES", 999)
    with pytest.raises(RemoteError, match=r"big-splits/splits\.json: 1000 bytes, more than the 999"):
        fastload.ShardDataset(f"s3://{BUCKET}/big-splits", storage_options=options, cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").rglob("manifest.json"))


def test_a_manifest_body_longer_than_its_header_said_is_given_up_at_the_limit(tmp_path, monkeypatch):
    """A server announcing 100 bytes and sending 64 MiB (chunked): the read stops past the limit, not at the end."""
    sent = []

    class Lying(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if not self.path.endswith("manifest.json"):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Content-Length", "100")
            self.end_headers()
            block = b"x" * (1 << 20)
            try:
                for _ in range(64):
                    self.wfile.write(b"%x\r\n" % len(block) + block + b"\r\n")
                    sent.append(len(block))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client gave up
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Lying)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr("fastload.storage._remote.MAX_MANIFEST_BYTES", 1 << 20)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ds"
        with pytest.raises(RemoteError, match=r"manifest\.json: more than 1048576 bytes \(the answer said 100\)"):
            fastload.ShardDataset(url, storage_options={"allow_http": True}, cache_dir=tmp_path / "c")
    finally:
        server.shutdown()
        server.server_close()
    assert sum(sent) < 32 << 20, sum(sent)  # read stopped near the limit (socket buffers hold a few MiB more)


def test_a_refused_permission_is_not_retried(tiles, proxy, tmp_path):  # noqa: F811
    _, url = tiles
    fp, options = proxy
    fp.plan("shard-00002.lmdb", *["403"] * 5)
    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)
    with pytest.raises(RemoteError, match="refused") as caught:
        dataset[2 * 64]
    assert_names_the_url_once(str(caught.value), f"{url}/shard-00002.lmdb")
    assert fp.faults_served == [("403", f"/{BUCKET}/tiles/shard-00002.lmdb")], fp.faults_served


def test_a_stopped_download_ends_its_retries_at_once(tiles, proxy, tmp_path):  # noqa: F811
    """A closed fetcher (or a Ctrl-C, which closes it) sets ``stop``: a download waiting to retry ends then."""
    local, url = tiles
    fp, options = proxy
    root = RemoteRoot(url, StorageOptions.build(options))  # the default budget: 120 s
    shard = load_manifest(local).shards[0]
    fp.down()
    stop, outcome = threading.Event(), []

    def download() -> None:
        """Fetch the shard; keep what it raises."""
        try:
            fetch_shard(root, tmp_path, shard, stop=stop)
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            outcome.append(err)

    thread = threading.Thread(target=download, daemon=True)
    thread.start()
    time.sleep(2.0)  # a few attempts refused: it is waiting to try again
    assert thread.is_alive()
    stop.set()
    thread.join(3.0)
    assert not thread.is_alive(), "the retries went on after stop"
    assert len(outcome) == 1 and isinstance(outcome[0], DownloadStopped), outcome
    assert not list(tmp_path.glob("*.part-*"))


@pytest.mark.parametrize("options", [{"retry_timeout_s": 0}, {"retry_timeout_s": -5}, {"retry_timeout_s": 1e6},
                                     {"retry_timeout_s": float("nan")}, {"retry_timeout_s": float("inf")},
                                     {"retry_timeout_s": "60"}, {"retry_timeout_s": True},
                                     {"retry_timeout_s": None}, {"max_retries": -1}, {"max_retries": 10**6},
                                     {"max_retries": 2.5}, {"max_retries": True}, {"max_retries": "3"}])
def test_absurd_retry_settings_are_refused(tiles, options, tmp_path):  # noqa: F811
    _, url = tiles
    with pytest.raises(ArgumentError, match=next(iter(options))):
        StorageOptions.build(options)
    with pytest.raises(ArgumentError, match=next(iter(options))):  # before any request
        fastload.ShardDataset(url, storage_options=options, cache_dir=tmp_path)


def test_the_default_budget_rides_out_a_minute():
    """The defaults give a minute's outage room; a small budget and no retries are accepted as given."""
    built = StorageOptions.build({"retry_timeout_s": 0.5, "max_retries": 0})
    assert built.retries == {"max_retries": 0, "retry_timeout_s": 0.5}
    defaults = StorageOptions.build(None).retries
    assert defaults["retry_timeout_s"] >= 60 and defaults["max_retries"] >= 30
