"""Conversion on a Dask cluster against the built-in process pool: the engine's overhead (issue 27).

Run: ``pytest benchmarks/test_conversion_dask.py --benchmark-only -s`` (``FASTLOAD_BENCH_QUICK=1``
for a tiny run). The same ``write_dataset`` of the same map-style dataset (3x128x128 uint8 tiles
built from their index, ``write_dataset_throughput.Tiles``) with ``workers=2`` (the process pool)
and with ``client=`` a ``LocalCluster`` of 2 worker processes of 1 thread each on 127.0.0.1. Each
round runs both, alternating, so machine load hits both alike; the best round of each counts, and
each round's own ratio is recorded too (5 rounds: their median and range).
Recorded: ``samples_per_s`` and ``mb_per_s`` of the Dask run, ``pool_samples_per_s``, and
``ratio_to_pool`` (Dask over pool; the goal is at least 0.9). The outputs are compared byte for
byte each round. Two layouts: ``one-shard`` (the default shard size holds the whole run: the driver
writes the one shard in both engines) and ``16-shards`` (250 samples a shard: the pool's driver
writes them all, Dask's tasks write all but the first themselves; docs/dask.md).
"""

from __future__ import annotations

import filecmp
import shutil
import statistics
import time
from pathlib import Path

import pytest
from datasets import QUICK
from measure import EpochResult, MemorySampler, extra_info
from write_dataset_throughput import Tiles

import fastload

distributed = pytest.importorskip("distributed")

SAMPLES = 300 if QUICK else 4000
ROUNDS = 1 if QUICK else 5
SAMPLE_BYTES = 3 * 128 * 128 + 8


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


def timed_write(out: Path, codec: str, samples_per_shard: int | None, **engine) -> float:
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    m = fastload.write_dataset(Tiles(SAMPLES), out, codec=codec, names=("image", "label"), progress=False,
                               samples_per_shard=samples_per_shard, **engine)
    seconds = time.perf_counter() - start
    assert m.total == SAMPLES
    return seconds


@pytest.mark.parametrize("layout", ["one-shard", "16-shards"])
@pytest.mark.parametrize("codec", ["raw", "zstd"], ids=lambda c: f"conversion-dask-{c}-dask-2-vs-pool-2")
def test_conversion_dask_vs_pool(benchmark, client, tmp_path, codec, layout):
    benchmark.group = f"conversion-dask-{codec}-{layout}"
    per_shard = None if layout == "one-shard" else SAMPLES // 16
    timed_write(tmp_path / "warm", codec, per_shard, client=client)  # the workers import fastload and torch once
    pool, dask = EpochResult(samples=SAMPLES), EpochResult(samples=SAMPLES)
    cpu = time.process_time

    def round_() -> None:
        for result, engine, out in ((pool, {"workers": 2}, tmp_path / "pool"),
                                    (dask, {"client": client}, tmp_path / "dask")):
            cpu0 = cpu()
            seconds = timed_write(out, codec, per_shard, **engine)
            result.seconds.append(seconds)
            result.first_batch.append(seconds)  # a conversion delivers nothing usable before it ends
            result.cpu.append(cpu() - cpu0)  # this process's: the driver's share
        names = sorted(p.name for p in (tmp_path / "pool").glob("*.lmdb"))
        _, differ, missing = filecmp.cmpfiles(tmp_path / "pool", tmp_path / "dask", names, shallow=False)
        assert names and differ == [] and missing == []

    with MemorySampler() as memory:
        benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=0)
    benchmark.extra_info.update(extra_info(dask, SAMPLE_BYTES, None, memory))
    pool_rate = SAMPLES / min(pool.seconds)
    ratio = benchmark.extra_info["samples_per_s"] / pool_rate
    # Each round's own ratio (the two runs side by side): their median and spread say more than the best ones.
    per_round = sorted(p / d for p, d in zip(pool.seconds, dask.seconds))
    benchmark.extra_info.update({"codec": codec, "layout": layout, "pool_samples_per_s": pool_rate,
                                 "ratio_to_pool": ratio, "round_ratios": per_round,
                                 "median_round_ratio": statistics.median(per_round)})
    dask_rate = benchmark.extra_info["samples_per_s"]
    print(f"\n{codec}, {layout}: pool {pool_rate:,.0f} samples/s, dask {dask_rate:,.0f} samples/s "
          f"({benchmark.extra_info['mb_per_s']:.1f} MB/s), dask/pool {ratio:.2f}; per round: median "
          f"{statistics.median(per_round):.2f} [{per_round[0]:.2f}-{per_round[-1]:.2f}]")
