"""Shard boundaries planned before anything is encoded, so that tasks can write whole shards themselves.

The one-machine writer (``_dataset_writer``) fills shards as records arrive: a shard closes at
``samples`` records, or before the record that would take it past ``bytes``. When the sources' sample
counts are known and every record has one size (every field raw), that rule gives boundaries that
depend on counts alone, and :func:`plan_shards` computes them up front: the same shards, so the same
bytes, whoever writes them. So does a sample count whose records cannot reach the byte limit even at
their largest. Otherwise (a compressing codec and a byte limit that decides) a shard's end is known
only after encoding, and the boundaries cannot be planned (:func:`shard_capacity` is None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from ..format._record import Field, RecordEncoder

# A piece of a planned shard: (source index, first sample, stop) in that source.
Piece = tuple[int, int, int]


@dataclass(frozen=True)
class PlannedShard:
    """One shard of the plan: its index, the samples it holds (pieces of sources, in order), where the next starts."""

    index: int
    pieces: tuple[Piece, ...]
    next_source: int
    next_tile: int

    @property
    def count(self) -> int:
        """The number of records of the shard."""
        return sum(stop - first for _, first, stop in self.pieces)


def record_size(fields: Sequence[Field]) -> int | None:
    """Return the size in bytes of every record of ``fields`` when it is one size (every field raw), else None."""
    if any(f.codec != "raw" for f in fields):
        return None
    zeros = {f.name: np.zeros(f.shape, f.np_dtype) for f in fields}
    return len(RecordEncoder(fields).encode(zeros))


def record_bound(fields: Sequence[Field]) -> int:
    """Return a size no record of ``fields`` exceeds, whatever its samples (generous for the image codecs).

    zstd and lz4 never grow data by more than about 1/255 plus a frame header; a PNG stores at worst
    the pixels with a filter byte per row and chunk headers; a JPEG at worst about twice the pixels
    of its blocks padded to 16x16 plus 2 KB of headers (libjpeg-turbo's ``tjBufSize``).
    """
    raw = tuple(Field(f.name, f.dtype, f.shape) for f in fields)
    size = record_size(raw)
    assert size is not None
    for f in fields:
        if f.codec in ("zstd", "zstd-shuffle", "lz4", "lz4-shuffle"):
            size += f.nbytes // 128 + 1024
        elif f.codec in ("png", "jpeg"):
            size += 7 * f.nbytes + (64 << 10)
    return size


def shard_capacity(samples: int | None, max_bytes: int | None, fields: Sequence[Field]) -> int | None:
    """Return how many records every shard holds (the last may hold fewer), or None when sizes decide.

    The writer's rule: a shard closes at ``samples`` records, or before the record that would take its
    records past ``max_bytes`` (a shard holds at least one record). With records of one size the byte
    limit is a record count; with compressed records it is one only when it cannot be reached before
    ``samples`` (:func:`record_bound`): then the count decides alone.
    """
    by_bytes = None
    if max_bytes:
        exact = record_size(fields)
        if exact is not None:
            by_bytes = max(1, max_bytes // exact)
        elif not (samples and samples * record_bound(fields) <= max_bytes):
            return None
    limits = [n for n in (samples, by_bytes) if n]
    return min(limits) if limits else None


def plan_shards(counts: Sequence[int], start: tuple[int, int], first_index: int, capacity: int) -> list[PlannedShard]:
    """Return the shards that hold every sample from ``start`` (source, sample) on, ``capacity`` records each.

    ``counts``: the samples of each source (0 for a source skipped). The first shard gets index
    ``first_index``; the last holds what is left. Each shard's ``next_source, next_tile`` is the
    position after its last record, as the writer's journal records it.
    """
    if capacity < 1:
        raise ArgumentError(f"a shard holds at least one record, not {capacity}")
    shards: list[PlannedShard] = []
    pieces: list[Piece] = []
    filled = 0
    source, tile = start
    while source < len(counts):
        if tile >= counts[source]:
            source, tile = source + 1, 0
            continue
        take = min(counts[source] - tile, capacity - filled)
        pieces.append((source, tile, tile + take))
        filled += take
        tile += take
        if filled == capacity:
            after = (source + 1, 0) if tile == counts[source] else (source, tile)
            shards.append(PlannedShard(first_index + len(shards), tuple(pieces), *after))
            pieces, filled = [], 0
    if pieces:
        shards.append(PlannedShard(first_index + len(shards), tuple(pieces), len(counts), 0))
    return shards
