"""The first epoch of a fresh process against that process's steady state (issue 26).

Each configuration runs in a fresh subprocess (benchmarks/first_epoch_child.py): epochs 1 to 4,
page cache warm (the files were read by this process before). Recorded per configuration: the first
epoch's samples/s, the steady state (the median of epochs 2 to 4), their ratio (goal: at least 0.9),
the time to the first batch (goal on small records: at most 0.05 s), minor and major page faults of
the first epoch and of a steady one, and the consuming thread's CPU per batch (goal: at most 15 us at
batch 256). The median of 3 fresh processes is kept for each figure, with the spread (min, max) of
the ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATASETS
from datasets import QUICK, ensure

CHILD = Path(__file__).with_name("first_epoch_child.py")
CASES = [ds for ds in DATASETS if ds.name in ("small-raw", "small-zstd", "tiles-raw", "tiles-zstd")]
THREADS = ["1", "2", "auto"]
PROCESSES = 1 if QUICK else 3
EPOCHS = 2 if QUICK else 4


def run_child(path: Path, threads: str, prefetch: str = "auto") -> dict:
    threads_arg = "2" if threads == "auto" else threads  # num_threads="auto" is the CPU count: 2 here
    done = subprocess.run([sys.executable, str(CHILD), str(path), threads_arg, prefetch, str(EPOCHS)],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("ds", CASES, ids=lambda d: d.name)
def test_first_epoch(benchmark, ds, threads):
    path = ensure(ds)
    for p in path.iterdir():  # page cache warm: read once by another process than the measured one
        p.read_bytes()
    runs: list[dict] = []
    benchmark.group = f"first-epoch-{ds.name}"
    benchmark.pedantic(lambda: runs.extend(run_child(path, threads) for _ in range(PROCESSES)), rounds=1,
                       warmup_rounds=0)
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
        "import_s": statistics.median(r["import_s"] for r in runs),
        "cpu_s": statistics.median(f["cpu_s"] for f in firsts),  # the whole child process, first epoch
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "threads": threads,
    }
    info["mb_per_s"] = info["samples_per_s"] * ds.sample_bytes / 1e6
    benchmark.extra_info.update(info)
    assert all(f["samples"] == ds.count for f in firsts)
