"""One configuration in a fresh process: epochs 1 to N of a ShardLoader, as JSON on stdout.

Run by benchmarks/test_first_epoch.py (``python first_epoch_child.py PATH THREADS PREFETCH EPOCHS [SETUP_S
[WARM_UP]]``: SETUP_S seconds of sleep between building the loader and its first epoch, where a training script
builds its model (default 0); WARM_UP 0 builds it with ``warm_up=False``).
For each epoch: samples/s, time to the first batch, minor and major page faults of the process
(getrusage), and the consuming thread's CPU time per batch (``time.thread_time``: the Python work
the user's loop pays for each batch, not the reader threads'), how often that thread blocked per batch
(its voluntary context switches, from /proc on Linux; None elsewhere), the process's CPU seconds, and its
peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def context_switches() -> int | None:
    """Return this thread's voluntary context switches (it blocked) so far, or None where /proc does not say."""
    try:
        status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split(":")[1])
    return None


def measure_epochs(epochs: int, batches_of: Callable[[int], Iterable[Any]],
                   size_of: Callable[[Any], int]) -> list[dict]:
    """Iterate ``batches_of(epoch)`` for each epoch and return its row: rates, first batch, faults, consumer CPU.

    ``size_of(batch)`` is the batch's sample count. Shared with the peers' children (``peer_ffcv.py``), so each
    loader is timed by the same loop.
    """
    rows = []
    for epoch in range(epochs):
        before = resource.getrusage(resource.RUSAGE_SELF)
        switches0 = context_switches()
        cpu0 = time.thread_time()
        start = time.perf_counter()
        first = None
        samples = batches = 0
        for batch in batches_of(epoch):
            if first is None:
                first = time.perf_counter() - start
            samples += size_of(batch)
            batches += 1
        seconds = time.perf_counter() - start
        cpu = time.thread_time() - cpu0
        switches1 = context_switches()
        after = resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"samples_per_s": samples / seconds, "seconds": seconds, "first_batch_s": first,
                     "minor_faults": after.ru_minflt - before.ru_minflt,
                     "major_faults": after.ru_majflt - before.ru_majflt,
                     "consumer_cpu_us_per_batch": 1e6 * cpu / max(batches, 1), "samples": samples,
                     "consumer_blocks_per_batch": None if switches0 is None or switches1 is None
                     else (switches1 - switches0) / max(batches, 1),
                     "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)})
    return rows


def peak_rss_mb() -> float:
    """Return this process's peak resident memory in MB (getrusage: kilobytes on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    path, threads, prefetch, epochs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    setup_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    warm_up = sys.argv[6] != "0" if len(sys.argv) > 6 else True
    started = time.perf_counter()
    import fastload  # the import is part of what a fresh process pays, reported apart

    imported = time.perf_counter() - started
    loader = fastload.ShardLoader(path, batch_size=256, shuffle=True, seed=0, num_threads=threads, backend="native",
                                  prefetch=prefetch if prefetch == "auto" else int(prefetch), warm_up=warm_up)
    time.sleep(setup_s)  # the model, optimizer and process group a training script builds meanwhile

    def batches_of(epoch: int) -> Any:
        loader.set_epoch(epoch)
        return loader

    rows = measure_epochs(epochs, batches_of, lambda batch: len(batch["label"]))
    print(json.dumps({"import_s": imported, "peak_rss_mb": peak_rss_mb(), "epochs": rows,
                      "warm_up_s": loader.stats().get("warm_up_s")}))


if __name__ == "__main__":
    main()
