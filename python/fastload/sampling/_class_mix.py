"""How many classes a window of shards holds, and the warning when ``shuffle_window`` meets shards sorted by label.

``shuffle_window=K`` shuffles within windows of ``K`` shards (``_windows``): a batch holds only the
classes of its window. A dataset written one class after another (``preprocess_tiles
--order source --labels-from-dirs``) then gives batches of few classes, and training suffers
(issue 42: validation accuracy 0.50 against 1.00 with a global shuffle). The writers record
each shard's label set (the manifest's ``shard_labels``); from it :func:`window_coverage` gives
the expected number of classes in a window of ``K`` shards drawn at random (the windows of an
epoch are consecutive groups of a random permutation of the shards), exactly, without reading a
shard. :func:`shuffled_coverage` gives what a window of as many samples of a dataset written in a
random order would hold. The loader warns when the first is far below the second.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from ..errors import FastloadWarning

# Warn when a window holds fewer than this fraction of the classes a window of a randomly ordered dataset would.
SORTED_FRACTION = 0.75


def window_coverage(masks: Sequence[int], window: int) -> float:
    """Return the expected number of distinct labels in ``window`` shards drawn without replacement from ``masks``.

    ``masks``: per shard, the set of labels it holds as a bit mask. For a label held by ``c`` of
    ``S`` shards, a window misses it with probability ``C(S - c, K) / C(S, K)``.
    """
    shards = len(masks)
    k = min(int(window), shards)
    if shards == 0 or k <= 0:
        return 0.0
    held: dict[int, int] = {}
    for mask in masks:
        label = 0
        while mask:
            if mask & 1:
                held[label] = held.get(label, 0) + 1
            mask >>= 1
            label += 1
    total = 0.0
    for c in held.values():
        miss = 1.0
        for i in range(k):  # C(S - c, k) / C(S, k) as a product; 0 once S - c < k
            if shards - c - i <= 0:
                miss = 0.0
                break
            miss *= (shards - c - i) / (shards - i)
        total += 1.0 - miss
    return total


def shuffled_coverage(counts: Sequence[int], samples: float) -> float:
    """Return the expected number of distinct labels among ``samples`` random samples (label ``i``: ``counts[i]``)."""
    n = sum(counts)
    if n <= 0 or samples <= 0:
        return 0.0
    return sum(1.0 - (1.0 - c / n) ** samples for c in counts if c)


def warn_if_sorted(counts: Sequence[int], masks: Sequence[int], shard_sizes: Sequence[int], window: int,
                   stacklevel: int = 2) -> float | None:
    """Warn (FastloadWarning) when windows of ``window`` shards hold far fewer classes than a random order would.

    Return the expected classes of a window (None when there is nothing to measure: fewer than
    two classes, or every shard in one window). The message gives the measure and the remedies.
    """
    classes = sum(1 for c in counts if c)
    shards = len(masks)
    if classes < 2 or shards == 0 or window >= shards or len(shard_sizes) != shards:
        return None
    coverage = window_coverage(masks, window)
    expected = shuffled_coverage(counts, window * sum(shard_sizes) / shards)
    if coverage < SORTED_FRACTION * expected:
        warnings.warn(f"shuffle_window={window}: a window of {window} of {shards} shards holds on average "
                      f"{coverage:.1f} of the dataset's {classes} classes, where {expected:.1f} would be expected "
                      "of a dataset written in a random order: its shards are sorted by label, and batches will "
                      "hold few classes; write the dataset with order='shuffled' (preprocess_tiles --order "
                      "shuffled, the default) or raise shuffle_window", FastloadWarning, stacklevel=stacklevel + 1)
    return coverage
