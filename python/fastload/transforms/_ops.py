"""The transform ops: declared as data, compiled by ``_program.py`` into kernel steps.

Spatial ops (crops, pads, flips, rotations) draw their parameters once per
sample and apply them to every field they target, as one integer affine map
from output to input pixel (``Step`` gather). Value ops (channel selection,
dtype conversion, normalisation) apply to the fields they name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import TransformError
from ._rng import bernoulli, draw, randint
from ._spec import FLOAT_OUTPUTS, FieldState, dtype_name

MAX_SIDE = 1 << 20  # the largest size, padding or band width in pixels a parameter may give
MAX_RECTS = 1024  # the most rectangles (AxisMasks count) one op may draw per sample


def _int(value: Any, what: str, low: int = 0, high: int = MAX_SIDE) -> int:
    """Return ``value`` as an int in [low, high]; refuse bools, floats and anything else, quoting it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TransformError(f"{what} must be an integer, not {value!r}")
    if not low <= int(value) <= high:
        raise TransformError(f"{what} must be in [{low}, {high}], not {value!r}")
    return int(value)


def _finite(value: Any, what: str) -> float:
    """Return ``value`` as a finite float that float32 holds; refuse NaN, infinities, bools, strings and overflow."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TransformError(f"{what} must be a number, not {value!r}")
    v = float(value)
    if not np.isfinite(v) or abs(v) > float(np.finfo(np.float32).max):
        raise TransformError(f"{what} must be finite and within float32's range, not {value!r}")
    return v


def _pad_values(value: Any, what: str) -> float | Mapping[str, float]:
    """Return a pad value (a number, NaN allowed for float fields) or a dict of them per field; refuse the rest."""
    values = value.values() if isinstance(value, Mapping) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TransformError(f"{what} must be a number or a dict of numbers per field, not {value!r}")
    return value


def _range_pair(value: Any, what: str) -> tuple[float, float]:
    """Return ``(min, max)``: two finite positive numbers with min <= max."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise TransformError(f"{what} must be (min, max), not {value!r}")
    lo, hi = (_finite(v, what) for v in value)
    if not 0 < lo <= hi:
        raise TransformError(f"{what} must be (min, max) with 0 < min <= max, not {value!r}")
    return lo, hi


def _pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        pair = (_int(value[0], what, 1), _int(value[1], what, 1))
    else:
        raise TransformError(f"{what} must be an int or a pair (height, width), not {value!r}")
    if min(pair) <= 0:
        raise TransformError(f"{what} must be positive, not {value!r}")
    if max(pair) > MAX_SIDE:
        raise TransformError(f"{what} must be at most {MAX_SIDE}, not {value!r}")
    return pair


def _field_list(fields: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if fields is None:
        return None
    return (fields,) if isinstance(fields, str) else tuple(fields)


class Transform:
    """Base of every op: ``fields`` names the fields it applies to (None: the op's default).

    ``random`` says whether the op draws per sample (evaluation loaders refuse such ops unless asked).
    """

    random = False

    def __init__(self, fields: str | Sequence[str] | None = None) -> None:
        self.fields = _field_list(fields)

    @property
    def name(self) -> str:
        """Return the op's class name, as error messages quote it."""
        return type(self).__name__

    def fail(self, field: str, reason: str) -> TransformError:
        """Return the error for this op on ``field``."""
        return TransformError(f"{self!r}: field {field!r}: {reason}")

    def targets(self, state: Mapping[str, FieldState]) -> list[str]:
        """Return the fields this op applies to, validated against the fields at its point of the chain."""
        raise NotImplementedError

    def _named(self, state: Mapping[str, FieldState], default: tuple[str, ...]) -> list[str]:
        names = self.fields if self.fields is not None else default
        for n in names:
            if n not in state:
                raise self.fail(n, f"no such field (the loader yields {sorted(state)}); pass fields=[...]")
        return list(names)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and v is not None)
        return f"{self.name}({args})"

    def describe(self) -> dict[str, Any]:
        """Return the op and its parameters as plain JSON data: what a loader's state records to compare.

        Every public attribute is a parameter; numbers are exact (floats as
        floats), sequences lists, mappings dicts with sorted keys.
        """
        params = {k.rstrip("_"): _plain(v) for k, v in sorted(vars(self).items()) if not k.startswith("_")}
        return {"op": self.name, **params}


