"""Compare two installs of fastload side by side: the same epochs, alternating, in fresh processes.

    python benchmarks/compare_installs.py --before /tmp/before-site [--after ''] [--rounds 5]

``--before`` / ``--after`` are directories put first on PYTHONPATH (an empty string: the installed
fastload), for example one made by ``pip install --target DIR --no-deps .`` at an older commit. Each
round runs every configuration once per install, in alternating order, each in a fresh process that
builds the loader (timed), runs 1 + 5 epochs and reports the median of the last 5 (steady state).
Printed: per configuration, the median over rounds of each install and after/before with the spread.

``--first-epoch`` compares first epochs instead (issue 26): each fresh process is
``first_epoch_child.py`` (epochs 1 to 4, ``prefetch="auto"``), at 1 and 2 threads, iterating the moment the
loader is built or, with ``--setup-s S``, after S seconds of sleep (a model built meanwhile); printed per install,
the median first / steady ratio with its spread, the first epoch's samples/s and the process's CPU
seconds in it (on a virtual machine, first touches of fresh memory show there).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
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


FIRST_EPOCH_CONFIGS = [(name, "native", threads) for name in ("small-raw", "small-zstd", "tiles-raw", "tiles-zstd")
                       for threads in (1, 2)]
FIRST_EPOCH_CHILD = Path(__file__).with_name("first_epoch_child.py")


def site_env(site: str) -> dict[str, str]:
    """Return the environment of a child that imports the install at ``site`` ('' : the installed fastload)."""
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site
    else:
        env.pop("PYTHONPATH", None)
    return env


def run(site: str, path: Path, backend: str, workers: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), backend, str(workers)], env=site_env(site),
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def run_first_epoch(site: str, path: Path, backend: str, threads: int, setup_s: float = 0.0) -> dict:
    """One fresh process of ``first_epoch_child.py``: its first epoch against its steady state."""
    done = subprocess.run([sys.executable, str(FIRST_EPOCH_CHILD), str(path), str(threads), "auto", "4", str(setup_s)],
                          env=site_env(site), capture_output=True, text=True, timeout=600, check=True)
    epochs = json.loads(done.stdout)["epochs"]
    steady = statistics.median(e["samples_per_s"] for e in epochs[1:])
    first = epochs[0]
    return {"ratio": first["samples_per_s"] / steady, "first": first["samples_per_s"], "steady": steady,
            "cpu_s": first["cpu_s"], "first_batch_s": first["first_batch_s"]}


def print_first_epochs(results: dict[tuple, dict[str, list[dict]]]) -> None:
    """Print, per configuration and install, the first / steady ratio (median, spread), first epoch and CPU."""
    print(f"{'configuration':28s} {'install':7s} {'first/steady':>12s} {'spread':>11s} {'first /s':>11s} "
          f"{'steady /s':>11s} {'CPU s':>6s} {'first batch':>11s}")
    for (name, _backend, threads), by in results.items():
        for label in ("before", "after"):
            rows = by[label]
            ratios = sorted(x["ratio"] for x in rows)
            print(f"{f'{name} {threads} thread(s)':28s} {label:7s} {statistics.median(ratios):12.2f} "
                  f"{f'{ratios[0]:.2f}-{ratios[-1]:.2f}':>11s} {statistics.median(x['first'] for x in rows):11,.0f} "
                  f"{statistics.median(x['steady'] for x in rows):11,.0f} "
                  f"{statistics.median(x['cpu_s'] for x in rows):6.2f} "
                  f"{1e3 * statistics.median(x['first_batch_s'] for x in rows):9.1f}ms")


def main() -> None:
    """Run the comparison and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="run only configurations whose name contains this")
    parser.add_argument("--first-epoch", action="store_true", help="compare first epochs against steady state")
    parser.add_argument("--setup-s", type=float, default=0.0,
                        help="with --first-epoch: seconds between building the loader and iterating it")
    args = parser.parse_args()
    if not (math.isfinite(args.setup_s) and args.setup_s >= 0):
        parser.error(f"--setup-s must be a finite number of seconds, at least 0, not {args.setup_s}")
    if args.setup_s and not args.first_epoch:
        parser.error("--setup-s applies to --first-epoch only")
    configs, runner = ((FIRST_EPOCH_CONFIGS, functools.partial(run_first_epoch, setup_s=args.setup_s))
                       if args.first_epoch else (CONFIGS, run))
    datasets = {d.name: d for d in all_datasets()}
    results: dict[tuple, dict[str, list[dict]]] = {}
    for r in range(args.rounds):
        for name, backend, workers in configs:
            if name not in datasets or args.only not in f"{name} {backend} {workers}":
                continue
            path = ensure(datasets[name])
            order = [("before", args.before), ("after", args.after)]
            for label, site in (order if r % 2 == 0 else order[::-1]):
                results.setdefault((name, backend, workers), {}).setdefault(label, []).append(
                    runner(site, path, backend, workers))
    if args.first_epoch:
        print_first_epochs(results)
        return
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
