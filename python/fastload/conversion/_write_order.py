"""The order a conversion writes its samples in: the sources' own order, or a seeded shuffle across shards.

A dataset written one class after another (``preprocess_tiles --labels-from-dirs``) gives a window
of a few shards few classes, and ``shuffle_window=`` then feeds batches of few classes. The
shuffled order (the default of ``preprocess_tiles`` and ``write_dataset``) writes sample
``write_permutation(seed, n).at(p)`` of the source order (sources one after another, each
source's samples in its own order) at position ``p`` of the dataset, so every shard holds
samples spread over the whole input.

The permutation is the epoch order of docs/ORDER.md (version 1) with the seed and the epoch
``WRITE_EPOCH``, which no loader reaches: a pure function of ``(seed, n)``, the same on every
platform and numpy release, that needs no memory and is evaluated at any position. The shards are
planned by position (:func:`shuffled_job`): a writer asks for positions ``a:b`` and gets the
sources and samples to read, so nothing holds the dataset to shuffle it, the output is the same
for any number of workers or Dask, and ``--resume`` continues at a position as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..sampling._order import ORDER_VERSION, EpochOrder
from ._picks import group_by_source
from ._sources import Source

READS_NOTE_FROM = 4.0  # a shuffled write notes its reads of each source from this many on
ORDERS = ("shuffled", "source")
DEFAULT_ORDER = "shuffled"
WRITE_EPOCH = 0x5752495445  # "WRITE": the epoch of the permutation (a loader never runs this many epochs)
# The samples each encode task of a shuffled write covers when the driver writes the shards, in decoded bytes:
# a task reads each source it touches once, so larger tasks read tiled sources fewer times.
SHUFFLED_TASK_BYTES = 32 << 20
SHUFFLED_SOURCE = "(the sources in a shuffled order)"  # the one source of a shuffled job, in messages


def check_order(order: Any, what: str = "order") -> str:
    """Return ``order`` when it is one of ``ORDERS``; ArgumentError quoting it otherwise."""
    if not isinstance(order, str) or order not in ORDERS:
        raise ArgumentError(f"{what} must be one of {list(ORDERS)}, not {order!r}")
    return order


def check_seed(seed: Any) -> int:
    """Return ``seed`` when it is an integer in [-2**63, 2**64); ArgumentError quoting it otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not -(2**63) <= seed < 2**64:
        raise ArgumentError(f"seed must be an integer in [-2**63, 2**64), not {seed!r}")
    return int(seed)


def write_permutation(seed: int, n: int) -> EpochOrder:
    """Return the permutation of a shuffled write of ``n`` samples: position p holds source-order sample ``.at(p)``."""
    return EpochOrder(check_seed(seed), WRITE_EPOCH, n)


def source_reads(counts: Sequence[int], task_samples: int) -> float:
    """Return about how many times a shuffled write reads each source (1.0: once, as the source order does).

    A task of ``m`` random positions reads each source it touches once: a source of ``c`` of the
    ``n`` samples is touched by a task with probability ``1 - (1 - c/n)**m``.
    """
    n = sum(counts)
    used = sum(1 for c in counts if c)
    if n == 0 or used == 0:
        return 1.0
    m = max(1, min(int(task_samples), n))
    tasks = -(-n // m)
    return tasks * sum(1.0 - (1.0 - c / n) ** m for c in counts if c) / used


def order_doc(order: str, seed: int) -> dict[str, Any]:
    """Return the manifest's ``order`` entry: how the dataset's positions map to the source order."""
    if order == "source":
        return {"kind": "source"}
    return {"kind": "shuffled", "seed": seed, "version": ORDER_VERSION, "epoch": WRITE_EPOCH}


def locate(prefix: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (source, sample within it) of source-order samples, ``prefix`` being the sources' first samples + total.

    A source of no samples is never returned (the last source whose first sample is at most the
    sample's index holds it).
    """
    source = np.searchsorted(prefix, samples, side="right") - 1
    return source, samples - prefix[source]


def shuffled_job(job: Any, task_samples: int) -> Any:
    """Return ``job`` (a ``WriteJob`` of known sample counts) as one source whose samples are in the shuffled order.

    Its pieces are positions ``first:stop`` of the dataset; ``job.gather(sources, samples)``
    turns the source-order samples there (as two int64 arrays, in position order) into the
    arguments of ``job.gather_encode``, which returns their records in that order. The driver's
    tasks cover ``task_samples`` positions each. A file that fails to decode cannot be skipped (its
    samples are spread over the shards, some perhaps written already): the run lists every such
    file and ends, as a source-order run without ``--skip-bad`` does.
    """
    counts = job.tile_counts
    if counts is None or job.gather is None or job.gather_encode is None:
        raise ArgumentError("a shuffled write needs the sources' sample counts and a gather function")
    prefix = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)
    total = int(prefix[-1])
    permutation = write_permutation(job.seed, total)
    gather = job.gather
    step = max(1, int(task_samples))

    def piece(source: int, first: int, stop: int) -> tuple:
        if source != 0 or not 0 <= first <= stop <= total:
            raise ArgumentError(f"a shuffled write has one source of {total} samples, not ({source}, {first}:{stop})")
        sources, samples = locate(prefix, permutation.positions(first, stop).astype(np.int64))
        return gather(sources, samples)

    def tasks(start: tuple[int, int]) -> Iterator[tuple[int, int, tuple]]:
        if start[0] > 0:  # every sample is written already
            return
        for a in range(start[1], total, step):
            yield (0, a, piece(0, a, min(a + step, total)))

    name = job.sources[0].relpath if len(job.sources) == 1 else SHUFFLED_SOURCE  # e.g. write_dataset's dataset
    return dataclasses.replace(job, sources=[Source(name)], tile_counts=[total], tasks=tasks,
                               encode=job.gather_encode, piece=piece, piece_samples=step, order="source",
                               gather=None, gather_encode=None, whole_sources=False)


def picks_of(listed: Sequence[Source], sources: np.ndarray, samples: np.ndarray) -> list[tuple]:
    """Return, per source touched, (its path, its label, its samples in increasing order, their slots in the task)."""
    groups = group_by_source(sources, samples)
    return [(listed[s].relpath, listed[s].label, picked, slots) for s, picked, slots in groups]
