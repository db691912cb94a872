"""The order a conversion writes its samples in: the sources' own order, or a seeded shuffle across shards.

A dataset written one class after another (``preprocess_tiles --labels-from-dirs``) gives a window
of a few shards few classes, and ``shuffle_window=`` then feeds batches of few classes. The
shuffled order (the default of ``preprocess_tiles`` and ``write_dataset``) is a grouped shuffle
(``_write_groups.GroupedOrder``): the sources in a seeded random order, cut into groups of about
``GROUP_BYTES`` of decoded samples, each group permuted, so every shard holds samples of many
sources and each source is read about once.

The shards are planned by position (:func:`shuffled_job`): a writer asks for positions ``a:b``
and gets the sources and samples to read, so nothing holds the dataset to shuffle it, the output
is the same for any number of workers or Dask, and ``--resume`` continues at a position as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..sampling._order import ORDER_VERSION
from . import _write_groups
from ._picks import group_by_source
from ._sources import Source
from ._write_groups import GROUP_BYTES, WRITE_EPOCH, GroupedOrder, group_samples_for

__all__ = ["DEFAULT_ORDER", "GROUP_BYTES", "ORDERS", "READS_NOTE_FROM", "WRITE_EPOCH", "GroupedOrder", "check_order",
           "check_seed", "order_doc", "picks_of", "shuffled_job", "write_order"]

READS_NOTE_FROM = 4.0  # a shuffled write notes its reads of each source from this many on
ORDERS = ("shuffled", "source")
DEFAULT_ORDER = "shuffled"
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


def order_doc(order: str, seed: int, group_samples: int = 1) -> dict[str, Any]:
    """Return the manifest's ``order`` entry: how the dataset's positions map to the source order."""
    if order == "source":
        return {"kind": "source"}
    return {"kind": "shuffled", "seed": seed, "version": ORDER_VERSION, "epoch": WRITE_EPOCH,
            "group_bytes": _write_groups.GROUP_BYTES, "group_samples": group_samples}


def write_order(job: Any) -> GroupedOrder:
    """Return the shuffled order of ``job`` (a ``WriteJob`` of known sample counts) in groups of ``job``'s G.

    A job whose samples are read one by one (``job.sample_sources``: a map-style dataset) has a
    source per sample, so its groups are random samples of the whole dataset.
    """
    counts = job.tile_counts
    if counts is None or job.gather is None or job.gather_encode is None:
        raise ArgumentError("a shuffled write needs the sources' sample counts and a gather function")
    group = group_samples_for(sum(f.nbytes for f in job.settings.fields))
    total = int(sum(counts))
    return GroupedOrder(job.seed, None if job.sample_sources else counts, total, group)


def shuffled_job(job: Any, order: GroupedOrder) -> Any:
    """Return ``job`` (a ``WriteJob`` of known sample counts) as one source whose samples are in ``order``.

    Its pieces are positions ``first:stop`` of the dataset; ``job.gather(sources, samples)``
    turns the source-order samples there (as two int64 arrays, in position order) into the
    arguments of ``job.gather_encode``, which returns their records in that order. The driver's
    tasks are the groups of ``order`` (one that a resume starts inside runs from there to the
    group's end), so each reads every source of its group once; a job of one-sample sources
    (``job.sample_sources``) cuts a group into tasks of ``job.piece_samples`` (it reads nothing
    twice either way). A file that fails to decode cannot be skipped (its samples are spread over
    the shards, some perhaps written already): the run lists every such file and ends, as a
    source-order run without ``--skip-bad`` does.
    """
    total = order.n
    gather = job.gather
    step = order.group
    whole_samples = job.sample_sources
    if job.sample_sources and job.piece_samples:
        step = max(1, min(step, int(job.piece_samples)))

    def piece(source: int, first: int, stop: int) -> tuple:
        if source != 0 or not 0 <= first <= stop <= total:
            raise ArgumentError(f"a shuffled write has one source of {total} samples, not ({source}, {first}:{stop})")
        if whole_samples:  # the dataset is one source whose every sample is a source of the order
            return gather(np.zeros(stop - first, np.int64), order.samples(first, stop))
        sources, samples = order.locate(first, stop)
        return gather(sources, samples)

    def tasks(start: tuple[int, int]) -> Iterator[tuple[int, int, tuple]]:
        if start[0] > 0:  # every sample is written already
            return
        for a, b in order.spans(start[1]):
            for first in range(a, b, step):
                yield (0, first, piece(0, first, min(first + step, b)))

    name = job.sources[0].relpath if len(job.sources) == 1 else SHUFFLED_SOURCE  # e.g. write_dataset's dataset
    return dataclasses.replace(job, sources=[Source(name)], source_files=job.sources, tile_counts=[total], tasks=tasks,
                               encode=job.gather_encode, piece=piece, piece_samples=step, order="source",
                               gather=None, gather_encode=None, whole_sources=False, sample_sources=False)


def picks_of(listed: Sequence[Source], sources: np.ndarray, samples: np.ndarray) -> list[tuple]:
    """Return, per source touched, (the source, its index, its samples in increasing order, their slots in the task)."""
    groups = group_by_source(sources, samples)
    return [(listed[s], s, picked, slots) for s, picked, slots in groups]
