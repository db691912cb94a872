"""A fresh process's first epochs for benchmarks/test_bytes.py, counting the loader's construction too, as JSON.

``python bytes_epoch_helper.py PATH THREADS EPOCHS [WARM_UP]``: builds a ``ShardLoader`` (native, shuffled,
seed 0, batch 256, ``THREADS`` threads, ``warm_up=True`` unless WARM_UP is 0, its defaults otherwise)
and iterates ``EPOCHS`` epochs at once, timed as benchmarks/first_epoch_child.py times them (``measure_epochs``). Also
reported: ``import_s`` (fastload and torch, before the clock starts) and ``build_s``, the
constructor's seconds. The constructor opens and checks every shard (a format 4 shard's block
headers and indexes) and its warm-up maps the shards' pages, which reads files that are out of the
page cache there, before the first epoch: ``build_s`` plus the first epoch's seconds is what a fresh
process pays, after its imports, before its first epoch is done. ``peak_rss_mb`` is this process's
own high-water mark (``VmHWM``: ``getrusage`` would report the parent's if that was higher when it
forked this process).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from first_epoch_child import measure_epochs, peak_rss_mb  # noqa: E402


def own_peak_rss_mb() -> float:
    """Return this process's peak resident memory in MB: VmHWM on Linux, getrusage's elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak_rss_mb()


def main() -> None:
    path, threads, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    warm_up = sys.argv[4] != "0" if len(sys.argv) > 4 else True
    started = time.perf_counter()
    import torch  # noqa: F401  (imported before the clock starts: the loader's module imports it)

    from fastload import ShardLoader

    imported = time.perf_counter()
    loader = ShardLoader(path, batch_size=256, shuffle=True, seed=0, num_threads=threads, backend="native",
                         warm_up=warm_up)
    built = time.perf_counter()

    def batches_of(epoch: int) -> ShardLoader:
        loader.set_epoch(epoch)
        return loader

    rows = measure_epochs(epochs, batches_of, lambda batch: len(batch["label"]))
    print(json.dumps({"import_s": imported - started, "build_s": built - imported, "epochs": rows,
                      "peak_rss_mb": own_peak_rss_mb()}))


if __name__ == "__main__":
    main()
