"""Samples/s for 1..16 threads, best of 3 epochs each, pin_memory False and True; small and tiles."""
import sys
import time

import fastload

root = sys.argv[1]
tag = fastload.__file__.split('/')[2]
for name in ("small", "tiles"):
    for pin in (False, True):
        row = []
        for threads in (1, 2, 4, 8, 16):
            loader = fastload.ShardLoader(f"{root}/{name}", batch_size=256, shuffle=True, seed=1,
                                          num_threads=threads, pin_memory=pin)
            best = 0.0
            for _ in range(3):
                t0, n = time.perf_counter(), 0
                for b in loader:
                    n += len(b["label"])
                best = max(best, n / (time.perf_counter() - t0))
            row.append(best)
        print(f"{tag:4s} {name:5s} pin={pin!s:5s} " + " ".join(f"{r/1e6:7.3f}M" for r in row), flush=True)
