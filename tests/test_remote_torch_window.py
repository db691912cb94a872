"""backend="torch" over a windowed remote dataset (a cache smaller than the dataset), in forked DataLoader workers.

Against moto's S3 server of tests/test_remote.py. A forked worker fetches a shard the parent has not
fetched yet through a fresh interpreter (``storage/_fetch_child.py``); in a windowed version any
process making room may evict that shard again before the worker holds it. The promise: such an
eviction costs a download, never an error (unless it happens again and again: a typed error naming
the shard and cache_limit), and two-epoch runs under CPU load give the local copy's batches, every time.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from test_remote import batches, s3, same  # noqa: F401  (s3: the module's server fixture)
from test_remote_window import big, shard_bytes  # noqa: F401  (big: 16 shards of 50 samples, local and uploaded)

import fastload
from fastload.errors import RemoteError
from fastload.storage import _fetch_child
from fastload.storage._cache import is_whole
from fastload.storage._fetch_child import ForkedFetcher

pytestmark = pytest.mark.slow  # tier: the moto S3 server and forked download children, under CPU load


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def windowed_forked_fetcher(big, s3, tmp_path):  # noqa: F811
    """Open ``big`` windowed (room for 2.5 shards); return it and a ForkedFetcher of its version (a worker's)."""
    local, url = big
    _, largest = shard_bytes(local)
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "cache",
                                    cache_limit=2 * largest + largest // 2 + 8192)
    cached = dataset._cached
    assert cached.window is not None
    return dataset, ForkedFetcher(cached.source_url, cached._spec, cached.path, dataset.manifest.shards, cached.url)


def evicting(monkeypatch, fetcher: ForkedFetcher, times: int) -> list[int]:
    """Make the first ``times`` fresh-process downloads vanish at once, as another process making room would."""
    calls: list[int] = []
    original = _fetch_child.fetch_in_fresh_process

    def download_then_evict(source_url, spec, version, index, url):
        original(source_url, spec, version, index, url)
        calls.append(index)
        if len(calls) <= times:
            fetcher.path(index).unlink()  # evicted between the download and the worker's look at it

    monkeypatch.setattr(_fetch_child, "fetch_in_fresh_process", download_then_evict)
    return calls


def test_a_shard_evicted_right_after_a_workers_download_is_fetched_again(big, s3, tmp_path, monkeypatch):  # noqa: F811
    dataset, fetcher = windowed_forked_fetcher(big, s3, tmp_path)
    calls = evicting(monkeypatch, fetcher, times=1)
    path = fetcher.ensure(3)
    assert calls == [3, 3]
    assert is_whole(path, dataset.manifest.shards[3].bytes)


def test_a_shard_evicted_after_every_download_is_a_typed_error_naming_it(big, s3, tmp_path, monkeypatch):  # noqa: F811
    dataset, fetcher = windowed_forked_fetcher(big, s3, tmp_path)
    calls = evicting(monkeypatch, fetcher, times=1000)
    with pytest.raises(RemoteError, match="evicted .* times right after its download") as err:
        fetcher.ensure(5)
    assert f"{big[1]}/{dataset.manifest.shards[5].file}" in str(err.value) and "cache_limit" in str(err.value)
    assert calls == [5] * _fetch_child.FETCH_ATTEMPTS


@pytest.mark.parametrize("window", [1, 2])
def test_two_epoch_torch_runs_under_cpu_load_give_the_local_batches_every_time(big, s3, tmp_path, window):  # noqa: F811
    """Several two-epoch runs (as many as start within 12 s, at least 2), a CPU burner beside them."""
    local, url = big
    _, largest = shard_bytes(local)
    limit = 2 * window * largest + largest // 2 + 8192  # the room the window needs, and the manifest
    order = {"batch_size": 32, "seed": 5, "shuffle": True, "shuffle_window": window}
    expected = fastload.ShardLoader(str(local), **order)
    want = []
    for epoch in range(2):
        expected.set_epoch(epoch)
        want.append(batches(expected))
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 40: pass"])
    runs, start = 0, time.monotonic()
    try:
        while runs < 2 or (runs < 6 and time.monotonic() - start < 12):
            loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / f"cache{runs}",
                                          cache_limit=limit, backend="torch", num_workers=2, **order)
            assert loader.dataset._cached.window is not None
            for epoch in range(2):
                loader.set_epoch(epoch)
                assert same(batches(loader), want[epoch]), (runs, epoch)
            del loader
            runs += 1
    finally:
        burner.kill()
        burner.wait()


def test_a_fresh_interpreter_that_cannot_import_fastload_says_so(tmp_path, monkeypatch):
    """A fetch child imports fastload from disk again: one changed mid-run fails, and the error says why."""
    broken = tmp_path / "edited" / "fastload"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError(\"cannot import name 'make_room' (an edit in progress)\")\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "edited"), *sys.path])
    with pytest.raises(RemoteError, match="could not import fastload: was it reinstalled or edited") as err:
        _fetch_child.fetch_in_fresh_process("s3://bucket/ds", None, tmp_path, 4, "s3://bucket/ds")
    assert "s3://bucket/ds: the process fetching shard 4 failed (exit status 1, ImportError)" in str(err.value)
