"""The first epoch of a fresh process against that process's steady state (issue 26).

Each configuration runs in a fresh subprocess (benchmarks/first_epoch_child.py): epochs 1 to 4,
page cache warm (the files were read by this process before). Recorded per configuration: the first
epoch's samples/s, the steady state (the median of epochs 2 to 4), their ratio (goal: at least 0.9),
the time to the first batch (goal on small records: at most 0.05 s), minor and major page faults of
the first epoch and of a steady one, and the consuming thread's CPU per batch (goal: at most 15 us at
batch 256). The median of 3 fresh processes is kept for each figure, with the spread (min, max) of
the ratio. Each configuration runs twice: iterating as soon as the loader is built (``setup_s`` 0),
and after 0.5 s of sleep in its place (``setup_s`` 0.5), the time a training script spends building
its model, in which the loader's warm-up (``warm_up=True``) faults in its batch buffers and maps the
cached shard pages.

``test_first_epoch_long`` records the same on the raw datasets made 10 times (small records) and 5 times
(tiles) as large, iterating at once: a fresh process's one-time costs against longer epochs.

``test_first_epoch_cold`` drops the page cache first (root on Linux; skipped, saying why, elsewhere)
and sets the first epoch's MB/s against the disk's sequential read of the same files, also read cold.

``test_first_epoch_beside_ffcv`` runs FFCV (an optional peer: benchmarks/peer_ffcv.py, skipped where it is
not installed) on the same samples, its fresh processes alternating with fastload's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import peer_ffcv
import pytest
from conftest import DATASETS
from datasets import QUICK, BenchDataset, ensure

CHILD = Path(__file__).with_name("first_epoch_child.py")
CASES = [ds for ds in DATASETS if ds.name in ("small-raw", "small-zstd", "tiles-raw", "tiles-zstd")]
THREADS = ["1", "2", "auto"]
SETUPS = ["0", "0.5"]  # seconds between building the loader and iterating it (a model built meanwhile)
PROCESSES = 1 if QUICK else 3
EPOCHS = 2 if QUICK else 4


def run_child(path: Path, threads: str, prefetch: str = "auto", setup_s: str = "0") -> dict:
    threads_arg = "2" if threads == "auto" else threads  # num_threads="auto" is the CPU count: 2 here
    done = subprocess.run([sys.executable, str(CHILD), str(path), threads_arg, prefetch, str(EPOCHS), setup_s],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("setup_s", SETUPS)
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("ds", CASES, ids=lambda d: d.name)
def test_first_epoch(benchmark, ds, threads, setup_s):
    measure_fresh_processes(benchmark, f"first-epoch-{ds.name}", ds, threads, setup_s)


def measure_fresh_processes(benchmark, group: str, ds: BenchDataset, threads: str, setup_s: str) -> None:
    """Run PROCESSES fresh children on ``ds``, page cache warm, and record their figures in the benchmark."""
    path = ensure(ds)
    for p in path.iterdir():  # page cache warm: read once by another process than the measured one
        p.read_bytes()
    runs: list[dict] = []
    benchmark.group = group
    benchmark.pedantic(lambda: runs.extend(run_child(path, threads, setup_s=setup_s) for _ in range(PROCESSES)),
                       rounds=1, warmup_rounds=0)
    benchmark.extra_info.update(first_epoch_figures(ds, runs, threads, setup_s))


def first_epoch_figures(ds: BenchDataset, runs: list[dict], threads: str, setup_s: str) -> dict:
    """Return the figures of one configuration's fresh processes: medians, and the ratio's spread.

    Checks that every first epoch delivered the whole dataset.
    """
    firsts = [r["epochs"][0] for r in runs]
    steady = [statistics.median(e["samples_per_s"] for e in r["epochs"][1:]) for r in runs]
    ratios = [f["samples_per_s"] / s for f, s in zip(firsts, steady)]
    info = {
        "samples_per_s": statistics.median(f["samples_per_s"] for f in firsts),
        "steady_samples_per_s": statistics.median(steady),
        "first_over_steady": statistics.median(ratios),
        "first_over_steady_min": min(ratios),
        "first_over_steady_max": max(ratios),
        "first_batch_s": statistics.median(f["first_batch_s"] for f in firsts),
        "first_epoch_minor_faults": statistics.median(f["minor_faults"] for f in firsts),
        "steady_epoch_minor_faults": statistics.median(r["epochs"][-1]["minor_faults"] for r in runs),
        "first_epoch_major_faults": statistics.median(f["major_faults"] for f in firsts),
        "consumer_cpu_us_per_batch": statistics.median(r["epochs"][-1]["consumer_cpu_us_per_batch"] for r in runs),
        # How often the iterating thread blocked per batch in a steady epoch (None where /proc does not say).
        "consumer_blocks_per_batch": _median_or_none(r["epochs"][-1]["consumer_blocks_per_batch"] for r in runs),
        "import_s": statistics.median(r["import_s"] for r in runs),
        "cpu_s": statistics.median(f["cpu_s"] for f in firsts),  # the whole child process, first epoch
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "threads": threads,
        "setup_s": float(setup_s),
        # How long the warm-up ran before the first pass stopped it (None: it did not run).
        "warm_up_s": _median_or_none(r["warm_up_s"] for r in runs),
    }
    info["mb_per_s"] = info["samples_per_s"] * ds.sample_bytes / 1e6
    assert all(f["samples"] == ds.count for f in firsts)
    return info


# The raw datasets 10 times (small records) and 5 times (tiles) as large: the same one-time costs of a fresh
# process (threads, fresh batch buffers, the first touch of the shard mappings) against longer epochs.
LONG_CASES = [replace(ds, count=ds.count * (10 if ds.kind == "small" else 5)) for ds in CASES if ds.codec == "raw"]


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("ds", LONG_CASES, ids=lambda d: f"{d.name}-{d.count}")
def test_first_epoch_long(benchmark, ds, threads):
    """The first epoch against steady state on larger datasets, iterating as soon as the loader is built.

    What ``test_first_epoch`` records, on 10 times the small records and 5 times the tiles (raw): whether
    the first epoch's shortfall there is a fixed start-up cost that a longer epoch absorbs.
    """
    measure_fresh_processes(benchmark, f"first-epoch-long-{ds.name}", ds, threads, "0")


FFCV_CASES = [ds for ds in CASES if ds.name in ("small-raw", "tiles-raw")]


def rate_after_first_batch(epoch: dict) -> float:
    """Return an epoch's samples/s counted from its first batch on (the start-up apart)."""
    return (epoch["samples"] - 256) / (epoch["seconds"] - epoch["first_batch_s"])


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("ds", FFCV_CASES, ids=lambda d: d.name)
def test_first_epoch_beside_ffcv(benchmark, ds, threads):
    """Run fastload and FFCV (an optional peer, benchmarks/peer_ffcv.py) in alternating fresh processes.

    The same samples, both raw, page cache warm, random order, batch 256, ``threads`` reader threads
    (FFCV's num_workers).
    Recorded: each one's first epoch, steady state (median of epochs 2 to 4), first batch, and fastload's
    over FFCV's for each; also both first epochs counted from the first batch on (FFCV compiles its
    pipeline with numba before its first batch).
    """
    if not peer_ffcv.available():
        pytest.skip("ffcv is not installed (an optional peer: see benchmarks/peer_ffcv.py)")
    path = ensure(ds)
    beton = peer_ffcv.converted(path)
    for p in [*path.iterdir(), beton]:  # page cache warm for both
        p.read_bytes()
    ours: list[dict] = []
    theirs: list[dict] = []

    def side_by_side() -> None:
        for _ in range(PROCESSES):
            ours.append(run_child(path, threads))
            theirs.append(peer_ffcv.run_child(beton, int(threads), EPOCHS))

    benchmark.group = f"first-epoch-ffcv-{ds.name}"
    benchmark.pedantic(side_by_side, rounds=1, warmup_rounds=0)
    ours_first = [r["epochs"][0] for r in ours]
    info: dict[str, float | str] = {  # the common figures: fastload's first epoch
        "threads": threads,
        "samples_per_s": statistics.median(f["samples_per_s"] for f in ours_first),
        "first_batch_s": statistics.median(f["first_batch_s"] for f in ours_first),
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ours),
        "cpu_s": statistics.median(f["cpu_s"] for f in ours_first),
        "ffcv_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in theirs),
        "ffcv_import_s": statistics.median(r["import_s"] for r in theirs),
    }
    info["mb_per_s"] = info["samples_per_s"] * ds.sample_bytes / 1e6  # type: ignore[operator]
    for name, runs in (("fastload", ours), ("ffcv", theirs)):
        firsts = [r["epochs"][0] for r in runs]
        assert all(f["samples"] == ds.count for f in firsts), name
        info[f"{name}_first_samples_per_s"] = statistics.median(f["samples_per_s"] for f in firsts)
        info[f"{name}_first_after_first_batch_samples_per_s"] = statistics.median(map(rate_after_first_batch, firsts))
        info[f"{name}_steady_samples_per_s"] = statistics.median(
            statistics.median(e["samples_per_s"] for e in r["epochs"][1:]) for r in runs)
        info[f"{name}_first_batch_s"] = statistics.median(f["first_batch_s"] for f in firsts)
    for figure in ("first_samples_per_s", "first_after_first_batch_samples_per_s", "steady_samples_per_s"):
        info[f"{figure.removesuffix('_samples_per_s')}_fastload_over_ffcv"] = \
            info[f"fastload_{figure}"] / info[f"ffcv_{figure}"]  # type: ignore[operator]
    benchmark.extra_info.update(info)


