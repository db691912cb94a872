"""Rounding float32 values into the output float dtypes, bit for bit as the C++ kernels round them."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

_U32 = np.uint32


def float32_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values into ``dtype`` (float32, float16 bits as float16, bfloat16 bits as uint16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(_U32)
    nan = (bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000)
    if dtype == "float32":  # NaN: the canonical positive quiet NaN (which NaN an op returns is not portable)
        return np.where(nan, _U32(0x7FC00000), bits).astype(_U32).view(np.float32)
    if dtype == "bfloat16":
        rounded = (bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) >> _U32(16)
        return np.where(nan, _U32(0x7FC0), rounded).astype(np.uint16)
    if dtype != "float16":
        raise ArgumentError(f"float32_to: unsupported dtype {dtype}")
    sign = (bits >> _U32(16)) & _U32(0x8000)
    a = bits & _U32(0x7FFFFFFF)
    normal = (a - _U32(0x38000000) + _U32(0xFFF) + ((a >> _U32(13)) & _U32(1))) >> _U32(13)
    e = (a >> _U32(23)).astype(np.int64)
    shift = np.clip(126 - e, 1, 31).astype(_U32)
    m = (a & _U32(0x7FFFFF)) | _U32(0x800000)
    r = m >> shift
    rem = m & ((_U32(1) << shift) - _U32(1))
    half = _U32(1) << (shift - _U32(1))
    sub = r + ((rem > half) | ((rem == half) & ((r & _U32(1)) == _U32(1)))).astype(_U32)
    h = np.where(a >= _U32(0x38800000), normal, np.where(a < _U32(0x33000000), _U32(0), sub))
    h = np.where(a >= _U32(0x477FF000), _U32(0x7C00), h)
    h = np.where(nan, _U32(0x7E00), h | sign)
    return h.astype(np.uint16).view(np.float16)
