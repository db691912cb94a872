"""The reference implementation of the kernels, in numpy: bitwise what csrc/transforms computes.

Used by ``backend="torch"`` and by the tests. Floating point is float32
throughout, one IEEE operation at a time in the order docs/TRANSFORMS.md gives,
and conversion to float16 / bfloat16 rounds to nearest even, written out here
(not numpy's cast) so that C++ can do exactly the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._spec import CONVERT, GATHER, NORMALIZE, SELECT, FieldState, Step, storage_dtype

if TYPE_CHECKING:
    from ._program import Program

_U32 = np.uint32


def float32_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values into ``dtype`` (float32, float16 bits as float16, bfloat16 bits as uint16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x
    bits = x.view(_U32)
    nan = (bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000)
    if dtype == "bfloat16":
        rounded = (bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) >> _U32(16)
        return np.where(nan, (bits >> _U32(16)) & _U32(0x8000) | _U32(0x7FC0), rounded).astype(np.uint16)
    if dtype != "float16":
        raise ValueError(f"float32_to: unsupported dtype {dtype}")
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
    h = np.where(nan, _U32(0x7E00), h)
    return (h | sign).astype(np.uint16).view(np.float16)


def to_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Return ``x`` (held as ``storage_dtype(dtype)``) as float32, as C++ ``static_cast<float>`` does."""
    if dtype == "bfloat16":
        return (x.astype(_U32) << _U32(16)).view(np.float32)
    return x.astype(np.float32)


def _as_nchw(x: np.ndarray, s: FieldState) -> np.ndarray:
    n = x.shape[0]
    c, h, w = s.chw
    if s.layout == "hwc":
        return x.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return x.reshape(n, c, h, w)


def _from_nchw(x: np.ndarray, s: FieldState) -> np.ndarray:
    n = x.shape[0]
    if s.layout == "hwc":
        x = x.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x).reshape(n, *s.shape)


def run_step(step: Step, x: np.ndarray, params: np.ndarray) -> np.ndarray:
    """Apply one step to a batch ``x`` ``[n, *step.src.shape]``; ``params`` is ``[n, num_params]``."""
    src, dst = step.src, step.dst
    x4 = _as_nchw(x, src)
    n = x.shape[0]
    if step.kind == GATHER:
        _, oh, ow = dst.chw
        _, h, w = src.chw
        a, b, c, d, e, f = (params[:, step.param_offset + j, None, None] for j in range(6))
        y, xx = np.meshgrid(np.arange(oh, dtype=np.int64), np.arange(ow, dtype=np.int64), indexing="ij")
        iy, ix = a * y + b * xx + c, d * y + e * xx + f
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        picked = x4[np.arange(n)[:, None, None], :, np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)]  # n, oh, ow, c
        pad = np.frombuffer(step.pad, dtype=storage_dtype(src.dtype))[0]
        out = np.where(inside[..., None], picked, pad).astype(x.dtype).transpose(0, 3, 1, 2)
    elif step.kind == SELECT:
        out = x4[:, step.channels]
    elif step.kind == CONVERT:
        v = to_float32(x4, src.dtype)
        if step.mode == NORMALIZE:
            mean = np.array(step.mean, np.float32)[None, :, None, None]
            std = np.array(step.std, np.float32)[None, :, None, None]
            y32 = (v - mean) / std
        else:
            y32 = v * np.float32(step.scale)
        out = float32_to(y32, dst.dtype)
    else:
        raise ValueError(f"unknown step kind {step.kind}")
    return _from_nchw(out, dst)


def apply(program: Program, batch: Mapping[str, np.ndarray], params: np.ndarray) -> dict[str, np.ndarray]:
    """Return the transformed batch: ``{name: [n, *output shape]}`` in the output storage dtypes."""
    out = dict(batch)
    with np.errstate(all="ignore"):  # overflow to inf is a defined result here, as in C++
        for step in program.steps:
            out[step.field] = run_step(step, out[step.field], params)
    return out


def apply_sample(program: Program, sample: Mapping[str, np.ndarray], params: Sequence[int]) -> dict[str, np.ndarray]:
    """Return one transformed sample (no batch axis)."""
    batch = {k: v[None] for k, v in sample.items()}
    return {k: v[0] for k, v in apply(program, batch, np.asarray(params, np.int64)[None]).items()}
