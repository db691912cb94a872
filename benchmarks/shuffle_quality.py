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

:func:`class_mixing` measures the same end to end, on files (issue 42): ten class folders
converted by ``preprocess_tiles --labels-from-dirs`` in both write orders (``--order source``:
class after class; ``--order shuffled``, the default), 25 shards, read by ``ShardLoader`` with
the global shuffle and with ``shuffle_window=4``: the distinct labels per batch, the classes a
window holds by the manifest's ``shard_labels`` (what the loader's warning reports), and whether
the loader warned. ``python benchmarks/shuffle_quality.py --classes`` prints it.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import fastload
from fastload.conversion.preprocess import main as preprocess_main
from fastload.errors import FastloadWarning
from fastload.format._manifest import load_manifest, shard_label_sets
from fastload.sampling._class_mix import window_coverage
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


# The class-mixing run: class folders, images per class, samples per shard, batch, shuffle_window (issue 42's case).
MIX_CLASSES, MIX_PER_CLASS, MIX_SHARD, MIX_BATCH, MIX_WINDOW = 10, 250, 100, 64, 4


def class_folders(root: Path, classes: int = MIX_CLASSES, per_class: int = MIX_PER_CLASS) -> Path:
    """Write ``classes`` folders of ``per_class`` 8x8 RGB PNG images under ``root`` and return it."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c:02d}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / f"class{c:02d}" / f"{i}.png")
    return root


def class_mixing(workdir: Path | None = None) -> list[dict[str, object]]:
    """Return, per write order and epoch order, the class mixing of batches read from a converted class-folder set.

    Keys: ``order`` (the write order), ``read`` (``global`` or ``window=K``), ``labels_median`` and
    ``labels_mean`` (distinct labels per batch), ``window_classes`` (the expected classes of a window by
    ``shard_labels``; None for the global shuffle), ``warned`` (the loader's FastloadWarning), ``convert_s``.
    """
    with tempfile.TemporaryDirectory(prefix="fastload-class-mixing-", dir=workdir) as tmp:
        data = class_folders(Path(tmp) / "data")
        rows: list[dict[str, object]] = []
        for order in ("source", "shuffled"):
            out = Path(tmp) / order
            start = time.perf_counter()
            assert preprocess_main(["--data-dir", str(data), "--output-dir", str(out), "--labels-from-dirs",
                                    "--samples-per-shard", str(MIX_SHARD), "--order", order, "--no-progress"]) == 0
            convert_s = time.perf_counter() - start
            labels = shard_label_sets(load_manifest(out))
            assert labels is not None
            for window in (None, MIX_WINDOW):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    loader = fastload.ShardLoader(str(out), batch_size=MIX_BATCH, shuffle=True, seed=0,
                                                  shuffle_window=window, drop_last=True)
                distinct = [len(np.unique(batch["label"].numpy())) for batch in loader]
                rows.append({"order": order, "read": "global" if window is None else f"window={window}",
                             "labels_median": float(np.median(distinct)), "labels_mean": float(np.mean(distinct)),
                             "window_classes": None if window is None else window_coverage(labels[1], window),
                             "warned": any(issubclass(w.category, FastloadWarning) for w in caught),
                             "convert_s": convert_s})
    return rows


def print_class_mixing(rows: list[dict[str, object]]) -> None:
    """Print :func:`class_mixing`'s rows in Markdown."""
    shards = MIX_CLASSES * MIX_PER_CLASS // MIX_SHARD
    print(f"{MIX_CLASSES} class folders of {MIX_PER_CLASS} images, {shards} shards of {MIX_SHARD}, batch {MIX_BATCH}; "
          f"uniform draws: {expected_distinct(MIX_CLASSES, MIX_BATCH):.1f} distinct labels expected")
    print("| written | read | labels per batch (median) | (mean) | classes in a window (shard_labels) | warned |")
    print("|---|---|---:|---:|---:|---|")
    for row in rows:
        window = "" if row["window_classes"] is None else f"{row['window_classes']:.1f}"
        print(f"| --order {row['order']} | {row['read']} | {row['labels_median']:.0f} | {row['labels_mean']:.2f} | "
              f"{window} | {'yes' if row['warned'] else 'no'} |")


def main() -> None:
    """Print the table in Markdown (with ``--classes``: the class-mixing table of converted datasets)."""
    if "--classes" in sys.argv[1:]:
        print_class_mixing(class_mixing())
        return
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
