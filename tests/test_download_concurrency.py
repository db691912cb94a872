"""How many shard downloads run at once (storage/_concurrency.py), on simulated links, and in a fetcher.

The policy is pure (it is told the time, the bytes received and the downloads running), so a link is
simulated: chunks of 8 MiB arrive at the aggregate rate the link gives that many downloads at once.
A shared bottleneck (moto on this machine's cores, one slow link) gives the same rate to 2 or 8, and
the limit must stay low, so that shards arrive in the order they are read; connections with a rate
of their own (an object store) add up, and the limit must rise to the ceiling.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from moto_s3 import moto_s3

from fastload.storage._concurrency import DownloadConcurrency

CHUNK = 8 << 20


def simulate(tuner: DownloadConcurrency, rate: Callable[[int, float], float], seconds: float,
             start: float = 0.0, received: int = 0) -> tuple[list[int], float, int]:
    """Run the link for ``seconds``: ``rate(n, t)`` bytes/s with ``n`` downloads; return (limits seen, t, bytes)."""
    t, limits = start, [tuner.limit]
    tuner.report(t, received, tuner.limit)
    while t < start + seconds:
        n = tuner.limit
        t += CHUNK / rate(n, t)
        received += CHUNK
        if tuner.report(t, received, n):
            tuner.report(t, received, tuner.limit)  # the fetcher starts (or lets end) a download at once
        limits.append(tuner.limit)
    return limits, t, received


def shared(n: int, t: float) -> float:
    return 700e6  # one bottleneck: more downloads at once share it


def independent(n: int, t: float) -> float:
    return 100e6 * n  # each connection has its own 100 MB/s


def test_a_shared_bottleneck_keeps_few_downloads_at_once():
    tuner = DownloadConcurrency(8)
    limits, _, _ = simulate(tuner, shared, 5.0)
    assert max(limits) == 3  # tried once: it did not raise the rate
    assert limits[-1] == 2 and limits[len(limits) // 2:].count(3) == 0
    assert set(tuner.rates()) == {2, 3}


def test_connections_with_a_rate_of_their_own_rise_to_the_ceiling():
    tuner = DownloadConcurrency(8)
    limits, _, _ = simulate(tuner, independent, 10.0)
    assert limits[-1] == 8
    assert limits == sorted(limits)  # one more at a time, never back: each helped
    assert tuner.rates()[8] == pytest.approx(800e6)


def test_a_link_that_saturates_stops_where_one_more_no_longer_helps():
    tuner = DownloadConcurrency(16)
    limits, _, _ = simulate(tuner, lambda n, t: min(100e6 * n, 450e6), 10.0)
    assert limits[-1] in (4, 5)  # 4 give 400 MB/s, 5 give 450 (+12 %, less than half of +25 %)
    assert max(limits) <= 6


def test_a_level_that_did_not_help_is_tried_again_when_the_link_changes():
    tuner = DownloadConcurrency(8, retry_s=2.0)
    limits, t, received = simulate(tuner, shared, 3.0)
    assert limits[-1] == 2
    limits, _, _ = simulate(tuner, independent, 10.0, t, received)  # e.g. the store's other load went away
    assert limits[-1] == 8


def test_a_short_queue_or_an_idle_link_measures_nothing():
    tuner = DownloadConcurrency(8)
    t, received = 0.0, 0
    tuner.report(t, received, 1)  # one download where the limit is 2: says nothing about 2
    for _ in range(100):
        t += CHUNK / 100e6
        received += CHUNK
        assert not tuner.report(t, received, 1)
    assert tuner.rates() == {} and tuner.limit == 2
    assert not tuner.report(t + 60.0, received, 0)  # idle, then a fresh window: the pause is not a slow rate
    assert not tuner.report(t + 60.1, received + CHUNK, 2)
    assert tuner.rates() == {}


def test_the_first_batch_may_start_more_downloads_until_something_is_measured():
    tuner = DownloadConcurrency(8)
    tuner.start(5)
    assert tuner.limit == 5
    tuner.start(20)
    assert tuner.limit == 8  # capped at the threads
    simulate(tuner, shared, 2.0)
    low = tuner.limit
    tuner.start(8)  # a later pass: what was measured stands
    assert tuner.limit == low < 8


@pytest.mark.parametrize("most, start, expected", [(1, 2, 1), (0, 2, 1), (8, 0, 1), (8, 3, 3)])
def test_the_limit_stays_within_one_and_the_ceiling(most, start, expected):
    assert DownloadConcurrency(most, start).limit == expected


def test_started_high_on_a_shared_bottleneck_it_comes_down_and_on_independent_connections_it_stays():
    tuner = DownloadConcurrency(8, start=8)
    limits, _, _ = simulate(tuner, shared, 5.0)
    assert limits[-1] == 2
    tuner = DownloadConcurrency(8, start=8)
    limits, _, _ = simulate(tuner, independent, 5.0)
    assert limits[-1] == 8 and min(limits) == 7  # one fewer tried once: it gave less


@pytest.mark.parametrize("link, low, high", [(shared, 2, 2), (independent, 7, 8)], ids=["shared", "independent"])
def test_rates_that_vary_by_a_third_from_chunk_to_chunk_lead_to_the_same_limits(link, low, high):
    import random

    draw = random.Random(7)
    tuner = DownloadConcurrency(8)
    limits, _, _ = simulate(tuner, lambda n, t: link(n, t) * (0.7 + 0.6 * draw.random()), 10.0)
    settled = limits[len(limits) // 2:]
    assert low <= sum(settled) / len(settled) <= high


# ---- in a fetcher, against moto's S3 server on 127.0.0.1 ----------------------------------------------


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):  # its tests are in the slow tier (docs/testing.md): they start moto's server
    """(storage_options, URL, local path) of a 6-shard dataset in a moto server started here."""
    pytest.importorskip("obstore", reason="fastload[remote] (obstore) is not installed")
    import numpy as np

    import fastload

    with moto_s3("conc") as (_, client, options):
        local = tmp_path_factory.mktemp("conc") / "ds"
        fastload.write_arrays(local, {"x": np.arange(6 * 40 * 64, dtype=np.uint8).reshape(240, 64),
                                      "label": np.arange(240)}, samples_per_shard=40)
        for path in sorted(local.iterdir()):
            client.upload_file(str(path), "conc", f"ds/{path.name}")
        yield options, "s3://conc/ds", local


def open_fetcher(options: dict, url: str, cache, concurrency: DownloadConcurrency, endpoint: str | None = None):
    """A fetcher of its own (the dataset's is left unused) with ``concurrency``; (fetcher, dataset)."""
    import fastload
    from fastload.storage._client import RemoteRoot, StorageOptions
    from fastload.storage._fetcher import ShardFetcher

    dataset = fastload.ShardDataset(url, storage_options=options, cache_dir=cache)
    cached = dataset._cached
    root_options = options if endpoint is None else {**options, "endpoint": endpoint}
    root = RemoteRoot(cached.source_url, StorageOptions.build(root_options))
    fetcher = ShardFetcher(root, cached.path, dataset.manifest.shards, concurrency=concurrency)
    return fetcher, dataset


@pytest.mark.slow  # tier: the moto S3 server
def test_one_download_at_a_time_fetches_the_shards_in_the_order_they_are_needed(bucket, tmp_path):
    options, url, local = bucket
    fetcher, _ = open_fetcher(options, url, tmp_path, DownloadConcurrency(1))
    class Arrivals(list):  # weakly referable: the fetcher's listeners live as long as their owner
        pass

    arrived = Arrivals()
    fetcher.on_fetched(arrived, lambda index, path: arrived.append(index))
    order = [5, 3, 1, 0, 2, 4]
    fetcher.want(order)
    deadline = time.monotonic() + 60
    while not fetcher.ready(order) and time.monotonic() < deadline:  # no ensure(): a reader's wait jumps the queue
        time.sleep(0.02)
    assert arrived == order  # 8 threads, but one download at a time: none overtakes another
    for index in order:
        assert fetcher.path(index).read_bytes() == (local / fetcher.path(index).name).read_bytes()
    fetcher.close()


@pytest.mark.slow  # tier: the moto S3 server
def test_a_shard_a_reader_waits_for_downloads_past_the_limit(bucket, tmp_path):
    from fault_proxy import FaultProxy

    options, url, _ = bucket
    fp = FaultProxy(options["endpoint"], delay_s=20.0)
    try:
        fetcher, dataset = open_fetcher(options, url, tmp_path, DownloadConcurrency(1), endpoint=fp.url)
        fp.plan(dataset.manifest.shards[0].file, "delay")  # the one slot is taken by a slow download
        fetcher.want([0, 1, 2])
        deadline = time.monotonic() + 10
        while not fp.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        fetcher.ensure(2, timeout=15.0)  # not after shards 0 (20 s late) and 1: past the limit
        assert not fetcher.ready([0]) and not fetcher.ready([1])  # (1 waits for the one slot, 0 for its answer)
        fetcher.ensure(1, timeout=30)
        fetcher.ensure(0, timeout=30)
        fetcher.close()
    finally:
        fp.close()


def test_an_outage_does_not_hold_the_limit_high_once_the_shared_link_is_back():
    tuner = DownloadConcurrency(8, retry_s=5.0)

    def outage(n: int, t: float) -> float:
        return 2e6 if 2.0 < t < 6.0 else 700e6  # 4 s of next to nothing, then the shared link again

    limits, _, _ = simulate(tuner, outage, 40.0)
    assert limits[-1] == 2 and limits[-len(limits) // 4:].count(2) >= 0.9 * (len(limits) // 4)


@pytest.mark.parametrize("bad", [{"window_s": 0}, {"window_bytes": 0}, {"retry_s": -1.0}])
def test_windows_and_retries_of_no_length_are_refused(bad):
    from fastload.errors import ArgumentError

    with pytest.raises(ArgumentError, match="must be positive"):
        DownloadConcurrency(8, **bad)


@pytest.mark.slow  # tier: the moto S3 server
def test_verify_of_a_bucket_reports_its_download_in_a_log_and_names_the_url_not_the_cache(bucket, tmp_path):
    import os
    import subprocess
    import sys

    options, url, _ = bucket
    env = {**os.environ, "AWS_ENDPOINT_URL": options["endpoint"], "AWS_ACCESS_KEY_ID": "tester",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
           "AWS_EC2_METADATA_DISABLED": "true", "FASTLOAD_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "fastload.tools.cli", "verify", url], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    download = [line for line in done.stderr.splitlines() if line.startswith(f"fastload: download {url}: ")]
    assert download[0].endswith("(0 %)") and "(100 %)" in download[-1] and "done in" in download[-1], done.stderr
    verify = [line for line in done.stderr.splitlines() if line.startswith("fastload: verify ")]
    assert verify and all(line.startswith(f"fastload: verify {url}: ") for line in verify), done.stderr
    quiet = subprocess.run([sys.executable, "-m", "fastload.tools.cli", "verify", "--no-progress", url], env=env,
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "download" not in quiet.stderr and "%" not in quiet.stderr, quiet.stderr
