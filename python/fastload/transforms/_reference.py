"""The reference implementation of the kernels, in numpy: bitwise what csrc/transforms computes.

Used by ``backend="torch"`` and by the tests. Floating point is float32
throughout, one IEEE operation at a time in the order docs/TRANSFORMS.md gives,
and conversion to float16 / bfloat16 rounds to nearest even, written out here
(not numpy's cast) so that C++ can do exactly the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ArgumentError
from ._floats import float32_to
from ._spec import CONVERT, FILL, GATHER, NORMALIZE, RESIZE, SELECT, FieldState, Step, storage_dtype

if TYPE_CHECKING:
    from ._program import Program

def to_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Return ``x`` (held as ``storage_dtype(dtype)``) as float32, as C++ ``static_cast<float>`` does."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
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


def _take(img: np.ndarray, rows: np.ndarray, cols: np.ndarray, pad: Any) -> np.ndarray:
    """Return ``img[:, rows][:, :, cols]`` with ``pad`` where a row or column index is outside the image."""
    _, h, w = img.shape
    out = img.take(np.clip(rows, 0, h - 1), axis=1).take(np.clip(cols, 0, w - 1), axis=2)
    out[:, (rows < 0) | (rows >= h), :] = pad
    out[:, :, (cols < 0) | (cols >= w)] = pad
    return out


def _gather_one(img: np.ndarray, size: tuple[int, int], m: np.ndarray, pad: Any) -> np.ndarray:
    """Return one sample (C, H, W) gathered through the affine map ``m`` (docs/TRANSFORMS.md)."""
    (oh, ow), (a, b, c, d, e, f) = size, (int(v) for v in m)
    y, x = np.arange(oh, dtype=np.int64), np.arange(ow, dtype=np.int64)
    if b == 0 and d == 0:  # rows from y, columns from x: crops, pads, flips
        return _take(img, a * y + c, e * x + f, pad)
    if a == 0 and e == 0:  # rows from x, columns from y: the transposing rotations
        return _take(img, b * x + c, d * y + f, pad).transpose(0, 2, 1)
    _, h, w = img.shape
    iy, ix = a * y[:, None] + b * x[None] + c, d * y[:, None] + e * x[None] + f
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    return np.where(inside[None], img[:, np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)], pad)


def from_float32(v: np.ndarray, dtype: str) -> np.ndarray:
    """Return float32 values in ``dtype``: integers clamped then rounded to nearest even, floats rounded."""
    if dtype in ("float32", "float16", "bfloat16"):
        return float32_to(v, dtype)
    info = np.iinfo(storage_dtype(dtype))
    return np.rint(np.clip(v, np.float32(info.min), np.float32(info.max))).astype(storage_dtype(dtype))


def _bilinear_axis(out: int, start: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = np.float32(length) / np.float32(out)
    f = np.maximum((np.arange(out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), np.float32(0))
    i0 = np.minimum(np.floor(f).astype(np.int64), length - 1)
    i1 = np.minimum(i0 + 1, length - 1)
    return start + i0, start + i1, f - i0.astype(np.float32)


def _resize_one(img: np.ndarray, dtype: str, box: np.ndarray, size: tuple[int, int], bilinear: bool) -> np.ndarray:
    """Return one sample (C, H, W) with its box (top, left, height, width) resampled to ``size``."""
    _, h, w = img.shape
    top, left = min(max(int(box[0]), 0), h - 1), min(max(int(box[1]), 0), w - 1)
    bh, bw = min(max(int(box[2]), 1), h - top), min(max(int(box[3]), 1), w - left)
    oh, ow = size
    if not bilinear:
        def nearest(n: int, start: int, length: int) -> np.ndarray:
            scale = np.float32(length) / np.float32(n)
            i = np.floor((np.arange(n, dtype=np.float32) + np.float32(0.5)) * scale).astype(np.int64)
            return start + np.minimum(i, length - 1)
        return img.take(nearest(oh, top, bh), axis=1).take(nearest(ow, left, bw), axis=2)
    y0, y1, wy = _bilinear_axis(oh, top, bh)
    x0, x1, wx = _bilinear_axis(ow, left, bw)
    v = to_float32(img, dtype)
    rows0, rows1 = v.take(y0, axis=1), v.take(y1, axis=1)
    bx, by = np.float32(1) - wx, (np.float32(1) - wy)[:, None]
    r0 = bx * rows0.take(x0, axis=2) + wx * rows0.take(x1, axis=2)
    r1 = bx * rows1.take(x0, axis=2) + wx * rows1.take(x1, axis=2)
    return from_float32(by * r0 + wy[:, None] * r1, dtype)


def run_step(step: Step, x: np.ndarray, params: np.ndarray) -> np.ndarray:
    """Apply one step to a batch ``x`` ``[n, *step.src.shape]``; ``params`` is ``[n, num_params]``."""
    src, dst = step.src, step.dst
    x4 = _as_nchw(x, src)
    n = x.shape[0]
    if step.kind == GATHER:
        pad = np.frombuffer(step.pad, dtype=storage_dtype(src.dtype))[0]
        out = np.empty((n, dst.chw[0], dst.chw[1], dst.chw[2]), dtype=x.dtype)
        for i in range(n):
            out[i] = _gather_one(x4[i], dst.chw[1:], params[i, step.param_offset:step.param_offset + 6], pad)
    elif step.kind == RESIZE:
        out = np.empty((n, *dst.chw), dtype=x.dtype)
        for i in range(n):
            out[i] = _resize_one(x4[i], src.dtype, params[i, step.param_offset:step.param_offset + 4],
                                 dst.chw[1:], step.mode == 1)
    elif step.kind == FILL:
        value = np.frombuffer(step.pad, dtype=storage_dtype(src.dtype))[0]
        out = x4.copy()
        _, _, h, w = out.shape
        for i in range(n):
            for r in range(step.rects):
                top, bottom, left, right = (int(v) for v in params[i, step.param_offset + 4 * r:][:4])
                out[i, :, max(top, 0):min(bottom, h), max(left, 0):min(right, w)] = value
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
        raise ArgumentError(f"unknown step kind {step.kind}")
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
