"""The epoch order (docs/ORDER.md, version 1): which sample sits at which position of an epoch.

A pure function of (seed, epoch, n): a 6-round Feistel network over the
smallest even bit width covering n, with cycle walking, keyed by SplitMix64.
It needs O(1) memory, can be evaluated at any position, and does not depend on
numpy's or torch's random generators (only on exact uint64 arithmetic), so it
is the same on every platform and version. ``csrc/reader/permutation.cpp`` is the
C++ twin used by the native path; both reproduce tests/data/order_vectors.json.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError

ORDER_VERSION = 1
ROUNDS = 6
_MASK64 = (1 << 64) - 1


def mix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2**64)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class EpochOrder:
    """The order of one epoch: ``order.positions(a, b)`` are the sample indices at positions a..b-1."""

    def __init__(self, seed: int, epoch: int, n: int, shuffle: bool = True) -> None:
        if n < 0:
            raise ArgumentError(f"n must be non-negative, not {n}")
        if epoch < 0:
            raise ArgumentError(f"epoch must be non-negative, not {epoch}")
        self.seed, self.epoch, self.n, self.shuffle = int(seed) & _MASK64, int(epoch), int(n), shuffle
        bits = (n - 1).bit_length() if n > 0 else 0
        self.half_bits = max(1, math.ceil(bits / 2))
        base = mix64(mix64(self.seed) ^ (self.epoch & _MASK64))
        self.keys = [mix64((base + i) & _MASK64) for i in range(ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half_bits)
        mask = np.uint64((1 << self.half_bits) - 1)
        left, right = x >> half, x & mask
        with np.errstate(over="ignore"):
            for key in self.keys:
                left, right = right, left ^ (_mix64_array(right ^ np.uint64(key)) & mask)
        return (left << half) | right

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Return the sample indices at positions [start, stop) as a uint64 array."""
        if not 0 <= start <= stop <= self.n:
            raise ArgumentError(f"positions [{start}, {stop}) outside [0, {self.n})")
        return self.at(np.arange(start, stop, dtype=np.uint64))

    def at(self, pos: np.ndarray) -> np.ndarray:
        """Return the sample indices at the given positions (each < n) as a uint64 array."""
        pos = np.asarray(pos, dtype=np.uint64)
        if pos.size and int(pos.max()) >= self.n:
            raise ArgumentError(f"position {int(pos.max())} outside [0, {self.n})")
        if not self.shuffle:
            return pos
        out = self._encrypt(pos)
        n = np.uint64(self.n)
        walking = out >= n
        while walking.any():
            out[walking] = self._encrypt(out[walking])
            walking = out >= n
        return out


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Return the number of batches in an epoch of ``n`` samples."""
    return n // batch_size if drop_last else -(-n // batch_size)
