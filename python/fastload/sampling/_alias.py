"""Counter-based random words and Vose alias tables: O(1) weighted draws that are pure functions of a position.

Sampling version 1 (docs/ORDER.md, "Sampling"). Everything here is exact
integer arithmetic (uint64 modulo 2**64, or Python ints), so a draw is the
same on every platform and numpy version:

- ``stream_base(seed, epoch, tag)`` keys one random stream; ``words(base, p)``
  is its word at position ``p``: SplitMix64's output number ``p`` from state
  ``base``, computed alone, with no state carried from one position to the next.
- :class:`AliasTable` quantizes the weights to integers and builds Vose's alias
  table with integer arithmetic once (O(n) time and memory); ``draw(words)``
  maps each 64-bit word to an index in O(1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ._order import _mix64_array, mix64

SAMPLING_VERSION = 1
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment
_MASK64 = (1 << 64) - 1
WEIGHT_BITS = 52  # weights are quantized to multiples of max(w) * 2**-52
COIN_BITS = 32  # an alias column keeps its own index with probability threshold / 2**32
# Domain tags ("what the stream is for"), so that streams of one (seed, epoch) are unrelated.
TAG_WEIGHTS = 0x5745494748545331  # "WEIGHTS1"
TAG_KEYS = 0x4B45595357524E31  # "KEYSWRN1": keys of sampling without replacement
TAG_MIX = 0x4D49585352433031  # "MIXSRC01": the source of each position of a mixture
TAG_SOURCE = 0x4D49584F52443031  # "MIXORD01": the orders within the sources of a mixture


def stream_base(seed: int, epoch: int, tag: int) -> int:
    """Return the state that keys the random stream ``tag`` of ``(seed, epoch)``."""
    return mix64(mix64(mix64(int(seed) & _MASK64) ^ (int(epoch) & _MASK64)) ^ tag)


def words(base: int, positions: np.ndarray) -> np.ndarray:
    """Return the stream's 64-bit words at ``positions``: ``mix64(base + p * GAMMA)`` (uint64)."""
    pos = np.asarray(positions, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix64_array(np.uint64(base) + pos * np.uint64(GAMMA))


def word(base: int, position: int) -> int:
    """Return one word of the stream (the scalar reference of :func:`words`)."""
    return mix64((base + position * GAMMA) & _MASK64)


def real_weights(weights: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """Return ``weights`` as float64; refuse strings, bools, complex numbers and objects, quoting the first."""
    if isinstance(weights, (str, bytes)):
        raise ArgumentTypeError(f"{what} must be numbers, not {weights!r}")
    if isinstance(weights, (list, tuple)):
        bad = next((v for v in weights if isinstance(v, (bool, np.bool_, str, bytes, complex, np.complexfloating))),
                   None)
        if bad is not None:
            raise ArgumentTypeError(f"{what} must be real numbers; got {bad!r}")
    try:
        raw = np.asarray(weights)
    except (ValueError, TypeError) as err:
        raise ArgumentTypeError(f"{what} must be real numbers: {err}") from None
    if raw.size and raw.dtype.kind not in "iuf":
        raise ArgumentTypeError(f"{what} must be real numbers; got {raw.flat[0]!r} ({raw.dtype})")
    return raw.astype(np.float64)


def quantize(weights: Sequence[float] | np.ndarray, what: str = "weights") -> list[int]:
    """Return the weights as integers ``floor(w / max(w) * 2**52)``; validate them first.

    Division by the maximum and scaling by a power of two are single IEEE-754
    operations, so the integers are the same everywhere.
    """
    w = real_weights(weights, what)
    if w.ndim != 1 or w.size == 0:
        raise ArgumentError(f"{what} must be a non-empty 1-D sequence of numbers, got shape {w.shape}")
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise ArgumentError(f"{what}[{int(bad[0])}] is {float(w[bad[0]])!r}; weights must be finite and "
                            "non-negative")
    top = float(w.max())
    if top <= 0:
        raise ArgumentError(f"{what} are all zero; at least one must be positive")
    return [int(q) for q in np.floor(w / top * float(1 << WEIGHT_BITS)).tolist()]


class AliasTable:
    """Vose's alias method over integer weights: ``draw(words)`` picks index i with probability q_i / sum(q).

    Built once in O(n) with exact integers: column i holds ``q_i * n`` parts of
    ``T = sum(q)``; columns below T are filled from columns above it (both kept
    as stacks, filled in index order, popped last-in first-out). A draw splits a
    64-bit word ``r`` by ``r * n = col * 2**64 + frac`` (``col`` uniform over the
    columns, ``frac`` the rest) and keeps ``col`` when ``frac >> 32`` is below the
    column's threshold ``floor(parts * 2**32 / T)``, else takes its alias.
    Probabilities are exact up to 2**-32 per column.
    """

    def __init__(self, weights: Sequence[int]) -> None:
        q = [int(x) for x in weights]
        n = len(q)
        if n == 0 or n >= 1 << 32:
            raise ArgumentError(f"an alias table needs 1 to 2**32 - 1 weights, not {n}")
        total = sum(q)
        if total <= 0:
            raise ArgumentError("an alias table needs a positive weight")
        parts = [x * n for x in q]
        small = [i for i in range(n) if parts[i] < total]
        large = [i for i in range(n) if parts[i] >= total]
        threshold = [1 << COIN_BITS] * n
        alias = list(range(n))
        while small and large:
            lo, hi = small.pop(), large.pop()
            threshold[lo] = (parts[lo] << COIN_BITS) // total
            alias[lo] = hi
            parts[hi] += parts[lo] - total
            (small if parts[hi] < total else large).append(hi)
        self.n = n
        self.threshold = np.array(threshold, dtype=np.uint64)
        self.alias = np.array(alias, dtype=np.uint64)

    def draw(self, r: np.ndarray) -> np.ndarray:
        """Return one index (uint64) per 64-bit word in ``r``."""
        r = np.asarray(r, dtype=np.uint64)
        n = np.uint64(self.n)
        lo32 = np.uint64(0xFFFFFFFF)
        with np.errstate(over="ignore"):
            col = r >> np.uint64(32)
            lo = r & lo32
            lo *= n
            lo >>= np.uint64(32)
            col *= n
            col += lo
            col >>= np.uint64(32)  # floor(r * n / 2**64) = (hi * n + (lo * n >> 32)) >> 32, exact for n < 2**32
            coin = r * n
            coin >>= np.uint64(64 - COIN_BITS)  # the top bits of (r * n) mod 2**64
        ci = col.view(np.int64)  # < 2**32: the same values, and numpy indexes with int64 without converting
        out = self.alias[ci]
        np.copyto(out, col, where=coin < self.threshold[ci])
        return out

    def draw_one(self, r: int) -> int:
        """Return the index of one word (the scalar reference of :meth:`draw`)."""
        col, frac = divmod(r * self.n, 1 << 64)
        return col if (frac >> (64 - COIN_BITS)) < int(self.threshold[col]) else int(self.alias[col])