def _plain(value: Any) -> Any:
    """Return ``value`` as JSON data (tuples and arrays as lists, numpy scalars as numbers, else its repr)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


class SpatialTransform(Transform):
    """A geometric op: one integer affine map per sample, shared by every targeted field."""

    def targets(self, state: Mapping[str, FieldState]) -> list[str]:
        """Return the targeted fields (default: every 2-D or 3-D field); they must share height and width."""
        names = self._named(state, tuple(n for n, s in state.items() if s.spatial))
        if not names:
            raise TransformError(f"{self!r}: the loader yields no 2-D or 3-D field to apply it to")
        first = None
        for n in names:
            s = state[n]
            if not s.spatial:
                raise self.fail(n, f"shape {s.shape} is not an image (2-D, or 3-D chw/hwc)")
            if first is None:
                first = (n, s.chw[1:])
            elif s.chw[1:] != first[1]:
                raise self.fail(n, f"height x width {s.chw[1:]} differs from {first[0]!r}'s {first[1]}; "
                                "a geometric op draws one set of parameters for all its fields")
        self.check_per_field(names)
        return names

    def check_per_field(self, names: Sequence[str]) -> None:
        """Raise TransformError if a per-field dict parameter names a field this op does not apply to.

        A key the op never looks up (a typo, a field of another dataset) would leave
        that field at the default (pad 0, bilinear) without a word: refused instead.
        """
        for what, value in self.per_field().items():
            if isinstance(value, Mapping):
                unknown = sorted(str(k) for k in value if k not in names)
                if unknown:
                    raise TransformError(f"{self!r}: {what} names field(s) {unknown} that the op does not apply "
                                         f"to (it applies to {list(names)}); pass fields=[...] or fix the names")

    def per_field(self) -> dict[str, Any]:
        """Return the parameters that may be a dict per field name (``pad_value``, ``interpolation``)."""
        return {}

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return the output (height, width) for an input of (h, w); raise TransformError if it cannot apply."""
        return h, w

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return per-sample affine maps ``[n, 6]`` (a, b, c, d, e, f), input size (h, w)."""
        raise NotImplementedError

    def pad_value(self, field: str) -> float:
        """Return the value written where the map falls outside the input."""
        return 0.0


def _affine(n: int, a: Any = 1, b: Any = 0, c: Any = 0, d: Any = 0, e: Any = 1, f: Any = 0) -> np.ndarray:
    out = np.empty((n, 6), dtype=np.int64)
    for j, v in enumerate((a, b, c, d, e, f)):
        out[:, j] = v
    return out


class Pad(SpatialTransform):
    """Pad by ``padding`` pixels: an int (all sides), (left/right, top/bottom) or (left, top, right, bottom)."""

    def __init__(self, padding: int | Sequence[int], pad_value: float | Mapping[str, float] = 0,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        if isinstance(padding, (int, np.integer)):
            p = [padding] * 4
        elif isinstance(padding, Sequence) and not isinstance(padding, str):
            p = list(padding)
        else:
            p = []
        if len(p) == 2:
            p = [p[0], p[1], p[0], p[1]]
        if len(p) != 4:
            raise TransformError(f"Pad: padding must be non-negative ints (1, 2 or 4 of them), not {padding!r}")
        self.padding = tuple(_int(v, f"Pad: padding {padding!r}") for v in p)  # left, top, right, bottom
        self.pad_value_ = _pad_values(pad_value, "Pad: pad_value")

    def pad_value(self, field: str) -> float:
        """Return the pad value of ``field``."""
        v = self.pad_value_
        return float(v.get(field, 0) if isinstance(v, Mapping) else v)

    def per_field(self) -> dict[str, Any]:
        """Return ``pad_value``, which may be a dict per field."""
        return {"pad_value": self.pad_value_}

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return the padded size."""
        left, top, right, bottom = self.padding
        return h + top + bottom, w + left + right

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the constant shift by (top, left)."""
        left, top = self.padding[0], self.padding[1]
        return _affine(len(keys), c=-top, f=-left)


class CenterCrop(SpatialTransform):
    """Crop ``size`` (int or (h, w)) from the centre: top = (H - h) // 2, left = (W - w) // 2."""

    def __init__(self, size: int | Sequence[int], fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        self.size = _pair(size, "CenterCrop: size")

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return ``size``; fail when it exceeds the input."""
        if self.size[0] > h or self.size[1] > w:
            raise self.fail(field, f"crop {self.size} is larger than the sample's {(h, w)}")
        return self.size

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the constant shift to the centre crop."""
        return _affine(len(keys), c=(h - self.size[0]) // 2, f=(w - self.size[1]) // 2)


class RandomCrop(SpatialTransform):
    """Crop ``size`` at a random place of the sample padded by ``padding`` on every side with ``pad_value``."""

    random = True

    def __init__(self, size: int | Sequence[int], padding: int = 0, pad_value: float | Mapping[str, float] = 0,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        self.size = _pair(size, "RandomCrop: size")
        self.padding = _int(padding, "RandomCrop: padding")
        self.pad_value_ = _pad_values(pad_value, "RandomCrop: pad_value")

    pad_value = Pad.pad_value
    per_field = Pad.per_field

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return ``size``; fail when it exceeds the padded input."""
        p = self.padding
        if self.size[0] > h + 2 * p or self.size[1] > w + 2 * p:
            raise self.fail(field, f"crop {self.size} is larger than the sample {(h, w)} plus padding {p}")
        return self.size

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return shifts: top = randint(draw 0, H + 2p - h + 1), left = randint(draw 1, W + 2p - w + 1)."""
        p = self.padding
        top = randint(draw(keys, 0), h + 2 * p - self.size[0] + 1)
        left = randint(draw(keys, 1), w + 2 * p - self.size[1] + 1)
        return _affine(len(keys), c=top - p, f=left - p)


class RandomFlip(SpatialTransform):
    """Flip left-right (draw 0) and/or up-down (draw 1), each with probability ``p``."""

    random = True

    def __init__(self, horizontal: bool = True, vertical: bool = False, p: float = 0.5,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        if not 0.0 <= _finite(p, "RandomFlip: p") <= 1.0:
            raise TransformError(f"RandomFlip: p must be in [0, 1], not {p!r}")
        self.horizontal, self.vertical, self.p = bool(horizontal), bool(vertical), float(p)

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return per-sample flips."""
        n = len(keys)
        hf = bernoulli(draw(keys, 0), self.p) if self.horizontal else np.zeros(n, bool)
        vf = bernoulli(draw(keys, 1), self.p) if self.vertical else np.zeros(n, bool)
        return _affine(n, a=np.where(vf, -1, 1), c=np.where(vf, h - 1, 0), e=np.where(hf, -1, 1),
                       f=np.where(hf, w - 1, 0))


def _square(op: SpatialTransform, h: int, w: int, field: str) -> tuple[int, int]:
    if h != w:
        raise op.fail(field, f"{h}x{w} is not square, so rotated samples would not stack into one batch")
    return h, w


def _dihedral(t: np.ndarray, s: int) -> np.ndarray:
    """Return the maps of ``np.rot90(x, t % 4)`` then, for t >= 4, a left-right flip, on an s x s square."""
    table = np.array([[1, 0, 0, 0, 1, 0], [0, 1, 0, -1, 0, s - 1], [-1, 0, s - 1, 0, -1, s - 1],
                      [0, -1, s - 1, 1, 0, 0]], dtype=np.int64)
    m = table[t % 4]
    flip = t >= 4
    a, b, c, d, e, f = m.T
    return np.stack([a, np.where(flip, -b, b), np.where(flip, c + b * (s - 1), c),
                     d, np.where(flip, -e, e), np.where(flip, f + e * (s - 1), f)], axis=1)


class RandomRot90(SpatialTransform):
    """Rotate by k * 90 degrees counter-clockwise (as ``np.rot90``), k = randint(draw 0, 4); square samples."""

    random = True

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return the (square) size."""
        return _square(self, h, w, field)

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the rotations."""
        return _dihedral(randint(draw(keys, 0), 4), h)


class RandomDihedral(SpatialTransform):
    """One of the 8 symmetries of the square, t = randint(draw 0, 8): rot90 by t % 4, then a flip if t >= 4."""

    random = True

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return the (square) size."""
        return _square(self, h, w, field)

    def maps(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the symmetries."""
        return _dihedral(randint(draw(keys, 0), 8), h)


class ValueTransform(Transform):
    """An op on the values of the fields it names (default: the field "image")."""

    def targets(self, state: Mapping[str, FieldState]) -> list[str]:
        """Return the named fields (default ``("image",)``), checked to exist."""
        return self._named(state, ("image",))


class SelectChannels(ValueTransform):
    """Keep channels ``indices`` in that order (band subsets and reordering) of a 3-D field."""

    def __init__(self, indices: Sequence[int], fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        if isinstance(indices, (str, bytes)) or not isinstance(indices, (Sequence, np.ndarray)):
            raise TransformError(f"SelectChannels: indices must be a sequence of channel numbers, not {indices!r}")
        if len(indices) > MAX_SIDE:
            raise TransformError(f"SelectChannels: indices must name at most {MAX_SIDE} channels, not {len(indices)}")
        bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, (int, np.integer))
               or not 0 <= i <= MAX_SIDE]
        if bad:
            raise TransformError(f"SelectChannels: indices must be channel numbers in [0, {MAX_SIDE}], "
                                 f"not {bad[0]!r} (in {list(indices)!r})")
        self.indices = [int(i) for i in indices]
        if not self.indices:
            raise TransformError("SelectChannels: indices must name at least one channel")


def _float_dtype(op: str, dtype: Any) -> str:
    name = dtype_name(dtype)
    if name not in FLOAT_OUTPUTS:
        raise TransformError(f"{op}: dtype must be one of {FLOAT_OUTPUTS}, not {dtype!r}")
    return name


class ToDtype(ValueTransform):
    """Convert to ``dtype`` (float32, float16, bfloat16) as ``float32(x) * scale``, rounded to nearest even."""

    def __init__(self, dtype: Any = "float32", scale: float = 1.0, fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        self.dtype = _float_dtype("ToDtype", dtype)
        self.scale = _finite(scale, "ToDtype: scale")
        top = float(np.finfo(np.float16).max) if self.dtype == "float16" else float(np.finfo(np.float32).max)
        if abs(self.scale) > top:
            raise TransformError(f"ToDtype: scale {scale!r} overflows {self.dtype} (largest {top:g})")


def _values(value: Any, what: str) -> list[Any]:
    if isinstance(value, (str, bytes)):
        raise TransformError(f"{what} must be a number or a sequence of numbers, not {value!r}")
    out = list(value) if isinstance(value, (Sequence, np.ndarray)) else [value]
    if not 1 <= len(out) <= MAX_SIDE:
        raise TransformError(f"{what} must hold 1 to {MAX_SIDE} values, not {len(out)}")
    return out


class Normalize(ValueTransform):
    """``(float32(x) - mean[c]) / std[c]`` per channel, in float32, rounded into ``dtype``.

    ``mean`` and ``std`` are in the units of the input (e.g. 0..255 for uint8
    without a ``ToDtype`` before); one value each, or one per channel.
    """

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float], dtype: Any = "float32",
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(fields)
        self.mean = [_finite(v, f"Normalize: mean {mean!r}") for v in _values(mean, "Normalize: mean")]
        self.std = [_finite(v, f"Normalize: std {std!r}") for v in _values(std, "Normalize: std")]
        if any(np.float32(s) == 0 for s in self.std):
            raise TransformError(f"Normalize: std must be finite and non-zero in float32, not {std!r}")
        self.dtype = _float_dtype("Normalize", dtype)


def uniform(u: np.ndarray) -> np.ndarray:
    """Return ``(u >> 11) * 2^-53``: a float64 in [0, 1) for each draw."""
    return (u >> np.uint64(11)).astype(np.float64) * 2.0**-53


class FillTransform(ValueTransform):
    """A value op that fills rectangles drawn per sample (the same ones in every field it names)."""

    count = 1  # rectangles per sample

    def __init__(self, value: float, fields: str | Sequence[str] | None) -> None:
        super().__init__(fields)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TransformError(f"{self.name}: value must be a number, not {value!r}")
        self.value = float(value)

    def check(self, h: int, w: int, field: str) -> None:
        """Raise TransformError if the op cannot apply to an h x w field."""

    def rects(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return ``[n, 4 * count]`` rectangles (top, bottom, left, right), empty ones as zeros."""
        raise NotImplementedError


class RandomErasing(FillTransform):
    """With probability ``p``, fill one rectangle with ``value`` (torchvision's RandomErasing algorithm).

    Draw 0 decides; then up to 10 attempts t, each with draws 1 + 4t .. 4 + 4t: area
    ``H * W * uniform(scale)``, aspect ``exp(uniform(log ratio))``, height ``round(sqrt(area * aspect))``,
    width ``round(sqrt(area / aspect))``; the first attempt smaller than the sample in both directions
    is placed at top ``randint(H - h + 1)``, left ``randint(W - w + 1)``. No attempt fits: nothing is erased.
    """

    random = True

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3),
                 value: float = 0, fields: str | Sequence[str] | None = None) -> None:
        super().__init__(value, fields)
        if not 0.0 <= _finite(p, "RandomErasing: p") <= 1.0:
            raise TransformError(f"RandomErasing: p must be in [0, 1], not {p!r}")
        self.p = float(p)  # attributes in this order: repr() is pinned by tests/data/transform_vectors.json
        self.scale = _range_pair(scale, "RandomErasing: scale")
        if self.scale[1] > 1:
            raise TransformError(f"RandomErasing: scale must be (min, max) within (0, 1], not {scale!r}")
        self.ratio = _range_pair(ratio, "RandomErasing: ratio")

    def rects(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the erased rectangle of each sample."""
        n = len(keys)
        out = np.zeros((n, 4), dtype=np.int64)
        todo = bernoulli(draw(keys, 0), self.p)
        lo, hi = np.log(self.ratio[0]), np.log(self.ratio[1])
        for t in range(10):
            area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * uniform(draw(keys, 1 + 4 * t)))
            aspect = np.exp(lo + (hi - lo) * uniform(draw(keys, 2 + 4 * t)))
            eh = np.round(np.sqrt(area * aspect)).astype(np.int64)
            ew = np.round(np.sqrt(area / aspect)).astype(np.int64)
            fits = todo & (eh < h) & (ew < w) & (eh > 0) & (ew > 0)
            top = (((draw(keys, 3 + 4 * t) >> np.uint64(32)) * np.clip(h - eh + 1, 1, None).astype(np.uint64))
                   >> np.uint64(32)).astype(np.int64)
            left = (((draw(keys, 4 + 4 * t) >> np.uint64(32)) * np.clip(w - ew + 1, 1, None).astype(np.uint64))
                    >> np.uint64(32)).astype(np.int64)
            out[fits] = np.stack([top, top + eh, left, left + ew], axis=1)[fits]
            todo &= ~fits
        return out


class AxisMasks(FillTransform):
    """SpecAugment masks: ``count`` bands across the whole sample along ``axis`` ("height" or "width").

    Band j: width ``randint(draw 2j, max_width + 1)``, start ``randint(draw 2j + 1, size - width + 1)``;
    filled with ``value`` in every channel. For a (frequency, time) spectrogram, ``axis="width"`` masks
    time steps and ``axis="height"`` frequency bins.
    """

    random = True

    def __init__(self, axis: str, max_width: int, count: int = 1, value: float = 0,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(value, fields)
        if axis not in ("height", "width"):
            raise TransformError(f"AxisMasks: axis must be 'height' or 'width', not {axis!r}")
        self.axis = axis
        self.max_width = _int(max_width, "AxisMasks: max_width")
        self.count = _int(count, "AxisMasks: count", 1, MAX_RECTS)

    def check(self, h: int, w: int, field: str) -> None:
        """Fail when a band could be wider than the sample."""
        size = h if self.axis == "height" else w
        if self.max_width > size:
            raise self.fail(field, f"max_width {self.max_width} exceeds the {self.axis} {size}")

    def rects(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the bands of each sample."""
        n, size = len(keys), (h if self.axis == "height" else w)
        out = np.zeros((n, 4 * self.count), dtype=np.int64)
        for j in range(self.count):
            width = randint(draw(keys, 2 * j), self.max_width + 1)
            start = (((draw(keys, 2 * j + 1) >> np.uint64(32)) * (size - width + 1).astype(np.uint64))
                     >> np.uint64(32)).astype(np.int64)
            band = (start, start + width, np.zeros(n, np.int64), np.full(n, w if self.axis == "height" else h))
            rect = band if self.axis == "height" else (band[2], band[3], band[0], band[1])
            out[:, 4 * j:4 * j + 4] = np.stack(rect, axis=1)
        return out


INTERPOLATIONS = ("bilinear", "nearest")
BILINEAR_DTYPES = ("uint8", "int8", "uint16", "int16", "float16", "float32", "bfloat16")


class ResampleTransform(SpatialTransform):
    """A spatial op that resamples a box of each sample to ``size`` (bilinear or nearest, per field).

    ``interpolation`` is one mode for every field, or a dict per field; by default 3-D fields
    (images) are bilinear and 2-D fields (masks) nearest.
    """

    def __init__(self, size: int | Sequence[int], interpolation: str | Mapping[str, str] | None,
                 fields: str | Sequence[str] | None) -> None:
        super().__init__(fields)
        self.size = _pair(size, f"{self.name}: size")
        modes = interpolation.values() if isinstance(interpolation, Mapping) else [interpolation]
        if any(m is not None and m not in INTERPOLATIONS for m in modes):
            raise TransformError(f"{self.name}: interpolation must be 'bilinear' or 'nearest', not {interpolation!r}")
        self.interpolation = interpolation

    def mode(self, state: FieldState) -> str:
        """Return the interpolation of ``state``'s field; fail when bilinear cannot take its dtype.

        A 2-D field (a mask) or a target (a dataset's ``target_fields``) is bilinear only when a
        dict names it: one ``"bilinear"`` for every field would otherwise blend its labels into
        values no class has, so it is refused.
        """
        named = isinstance(self.interpolation, Mapping)
        chosen = self.interpolation.get(state.name) if isinstance(self.interpolation, Mapping) else self.interpolation
        if chosen == "bilinear" and not named and (len(state.shape) == 2 or state.target):
            what = "2-D field (a mask" if len(state.shape) == 2 else "target field (written by --targets"
            raise self.fail(state.name, f"interpolation='bilinear' for every field would interpolate this {what}: "
                                        "its labels would blend); pass a dict, e.g. {'image': 'bilinear'} "
                                        "(masks and targets default to nearest), or name this field in it to "
                                        "interpolate it")
        mode = chosen or ("bilinear" if len(state.shape) == 3 and not state.target else "nearest")
        if mode == "bilinear" and state.dtype not in BILINEAR_DTYPES:
            raise self.fail(state.name, f"bilinear interpolation does not take dtype {state.dtype} "
                                        f"(one of {BILINEAR_DTYPES}); use interpolation={{{state.name!r}: 'nearest'}} "
                                        "for it")
        return mode

    def per_field(self) -> dict[str, Any]:
        """Return ``interpolation``, which may be a dict per field."""
        return {"interpolation": self.interpolation}

    def out_size(self, h: int, w: int, field: str) -> tuple[int, int]:
        """Return ``size``."""
        return self.size

    def boxes(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return per-sample boxes ``[n, 4]`` (top, left, height, width) of the input to resample."""
        raise NotImplementedError


class Resize(ResampleTransform):
    """Resize the whole sample to ``size`` (int or (h, w)); bilinear with half-pixel centres, or nearest."""

    def __init__(self, size: int | Sequence[int], interpolation: str | Mapping[str, str] | None = None,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(size, interpolation, fields)

    def boxes(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return the whole sample as every box."""
        return np.tile(np.array([[0, 0, h, w]], np.int64), (len(keys), 1))


class RandomResizedCrop(ResampleTransform):
    """A random box of area ``scale`` and aspect ``ratio`` resized to ``size`` (torchvision's algorithm).

    Up to 10 attempts t with draws 4t .. 4t + 3: area ``H * W * uniform(scale)``, aspect
    ``exp(uniform(log ratio))``, width ``round(sqrt(area * aspect))``, height ``round(sqrt(area / aspect))``;
    the first that fits is placed at top ``randint(H - h + 1)``, left ``randint(W - w + 1)``. If none
    fits: the largest centred box with the aspect clamped into ``ratio``.
    """

    random = True

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), interpolation: str | Mapping[str, str] | None = None,
                 fields: str | Sequence[str] | None = None) -> None:
        super().__init__(size, interpolation, fields)
        self.scale = _range_pair(scale, "RandomResizedCrop: scale")
        if self.scale[1] > 1:
            raise TransformError(f"RandomResizedCrop: scale must be (min, max) within (0, 1], not {scale!r}")
        self.ratio = _range_pair(ratio, "RandomResizedCrop: ratio")

    def boxes(self, keys: np.ndarray, h: int, w: int) -> np.ndarray:
        """Return each sample's box."""
        n = len(keys)
        in_ratio = w / h
        if in_ratio < self.ratio[0]:
            fw, fh = w, int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            fh, fw = h, int(round(h * self.ratio[1]))
        else:
            fw, fh = w, h
        out = np.tile(np.array([[(h - fh) // 2, (w - fw) // 2, fh, fw]], np.int64), (n, 1))
        todo = np.ones(n, bool)
        lo, hi = np.log(self.ratio[0]), np.log(self.ratio[1])
        for t in range(10):
            area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * uniform(draw(keys, 4 * t)))
            aspect = np.exp(lo + (hi - lo) * uniform(draw(keys, 4 * t + 1)))
            bw = np.round(np.sqrt(area * aspect)).astype(np.int64)
            bh = np.round(np.sqrt(area / aspect)).astype(np.int64)
            fits = todo & (bw > 0) & (bw <= w) & (bh > 0) & (bh <= h)
            top = (((draw(keys, 4 * t + 2) >> np.uint64(32)) * np.clip(h - bh + 1, 1, None).astype(np.uint64))
                   >> np.uint64(32)).astype(np.int64)
            left = (((draw(keys, 4 * t + 3) >> np.uint64(32)) * np.clip(w - bw + 1, 1, None).astype(np.uint64))
                    >> np.uint64(32)).astype(np.int64)
            out[fits] = np.stack([top, left, bh, bw], axis=1)[fits]
            todo &= ~fits
        return out