def _median_or_none(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


DROP_CACHES = Path("/proc/sys/vm/drop_caches")
COLD_CASES = [ds for ds in CASES if ds.name in ("small-raw", "tiles-raw")]


def drop_page_cache() -> None:
    """Write back dirty pages and drop the page cache; pytest.skip where that is not permitted."""
    if not DROP_CACHES.exists():
        pytest.skip("no /proc/sys/vm/drop_caches here (not Linux): the cold-cache figure needs it")
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as err:
        pytest.skip(f"cannot drop the page cache ({err}): the cold-cache figure needs root on Linux")


def sequential_read_mb_per_s(path: Path) -> float:
    """Read every file under ``path`` once, in order, in 8 MiB reads, from a cold page cache; return MB/s."""
    drop_page_cache()
    total, start = 0, time.perf_counter()
    for p in sorted(path.iterdir()):
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                total += len(chunk)
    return total / (time.perf_counter() - start) / 1e6


@pytest.mark.parametrize("ds", COLD_CASES if not QUICK else COLD_CASES[:1], ids=lambda d: d.name)
def test_first_epoch_cold(benchmark, ds):
    path = ensure(ds)
    disk = sequential_read_mb_per_s(path)
    runs: list[dict] = []

    def cold_run() -> None:
        drop_page_cache()
        runs.append(run_child(path, "2"))

    benchmark.group = f"first-epoch-cold-{ds.name}"
    benchmark.pedantic(lambda: [cold_run() for _ in range(PROCESSES)], rounds=1, warmup_rounds=0)
    firsts = [r["epochs"][0] for r in runs]
    samples_per_s = statistics.median(f["samples_per_s"] for f in firsts)
    file_bytes = sum(p.stat().st_size for p in path.iterdir())  # what the epoch reads from the disk, at most
    file_mb_per_s = statistics.median(file_bytes / f["seconds"] for f in firsts) / 1e6
    benchmark.extra_info.update({
        "samples_per_s": samples_per_s,
        "mb_per_s": samples_per_s * ds.sample_bytes / 1e6,
        "disk_sequential_mb_per_s": disk,
        "file_mb_per_s": file_mb_per_s,  # the dataset's files over the first epoch's seconds
        "first_over_disk": file_mb_per_s / disk,
        "first_batch_s": statistics.median(f["first_batch_s"] for f in firsts),
        "first_epoch_major_faults": statistics.median(f["major_faults"] for f in firsts),
        "steady_samples_per_s": statistics.median(
            statistics.median(e["samples_per_s"] for e in r["epochs"][1:]) for r in runs),
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "cpu_s": statistics.median(f["cpu_s"] for f in firsts),  # the whole child process, first epoch
        "threads": "2",
    })
    assert all(f["samples"] == ds.count for f in firsts)
