"""The cost of sampling: one epoch of the small datasets, native backend, 2 threads, batch 256.

Run: ``pytest benchmarks/test_sampling.py --benchmark-only -s`` (part of ``make bench``).

Compared in the ``sampling-<dataset>`` groups, with the same number of samples per epoch:
``plain`` (shuffled epoch, order v1 evaluated per batch in C++); ``subset`` (every index, given as
``indices=``, shuffled among themselves); ``weights`` (random weights, ``num_samples=n``, with
replacement: alias-table draws); ``weights-norepl`` (the same without replacement: exponential keys
and a sort); ``mix`` (the dataset mixed with itself 50/50, ``stop=n``, shuffled sources); ``window``
(``shuffle_window=4``: a shuffle within windows of 4 shards).
Every round reads a new epoch, so each epoch's index list is computed inside the timing.

Why the numbers come out as they do: the non-plain policies compute the epoch's whole index list
with numpy once per epoch (O(n) words of SplitMix64, an alias lookup or a sort), then hand the
C++ reader its indices per batch by slicing. That is a few milliseconds for 50,000 samples
against tens of milliseconds of reading; without replacement adds an O(n log n) sort.

``test_sampling_overhead_interleaved`` measures the same epochs interleaved (one epoch of each
configuration in turn, several rounds, the median per configuration) so that a loaded machine
affects all of them alike, and prints each policy's time relative to ``plain``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import shuffle_quality
from conftest import BATCH, SEED
from datasets import all_datasets, ensure
from measure import EpochResult, MemorySampler, extra_info, run_epoch

import fastload
from fastload import ShardLoader

SMALL = [ds for ds in all_datasets() if ds.kind == "small"]


def make(config: str, path) -> ShardLoader:
    kwargs = {"batch_size": BATCH, "seed": SEED, "num_threads": 2, "backend": "native"}
    n = len(fastload.ShardDataset(path))
    if config == "plain":
        return ShardLoader(path, shuffle=True, **kwargs)
    if config == "subset":
        return ShardLoader(path, indices=np.arange(n), shuffle=True, **kwargs)
    weights = np.random.default_rng(0).uniform(0.1, 1.0, n)
    if config == "weights":
        return ShardLoader(path, sample_weights=weights, num_samples=n, **kwargs)
    if config == "weights-norepl":
        return ShardLoader(path, sample_weights=weights, num_samples=n, replacement=False, **kwargs)
    if config == "mix":
        return ShardLoader(fastload.mix([path, path], weights=[0.5, 0.5], stop=n), shuffle=True, **kwargs)
    if config == "window":
        return ShardLoader(path, shuffle=True, shuffle_window=4, **kwargs)
    raise ValueError(config)


CONFIGS = ["plain", "subset", "weights", "weights-norepl", "mix", "window"]


def one_epoch(loader: ShardLoader, epoch: int) -> int:
    loader.set_epoch(epoch)
    samples = 0
    for batch in loader:
        samples += len(batch["label"])
    return samples


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("ds", SMALL, ids=lambda d: d.name)
def test_sampling(benchmark, ds, config):
    path = ensure(ds)
    loader = make(config, path)
    epochs = iter(range(1, 1000))
    result = EpochResult()
    counted: list[int] = []

    def epoch() -> None:
        loader.set_epoch(next(epochs))
        run_epoch(lambda: loader, result)
        counted.append(result.samples)

    benchmark.group = f"sampling-{ds.name}"
    with MemorySampler() as memory:
        benchmark.pedantic(epoch, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(extra_info(result, ds.sample_bytes, None, memory))
    assert counted and all(c == ds.count for c in counted)


@pytest.mark.parametrize("ds", SMALL, ids=lambda d: d.name)
def test_sampling_overhead_interleaved(benchmark, ds):
    path = ensure(ds)
    loaders = {c: make(c, path) for c in CONFIGS}
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for c in CONFIGS:  # warm-up: page cache, thread start, alias table
        one_epoch(loaders[c], 0)

    whole = EpochResult()  # the interleaved run as one round, for the figures every benchmark records

    def rounds() -> None:
        epoch = EpochResult()
        for r in range(1, 16):
            for c in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:  # rotate who goes first
                loaders[c].set_epoch(r)
                run_epoch(lambda c=c: loaders[c], epoch)
                assert epoch.samples == ds.count
                times[c].append(epoch.seconds[-1])
        whole.samples = ds.count * len(epoch.seconds)
        whole.seconds.append(sum(epoch.seconds))
        whole.first_batch.append(epoch.first_batch[0])
        whole.cpu.append(sum(epoch.cpu))

    benchmark.group = f"sampling-overhead-{ds.name}"
    with MemorySampler() as memory:
        benchmark.pedantic(rounds, rounds=1, warmup_rounds=0)
    benchmark.extra_info.update(extra_info(whole, ds.sample_bytes, None, memory))
    plain = statistics.median(times["plain"])
    for c in CONFIGS:
        median = statistics.median(times[c])
        benchmark.extra_info[f"{c}_median_s"] = median
        benchmark.extra_info[f"{c}_vs_plain"] = median / plain
        print(f"{ds.name} {c:15s} median {median * 1e3:7.2f} ms  min {min(times[c]) * 1e3:7.2f} ms  "
              f"{median / plain:5.3f}x plain")
    # The policy's own work, in CPU time of this thread (less sensitive to a loaded machine than wall time):
    # computing one epoch's indices, against the plain order's per-batch C++ evaluation of the same positions.
    fastest_plain = min(times["plain"])
    cost = {c: policy_cpu_s(loaders[c]) for c in CONFIGS}
    for c in CONFIGS:
        extra = cost[c] - cost["plain"]
        benchmark.extra_info[f"{c}_policy_cpu_s"] = cost[c]
        benchmark.extra_info[f"{c}_overhead_vs_fastest_plain_epoch"] = extra / fastest_plain
        print(f"{ds.name} {c:15s} policy CPU {cost[c] * 1e3:6.2f} ms per epoch: {extra * 1e3:+6.2f} ms over plain, "
              f"{100 * extra / fastest_plain:+5.1f}% of the fastest plain epoch ({fastest_plain * 1e3:.1f} ms)")


def test_shuffle_window_quality(benchmark):
    """How much a batch mixes under shard windows and the global shuffle (benchmarks/shuffle_quality.py)."""
    rows: list[dict] = []
    benchmark.group = "shuffle-window-quality"
    cpu = time.process_time()
    with MemorySampler() as memory:
        benchmark.pedantic(lambda: rows.extend(shuffle_quality.table()), rounds=1, warmup_rounds=0)
    for row in rows:
        for key, value in row.items():
            benchmark.extra_info[f"{row['window']}_{key}"] = value
    # Only order arithmetic: the common figures are those of computing the epoch orders (no file read).
    order_s = sum(row["order_s"] for row in rows)
    benchmark.extra_info.update({"samples_per_s": shuffle_quality.N * len(rows) / order_s, "mb_per_s": 0.0,
                                 "first_batch_s": rows[0]["order_s"], "peak_rss_mb": memory.peak_rss / 2**20,
                                 "cpu_s": time.process_time() - cpu})
    by_window = {row["window"]: row for row in rows}
    assert by_window["global"]["mixed_labels"] > 200 and by_window[1]["sorted_shards"] == 1
    shuffle_quality.main()


def test_write_order_class_mixing(benchmark, tmp_path):
    """Distinct labels per batch of a class-folder dataset written in source or shuffled order (issue 42)."""
    rows: list[dict] = []
    benchmark.group = "write-order-class-mixing"
    cpu = time.process_time()
    with MemorySampler() as memory:
        benchmark.pedantic(lambda: rows.extend(shuffle_quality.class_mixing(tmp_path)), rounds=1, warmup_rounds=0)
    for row in rows:
        for key, value in row.items():
            benchmark.extra_info[f"{row['order']}_{row['read']}_{key}"] = value
    samples = shuffle_quality.MIX_CLASSES * shuffle_quality.MIX_PER_CLASS
    convert_s = sum(row["convert_s"] for row in rows) / 2
    benchmark.extra_info.update({"samples_per_s": 2 * samples / convert_s, "mb_per_s": 0.0,
                                 "first_batch_s": 0.0, "peak_rss_mb": memory.peak_rss / 2**20,
                                 "cpu_s": time.process_time() - cpu})
    got = {(row["order"], row["read"]): row for row in rows}
    window = f"window={shuffle_quality.MIX_WINDOW}"
    assert got[("source", window)]["warned"] and not got[("shuffled", window)]["warned"]
    assert got[("shuffled", window)]["labels_median"] >= got[("shuffled", "global")]["labels_median"] - 1
    assert got[("source", window)]["labels_median"] < got[("shuffled", window)]["labels_median"]
    shuffle_quality.print_class_mixing(rows)


def policy_cpu_s(loader: ShardLoader, rounds: int = 9) -> float:
    """Return the median thread CPU seconds to compute one epoch's sample indices (what the reader is handed)."""
    from fastload import _native

    plan = loader._plan(0, 0)
    spent = []
    for epoch in range(100, 100 + rounds):
        start = time.thread_time()
        order = loader._sampling.epoch_order(loader.seed, epoch, len(loader.dataset), loader.shuffle)
        for b in range(len(plan)):
            positions = plan.batch_positions(b)
            if isinstance(order, fastload.EpochOrder):
                _native.permutation_at(order.seed, order.epoch, order.n, positions)
            else:
                order.at(positions)
        spent.append(time.thread_time() - start)
    return statistics.median(spent)
