"""Compare two installs of fastload side by side: the same epochs, alternating, in fresh processes.

    python benchmarks/compare_installs.py --before /tmp/before-site [--after ''] [--rounds 5]

``--before`` / ``--after`` are directories put first on PYTHONPATH (an empty string: the installed
fastload), for example one made by ``pip install --target DIR --no-deps .`` at an older commit. Each
round runs every configuration once per install, in alternating order, each in a fresh process that
builds the loader (timed), runs 1 + 5 epochs and reports the median of the last 5 (steady state).
Printed: per configuration, the median over rounds of each install and after/before with the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from datasets import all_datasets, ensure  # noqa: E402

CHILD = r"""
import json, statistics, sys, time
import fastload
path, backend, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
kwargs = {"num_threads": workers} if backend == "native" else {"num_workers": workers}
loader = fastload.ShardLoader(path, batch_size=256, shuffle=True, seed=0, backend=backend, **kwargs)
built = time.perf_counter() - start
rates = []
for epoch in range(6):
    loader.set_epoch(epoch)
    t = time.perf_counter()
    n = sum(len(b["label"]) for b in loader)
    rates.append(n / (time.perf_counter() - t))
print(json.dumps({"built_s": built, "steady": statistics.median(rates[1:]), "file": fastload.__file__}))
"""

CONFIGS = [("small-raw", "native", 2), ("tiles-raw", "native", 2), ("tiles-zstd", "native", 2),
           ("multispectral-zstd-shuffle", "native", 2), ("small-raw", "torch", 2)]


def run(site: str, path: Path, backend: str, workers: int) -> dict:
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site
    else:
        env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), backend, str(workers)], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def main() -> None:
    """Run the comparison and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="run only configurations whose name contains this")
    args = parser.parse_args()
    datasets = {d.name: d for d in all_datasets()}
    results: dict[tuple, dict[str, list[dict]]] = {}
    for r in range(args.rounds):
        for name, backend, workers in CONFIGS:
            if name not in datasets or args.only not in f"{name} {backend} {workers}":
                continue
            path = ensure(datasets[name])
            order = [("before", args.before), ("after", args.after)]
            for label, site in (order if r % 2 == 0 else order[::-1]):
                results.setdefault((name, backend, workers), {}).setdefault(label, []).append(
                    run(site, path, backend, workers))
    print(f"{'configuration':40s} {'before /s':>12s} {'after /s':>12s} {'after/before':>12s} {'spread':>14s} "
          f"{'build before':>12s} {'build after':>12s}")
    for (name, backend, workers), by in results.items():
        b = [x["steady"] for x in by["before"]]
        a = [x["steady"] for x in by["after"]]
        ratios = [x / y for x, y in zip(a, b)]
        print(f"{f'{name} {backend} {workers}':40s} {statistics.median(b):12,.0f} {statistics.median(a):12,.0f} "
              f"{statistics.median(ratios):12.3f} {f'{min(ratios):.2f}-{max(ratios):.2f}':>14s} "
              f"{statistics.median(x['built_s'] for x in by['before']):12.4f} "
              f"{statistics.median(x['built_s'] for x in by['after']):12.4f}")


if __name__ == "__main__":
    main()
