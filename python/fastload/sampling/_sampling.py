"""Sampling policies: which global sample index sits at each position of an epoch (docs/ORDER.md, "Sampling").

Each policy maps ``(seed, epoch)`` to an *epoch order*: an object with ``n``
(the positions of the epoch) and ``at(positions)`` (their sample indices,
uint64), like :class:`~fastload._order.EpochOrder`, which is the plain
policy. The epoch plan (``_plan.py``) splits the positions across ranks and
batches, so resuming, elastic resume and ``len()`` work the same for every
policy. Orders other than the plain one compute their epoch's index list
once, on first use (O(epoch length) memory), which costs less per batch than
evaluating positions one batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Union

import numpy as np
import xxhash

from ..errors import ArgumentError
from ._alias import (
    SAMPLING_VERSION,
    TAG_KEYS,
    TAG_MIX,
    TAG_SOURCE,
    TAG_WEIGHTS,
    AliasTable,
    quantize,
    stream_base,
    word,
    words,
)
from ._exactlog import exponential_keys
from ._order import EpochOrder

Stop = Union[str, int]
STOP_MODES = ("first_exhausted", "all_exhausted")
MAX_EPOCH_POSITIONS = 1 << 31  # a computed epoch order (weights, mixtures) holds 8 bytes per position: 16 GiB


class IndexOrder(Protocol):
    """What the plan and the backends need of an epoch order: its length and the indices at positions."""

    n: int

    def at(self, pos: np.ndarray) -> np.ndarray:
        """Return the sample indices at the given positions (uint64)."""
        ...


def permutation_at(seed: int, epoch: int, n: int, positions: np.ndarray | None = None) -> np.ndarray:
    """Return the v1 order of ``(seed, epoch, n)`` at ``positions`` (all when None), uint64.

    Uses the C++ twin when it is built (the same values, tested against the
    same vectors, faster), else the numpy one.
    """
    seed = int(seed) & (2**64 - 1)
    from .._extension import native as _native

    if _native is None:
        order = EpochOrder(seed, epoch, n)
        return order.positions(0, n) if positions is None else order.at(positions)
    if positions is None:
        return np.asarray(_native.permutation(seed, epoch, n, 0, n))
    return np.asarray(_native.permutation_at(seed, epoch, n, np.ascontiguousarray(positions, dtype=np.uint64)))


def digest(array: np.ndarray) -> str:
    """Return a short hash of an array's dtype, shape and bytes (to recognise a configuration in a state)."""
    a = np.ascontiguousarray(array)
    return xxhash.xxh3_64(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


def smallest_keys(keys: np.ndarray, m: int) -> np.ndarray:
    """Return the positions of the ``m`` smallest non-negative keys, in increasing order, ties by position.

    A non-negative double's bit pattern orders like its value, so the keys are
    sorted as uint64; a fast unstable sort is used unless two keys are equal,
    which then falls back to a stable sort (the result is the same either way).
    """
    bits = keys.view(np.uint64)
    order = np.argsort(bits)
    ranked = bits[order]
    if len(ranked) > 1 and bool((ranked[1:] == ranked[:-1]).any()):
        order = np.argsort(bits, kind="stable")
    return order[:m]


class ArrayOrder:
    """An epoch order whose index list is computed on first use."""

    def __init__(self, n: int, compute: Callable[[], np.ndarray]) -> None:
        self.n = int(n)
        self._compute: Callable[[], np.ndarray] | None = compute
        self._indices: np.ndarray | None = None

    def indices(self) -> np.ndarray:
        """Return the sample index at every position of the epoch (uint64)."""
        if self._indices is None:
            assert self._compute is not None
            self._indices = np.ascontiguousarray(self._compute(), dtype=np.uint64)
            self._compute = None
            if len(self._indices) != self.n:
                raise AssertionError(f"an epoch of {self.n} positions computed {len(self._indices)} indices")
        return self._indices

    def at(self, pos: np.ndarray) -> np.ndarray:
        """Return the sample indices at the given positions (each < n) as a uint64 array."""
        pos = np.asarray(pos, dtype=np.int64)
        if pos.size and (int(pos.max()) >= self.n or int(pos.min()) < 0):
            raise ArgumentError(f"position outside [0, {self.n})")
        return self.indices()[pos]


class Sampling:
    """The plain policy: every sample once per epoch, in the v1 order (shuffled or not)."""

    mode = "plain"

    def epoch_order(self, seed: int, epoch: int, n: int, shuffle: bool) -> EpochOrder | ArrayOrder:
        """Return the order of ``epoch`` over a dataset of ``n`` samples."""
        return EpochOrder(seed, epoch, n, shuffle)

    def describe(self) -> dict[str, Any] | None:
        """Return what a saved state records to recognise this policy (None: the plain one)."""
        return None

    def check(self, n: int) -> None:
        """Raise ValueError when the policy does not fit a dataset of ``n`` samples."""


class SubsetSampling(Sampling):
    """The given indices once per epoch: in the given order, or permuted by the v1 order of their count."""

    mode = "subset"

    def __init__(self, indices: np.ndarray) -> None:
        self.indices = indices

    def check(self, n: int) -> None:
        """Raise ValueError when an index is outside ``[0, n)``."""
        if self.indices.size and int(self.indices.max()) >= n:
            bad = int(np.flatnonzero(self.indices >= n)[0])
            raise ArgumentError(f"indices[{bad}] = {int(self.indices[bad])} is out of range for {n} samples")

    def epoch_order(self, seed: int, epoch: int, n: int, shuffle: bool) -> ArrayOrder:
        """Return ``indices[order_v1(seed, epoch, len(indices))]`` (or ``indices`` without shuffle)."""
        m, idx = len(self.indices), self.indices
        if not shuffle:
            return ArrayOrder(m, lambda: idx)
        return ArrayOrder(m, lambda: idx[permutation_at(seed, epoch, m)])

    def describe(self) -> dict[str, Any]:
        """Return the mode, count and a digest of the indices."""
        return {"mode": self.mode, "version": SAMPLING_VERSION, "count": len(self.indices),
                "digest": digest(self.indices)}


class WeightedSampling(Sampling):
    """``num_samples`` draws with probabilities proportional to ``weights``, as ``WeightedRandomSampler``.

    With replacement each position is one alias-table draw from the stream
    ``(seed, epoch, TAG_WEIGHTS)`` at that position. Without replacement the
    epoch is the ``num_samples`` smallest exponential keys ``-ln(U_i) / w_i``
    (``U_i`` from the stream ``(seed, epoch, TAG_KEYS)`` at position i), in
    increasing key order, ties by index: O(n log n) once per epoch.
    """

    mode = "weights"

    def __init__(self, weights: np.ndarray, num_samples: int, replacement: bool) -> None:
        self.weights, self.num_samples, self.replacement = weights, num_samples, replacement
        if num_samples > MAX_EPOCH_POSITIONS:
            raise ArgumentError(f"num_samples={num_samples!r} is over the bound of {MAX_EPOCH_POSITIONS} positions "
                                "per epoch (a computed epoch order holds 8 bytes per position)")
        self._quantized = quantize(weights, "sample_weights")
        positive = sum(1 for q in self._quantized if q > 0)
        if not replacement and num_samples > positive:
            raise ArgumentError(f"num_samples={num_samples} without replacement needs as many positive weights; "
                             f"sample_weights has {positive}")
        self._table: AliasTable | None = None

    def check(self, n: int) -> None:
        """Raise ValueError unless there is one weight per sample."""
        if len(self.weights) != n:
            raise ArgumentError(f"sample_weights has {len(self.weights)} weights for a dataset of {n} samples")

    @property
    def table(self) -> AliasTable:
        """Return the alias table, built on first use."""
        if self._table is None:
            self._table = AliasTable(self._quantized)
        return self._table

    def epoch_order(self, seed: int, epoch: int, n: int, shuffle: bool) -> ArrayOrder:
        """Return the draws of ``epoch``."""
        m = self.num_samples
        if self.replacement:
            base = stream_base(seed, epoch, TAG_WEIGHTS)
            return ArrayOrder(m, lambda: self.table.draw(words(base, np.arange(m, dtype=np.uint64))))
        base = stream_base(seed, epoch, TAG_KEYS)

        def without_replacement() -> np.ndarray:
            candidates = np.flatnonzero(self.weights > 0)  # zero weights have infinite keys: never among the m
            keys = exponential_keys(words(base, candidates.astype(np.uint64)), self.weights[candidates])
            return candidates[smallest_keys(keys, m)]

        return ArrayOrder(m, without_replacement)

    def describe(self) -> dict[str, Any]:
        """Return the mode, draws, replacement and a digest of the weights."""
        return {"mode": self.mode, "version": SAMPLING_VERSION, "num_samples": self.num_samples,
                "replacement": self.replacement, "count": len(self.weights), "digest": digest(self.weights)}


class MixSampling(Sampling):
    """A weighted mixture of sources laid end to end in one index space (``fastload.mix``).

    Position p of epoch e takes its source from the alias table of the source
    weights, drawn with the stream ``(seed, e, TAG_MIX)`` at p. The c-th
    position (from 0) that takes source j reads that source's position
    ``c mod n_j`` of its round ``r = c // n_j``, in the v1 order of
    ``(word(stream_base(seed, j, TAG_SOURCE), r), e, n_j)`` (or in storage
    order without shuffle), so a source that runs out starts a new shuffled
    round. The epoch ends after ``stop`` positions (an int), or at the position
    that reads the last sample of the first source to be exhausted
    (``"first_exhausted"``), or of the last one (``"all_exhausted"``).
    """

    mode = "mix"

    def __init__(self, sizes: list[int], weights: list[float], stop: Stop) -> None:
        self.sizes, self.weights, self.stop = sizes, weights, stop
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint64)
        quantized = quantize(weights, "mix weights")
        self.table = AliasTable(quantized)
        if any(q == 0 for q in quantized):
            raise ArgumentError(f"mix weights must all be positive, not {weights}")
        if isinstance(stop, str):  # the expected end: source j is exhausted after about size_j / p_j positions
            total = sum(quantized)
            ends = [size * total / q for size, q in zip(sizes, quantized)]
            expected = min(ends) if stop == "first_exhausted" else max(ends)
            if expected > MAX_EPOCH_POSITIONS / 2:
                raise ArgumentError(f"mix: stop={stop!r} with weights {list(weights)} and sizes {list(sizes)} "
                                    f"would run about {expected:.3g} positions per epoch, over the bound of "
                                    f"{MAX_EPOCH_POSITIONS // 2} (raise the small weights or pass stop=<int>)")
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None

    def check(self, n: int) -> None:
        """Raise ValueError unless the dataset is the concatenation of the sources."""
        if n != int(self.offsets[-1]):
            raise ArgumentError(f"a mixture of {sum(self.sizes)} samples over a dataset of {n}")

    def sources(self, seed: int, epoch: int) -> np.ndarray:
        """Return the source of every position of ``epoch`` (uint64), up to where it stops."""
        key = (int(seed), int(epoch))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        base = stream_base(seed, epoch, TAG_MIX)
        if isinstance(self.stop, int):
            out = self.table.draw(words(base, np.arange(self.stop, dtype=np.uint64)))
        else:
            out = self._until_exhausted(base)
        self._cache = (key, out)
        return out

    def _until_exhausted(self, base: int) -> np.ndarray:
        k, sizes = len(self.sizes), np.array(self.sizes, dtype=np.int64)
        counts = np.zeros(k, dtype=np.int64)
        reached = np.full(k, -1, dtype=np.int64)  # the position that reads each source's last sample
        chunk = max(4096, int(sizes.sum()) // 8)
        drawn: list[np.ndarray] = []
        done = 0
        while True:
            s = self.table.draw(words(base, np.arange(done, done + chunk, dtype=np.uint64)))
            drawn.append(s)
            for j in range(k):
                if reached[j] < 0:
                    hits = np.flatnonzero(s == j)
                    need = sizes[j] - counts[j]
                    if len(hits) >= need:
                        reached[j] = done + hits[need - 1]
                    counts[j] += len(hits)
            done += chunk
            if done > MAX_EPOCH_POSITIONS:
                raise ArgumentError(f"mix: stop={self.stop!r} ran past the bound of {MAX_EPOCH_POSITIONS} "
                                    "positions per epoch")
            if self.stop == "first_exhausted" and (reached >= 0).any():
                end = int(reached[reached >= 0].min()) + 1
                break
            if self.stop == "all_exhausted" and (reached >= 0).all():
                end = int(reached.max()) + 1
                break
        return np.concatenate(drawn)[:end]

    def epoch_order(self, seed: int, epoch: int, n: int, shuffle: bool) -> ArrayOrder:
        """Return the mixture's order of ``epoch``."""
        src = self.sources(seed, epoch)

        def compute() -> np.ndarray:
            out = np.empty(len(src), dtype=np.uint64)
            for j, size in enumerate(self.sizes):
                where = np.flatnonzero(src == j)
                count = np.arange(len(where), dtype=np.uint64)
                if len(where) <= size:  # one round: no wrapping (the usual case)
                    rounds, pos = None, count
                else:
                    rounds, pos = count // np.uint64(size), count % np.uint64(size)
                local = pos.copy() if not shuffle else np.empty(len(where), dtype=np.uint64)
                source_base = stream_base(seed, j, TAG_SOURCE)
                for r in range(int(rounds.max()) + 1 if rounds is not None else 1) if shuffle else ():
                    in_round = slice(None) if rounds is None else rounds == np.uint64(r)
                    local[in_round] = permutation_at(word(source_base, r), epoch, size, pos[in_round])
                out[where] = local + self.offsets[j]
            return out

        return ArrayOrder(len(src), compute)

    def describe(self) -> dict[str, Any]:
        """Return the mode, the source sizes, weights and stop rule."""
        return {"mode": self.mode, "version": SAMPLING_VERSION, "sizes": list(self.sizes),
                "weights": [float(w) for w in self.weights], "stop": self.stop}
