"""Lossless casts of a source image to the field's dtype: every cast that would change a value is refused."""

from __future__ import annotations

import numpy as np

from ..errors import ImageReadError


def _float_that_holds(image: np.ndarray) -> str:
    """Return the smallest float dtype that holds every value of an integer or float image exactly."""
    for name in ("float16", "float32", "float64"):
        with np.errstate(all="ignore"):
            candidate = image.astype(name)
        if np.array_equal(candidate.astype(image.dtype), image, equal_nan=image.dtype.kind == "f"):
            return name
    return "float64"


def cast_checked(image: np.ndarray, dtype: np.dtype, path: str) -> np.ndarray:
    """Cast an image to ``dtype``, refusing every cast that would change a value (naming a dtype that fits).

    Integer to float must be exact (uint16 values above 2048 are not all
    float16 numbers); float to a narrower float may round but never overflow
    to infinity; float to integer needs whole numbers in range.
    """
    if image.dtype == dtype:
        return image
    if np.can_cast(image.dtype, dtype, "safe"):
        return image.astype(dtype)
    with np.errstate(all="ignore"):
        return _cast_or_refuse(image, dtype, path)


def _cast_or_refuse(image: np.ndarray, dtype: np.dtype, path: str) -> np.ndarray:
    lo, hi = (image.min(), image.max()) if image.size else (0, 0)
    if dtype.kind == "f":
        out = image.astype(dtype)
        if image.dtype.kind in "iub":
            if not np.array_equal(out.astype(image.dtype), image) or not np.all(np.isfinite(out)):
                fits = _float_that_holds(image)
                raise ImageReadError(path, f"values {lo}..{hi} ({image.dtype}) are not all exact in --dtype "
                                           f"{dtype.name} (max {np.finfo(dtype).max:g}); use --dtype {fits}")
            return out
        overflow = np.isfinite(image) & ~np.isfinite(out)
        if overflow.any():
            raise ImageReadError(path, f"{int(overflow.sum())} value(s) up to {np.abs(image[overflow]).max():g} "
                                       f"overflow --dtype {dtype.name} (max {np.finfo(dtype).max:g}); use --dtype "
                                       f"{_float_that_holds(image) if image.dtype.itemsize > 4 else image.dtype.name}")
        return out
    if dtype.kind in "iu" and image.dtype.kind in "iub":
        info = np.iinfo(dtype)
        if int(lo) < info.min or int(hi) > info.max:
            raise ImageReadError(path, f"values {lo}..{hi} do not fit --dtype {dtype.name}; use --dtype "
                                       f"{_int_that_holds(int(lo), int(hi))}")
        return image.astype(dtype)
    if dtype.kind == "b":
        raise ImageReadError(path, f"cannot cast {image.dtype} to bool without loss")
    if dtype.kind in "iu" and image.dtype.kind == "f":
        if not np.all(np.isfinite(image)) or not np.array_equal(image, np.round(image)):
            raise ImageReadError(path, f"float values are not whole numbers; refusing --dtype {dtype.name} "
                                       f"(keep --dtype {image.dtype.name})")
        return _cast_or_refuse(image.astype(np.int64), dtype, path)
    raise ImageReadError(path, f"cannot cast {image.dtype} to --dtype {dtype.name}")


def _int_that_holds(lo: int, hi: int) -> str:
    for name in ("uint8", "int8", "uint16", "int16", "int32", "int64"):
        info = np.iinfo(name)
        if info.min <= lo and hi <= info.max:
            return name
    return "float64"
