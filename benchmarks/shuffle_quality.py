"""How well an epoch order mixes: the quality of ``shuffle_window=K`` beside the global shuffle.

Run alone: ``python benchmarks/shuffle_quality.py`` (prints the table of docs/ORDER.md, "Shard
windows"); ``benchmarks/test_sampling.py::test_shuffle_window_quality`` records the same figures.

The index space is ImageNet's shape: 1,281,167 samples, 1,000 classes, shards of 1,250 samples
(about 64 MB of 50 KB JPEGs), batches of 256. Two ways the shards can have been written:

- ``sorted``: class after class, as a converter walking one folder per class writes them
  (``preprocess_tiles --labels-from-dirs`` does): a shard holds one or two classes;
- ``mixed``: samples in random order before they were written: every shard holds every class.

Per batch: the distinct shards it reads, the distinct labels it holds, and the spread of its
original indices (their standard deviation over that of the whole index space: 1.0 for a uniform
draw, small when a batch comes from a few neighbouring shards). Medians over the epoch's batches.
Only order arithmetic: no file is read.
"""

from __future__ import annotations

import time

import numpy as np

from fastload.sampling._sampling import permutation_at
from fastload.sampling._windows import ShardWindowSampling

N, CLASSES, SHARD, BATCH = 1_281_167, 1000, 1250, 256
WINDOWS = [1, 2, 4, 8, 16, 64]


def labels_of(layout: str, n: int = N, classes: int = CLASSES) -> np.ndarray:
    """Return the label of every stored sample: class after class (``sorted``) or shuffled (``mixed``)."""
    sorted_labels = (np.arange(n, dtype=np.int64) * classes) // n
    if layout == "sorted":
        return sorted_labels
    return sorted_labels[np.random.default_rng(0).permutation(n)]


def order_of(window: int | None, n: int = N, shard: int = SHARD, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """Return an epoch's sample indices: the global v1 shuffle (``window=None``) or shard windows."""
    if window is None:
        return permutation_at(seed, epoch, n).astype(np.int64)
    sizes = [shard] * (n // shard) + ([n % shard] if n % shard else [])
    sampling = ShardWindowSampling(sizes, window)
    return sampling.epoch_order(seed, epoch, n, True).at(np.arange(n)).astype(np.int64)


def batch_mixing(order: np.ndarray, labels: np.ndarray, shard: int = SHARD, batch: int = BATCH) -> dict[str, float]:
    """Return the medians over full batches of distinct shards, distinct labels and index spread."""
    full = len(order) // batch
    indices = order[:full * batch].reshape(full, batch)
    shards = np.sort(indices // shard, axis=1)
    distinct_shards = 1 + (np.diff(shards, axis=1) != 0).sum(axis=1)
    held = np.sort(labels[indices], axis=1)
    distinct_labels = 1 + (np.diff(held, axis=1) != 0).sum(axis=1)
    spread = indices.std(axis=1) / (len(order) / np.sqrt(12))
    return {"shards": float(np.median(distinct_shards)), "labels": float(np.median(distinct_labels)),
            "spread": float(np.median(spread))}


def table() -> list[dict[str, object]]:
    """Return one row per configuration: window, order time, and the mixing of both layouts."""
    layouts = {layout: labels_of(layout) for layout in ("sorted", "mixed")}
    rows = []
    for window in [None, *WINDOWS]:
        start = time.perf_counter()
        order = order_of(window)
        seconds = time.perf_counter() - start
        assert np.array_equal(np.sort(order), np.arange(N))
        row: dict[str, object] = {"window": "global" if window is None else window, "order_s": seconds,
                                  "working_set_shards": -(-N // SHARD) if window is None else window}
        for layout, labels in layouts.items():
            for key, value in batch_mixing(order, labels).items():
                row[f"{layout}_{key}"] = value
        rows.append(row)
    return rows


def expected_distinct(k: int, draws: int = BATCH) -> float:
    """Return the expected number of distinct values among ``draws`` uniform draws from ``k`` (for reference)."""
    return k * (1 - (1 - 1 / k) ** draws)


def main() -> None:
    """Print the table in Markdown."""
    print(f"{N:,} samples, {CLASSES} classes, shards of {SHARD}, batch {BATCH}; medians over the batches")
    print("| order | shards in the working set | order per epoch | shards per batch | labels per batch, "
          "sorted shards | labels per batch, mixed shards | index spread |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in table():
        name = "global shuffle" if row["window"] == "global" else f"shuffle_window={row['window']}"
        print(f"| {name} | {row['working_set_shards']} | {row['order_s'] * 1e3:.0f} ms | {row['sorted_shards']:.0f} | "
              f"{row['sorted_labels']:.0f} | {row['mixed_labels']:.0f} | {row['sorted_spread']:.3f} |")
    print(f"uniform draws of {BATCH} among {CLASSES} labels: {expected_distinct(CLASSES):.0f} distinct expected")


if __name__ == "__main__":
    main()
