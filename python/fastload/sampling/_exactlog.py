"""Exponential keys for weighted sampling without replacement, bit-identical on every IEEE-754 platform.

Efraimidis and Spirakis (2006): giving sample i the key ``E_i / w_i`` with
``E_i`` standard exponential and taking the k smallest keys draws k samples
without replacement with the probabilities of successive weighted draws
(``torch.multinomial(w, k, replacement=False)``, ``WeightedRandomSampler``).

``E = -ln(U)`` needs a logarithm, and libm's (or numpy's SIMD) ``log`` is not
correctly rounded, so it differs between platforms. Here it is computed with
``frexp`` (exact) and a fixed sequence of +, -, * and / on float64 (each
correctly rounded by IEEE 754, one numpy ufunc call each, never fused), so
every key is the same bit pattern everywhere:
``ln(u) = e * ln 2 + 2 * atanh(s)``, ``u = m * 2**e`` with ``m`` in
``[sqrt(1/2), sqrt(2))``, ``s = (m - 1) / (m + 1)``, ``|s| < 0.172``, and
``atanh(s) = s * sum(s**(2k) / (2k + 1), k < 11)`` (the next term is below
1e-18 relative) evaluated by Horner's rule.
"""

from __future__ import annotations

import numpy as np

LN2 = 0.6931471805599453  # the double nearest ln 2
_TERMS = 11


def uniform_open(words: np.ndarray) -> np.ndarray:
    """Map 64-bit words to doubles in (0, 1): ``((r >> 11) + 0.5) * 2**-53``, exactly."""
    top = (np.asarray(words, dtype=np.uint64) >> np.uint64(11)).astype(np.float64)  # < 2**53: exact
    return (top + 0.5) * (1.0 / 9007199254740992.0)


def neg_log(u: np.ndarray) -> np.ndarray:
    """Return ``-ln(u)`` for doubles in (0, 1], computed with basic operations only (see the module)."""
    m, e = np.frexp(np.asarray(u, dtype=np.float64))  # u = m * 2**e, m in [0.5, 1)
    low = m < 0.7071067811865476
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    acc = np.full_like(s, 1.0 / (2 * _TERMS - 1))
    for k in range(_TERMS - 2, -1, -1):  # in place: the same operations, fewer temporaries
        acc *= s2
        acc += 1.0 / (2 * k + 1)
    acc *= s
    acc *= 2.0
    e *= LN2
    e += acc
    return np.negative(e, out=e)


def exponential_keys(words: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Return the keys ``-ln(U_i) / w_i`` (``inf`` where a weight is zero)."""
    e = neg_log(uniform_open(words))
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(w > 0, e / np.where(w > 0, w, 1.0), np.inf)
