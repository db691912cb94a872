"""The random draws of transforms: a pure function of (seed, epoch, sample index, op position).

docs/TRANSFORMS.md defines it; ``tests/data/transform_vectors.json`` pins it.
Everything is vectorised over the samples of a batch in uint64 arithmetic
(wrapping modulo 2^64), so a batch's draws cost a few numpy calls.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

_U64 = np.uint64
TRANSFORMS_VERSION = 1
TRANSFORM_TAG = 0x7472616E73666F72  # ASCII "transfor": separates these keys from the epoch order's


def mix64(z: np.ndarray) -> np.ndarray:
    """Return SplitMix64's finaliser of every element of a uint64 array (docs/ORDER.md)."""
    with np.errstate(over="ignore"):
        z = np.asarray(z, dtype=_U64) + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def op_keys(seed: int, epoch: int, indices: np.ndarray, position: int) -> np.ndarray:
    """Return the key of op ``position`` for each global sample index of ``indices`` in ``epoch``."""
    base = mix64(np.array([seed % 2**64], dtype=_U64))
    epoch_key = mix64(base ^ _U64(epoch % 2**64)) ^ _U64(TRANSFORM_TAG)
    with np.errstate(over="ignore"):
        sample_key = mix64(epoch_key + np.asarray(indices, dtype=_U64))
        return mix64(sample_key + _U64(position))


def draw(keys: np.ndarray, k: int) -> np.ndarray:
    """Return draw ``k`` (a uniform uint64) of each key."""
    with np.errstate(over="ignore"):
        return mix64(keys + _U64(k))


def randint(u: np.ndarray, n: int) -> np.ndarray:
    """Return ``floor((u >> 32) * n / 2^32)``: an integer in ``[0, n)`` for each draw; 1 <= n <= 2^32."""
    if not 1 <= n <= 2**32:
        raise ArgumentError(f"randint: n={n} is outside [1, 2^32]")
    return (((u >> _U64(32)) * _U64(n)) >> _U64(32)).astype(np.int64)


def bernoulli(u: np.ndarray, p: float) -> np.ndarray:
    """Return ``(u >> 40) < round(p * 2^24)`` for each draw: True with probability p (to 2^-24)."""
    return (u >> _U64(40)) < _U64(round(p * 2**24))
