"""What a field looks like at one point of a transform chain, and the steps the chain compiles to."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import numpy as np

from ..errors import ArgumentError

# Dtype name -> code shared with csrc/transforms/kernels.h (the order is the contract).
DTYPE_CODES = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "int32": 4, "int64": 5, "float16": 6,
               "float32": 7, "float64": 8, "bool": 9, "bfloat16": 10}
ITEMSIZE = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
            "float32": 4, "float64": 8, "bool": 1, "bfloat16": 2}
FLOAT_OUTPUTS = ("float32", "float16", "bfloat16")
LAYOUTS = ("chw", "hwc")


def storage_dtype(name: str) -> np.dtype:
    """Return the numpy dtype that holds ``name`` (bfloat16 is held as its uint16 bits)."""
    return np.dtype("<u2") if name == "bfloat16" else np.dtype(name).newbyteorder("<")


def dtype_name(dtype: Any) -> str:
    """Return the name of a dtype given as a string, a numpy dtype or a torch dtype."""
    text = str(dtype).removeprefix("torch.")
    if text in ITEMSIZE:
        return text
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise ArgumentError(f"unknown dtype {dtype!r}") from None


@dataclass(frozen=True)
class FieldState:
    """One field at a point of the chain: dtype name, per-sample shape and layout ("chw", "hwc" or "hw")."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    target: bool = False  # a label or per-pixel target (a dataset's ``target_fields``): never interpolated by default

    @property
    def spatial(self) -> bool:
        """Return whether the field is an image or a mask (2-D, or 3-D with a layout)."""
        return len(self.shape) in (2, 3)

    @property
    def chw(self) -> tuple[int, int, int]:
        """Return (channels, height, width); a 2-D field has one channel."""
        if len(self.shape) == 2:
            return 1, self.shape[0], self.shape[1]
        if self.layout == "hwc":
            return self.shape[2], self.shape[0], self.shape[1]
        return self.shape[0], self.shape[1], self.shape[2]

    def with_chw(self, c: int, h: int, w: int, dtype: str | None = None) -> FieldState:
        """Return this field with another size (and dtype), in the same layout."""
        if len(self.shape) == 2:
            shape: tuple[int, ...] = (h, w)
        elif self.layout == "hwc":
            shape = (h, w, c)
        else:
            shape = (c, h, w)
        return FieldState(self.name, dtype or self.dtype, shape, self.layout, self.target)

    @property
    def nbytes(self) -> int:
        """Return the bytes of one sample of this field."""
        return int(np.prod(self.shape, dtype=np.int64)) * ITEMSIZE[self.dtype]


GATHER, SELECT, CONVERT, FILL, RESIZE = 0, 1, 2, 3, 4
SCALE, NORMALIZE = 0, 1


@dataclass
class Step:
    """One kernel applied to one field of one sample (the C++ ``TransformStep``).

    gather: ``out[c, y, x] = in[c, a*y + b*x + c0, d*y + e*x + f]`` (six int64
    per sample at ``param_offset`` of the sample's parameters), ``pad`` where
    that falls outside. select: ``out[c] = in[channels[c]]``. convert:
    ``float32(x) * scale`` (mode SCALE) or ``(float32(x) - mean[c]) / std[c]``
    (mode NORMALIZE), rounded to nearest even into the output dtype. fill: ``rects``
    rectangles (top, bottom, left, right; four int64 each at ``param_offset``) set to ``pad``
    in every channel. resize: the box (top, left, height, width; four int64 at
    ``param_offset``) resampled to the output size, bilinear (``mode`` 1) or nearest (0).
    """

    kind: int
    field: str
    src: FieldState
    dst: FieldState
    op: str
    param_offset: int = 0
    pad: bytes = b""
    channels: list[int] = dc_field(default_factory=list)
    mode: int = SCALE
    scale: float = 1.0
    mean: list[float] = dc_field(default_factory=list)
    std: list[float] = dc_field(default_factory=list)
    rects: int = 0

    def native(self, field_index: int) -> tuple:
        """Return the tuple ``fastload._native.BatchReader`` takes for this step."""
        return (self.kind, field_index, DTYPE_CODES[self.src.dtype], list(self.src.chw), self.src.layout == "hwc",
                DTYPE_CODES[self.dst.dtype], list(self.dst.chw), self.param_offset, self.pad, list(self.channels),
                self.mode, float(self.scale), list(self.mean), list(self.std), self.rects)
