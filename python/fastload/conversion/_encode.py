"""Turning one source image into encoded records (run in the preprocess worker processes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format._record import Field, RecordEncoder
from ._images import ImageReadError, read_image
from ._tiling import cut_tile, tile_grid


@dataclass(frozen=True)
class TileSpec:
    """How images become samples: whole, or cut into tiles on a grid."""

    tile: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    edge: str = "drop"

    def grid(self, height: int, width: int) -> list[tuple[int, int]]:
        """Return the tile origins of an image of this size ([(0, 0)] when not tiling)."""
        if self.tile is None:
            return [(0, 0)]
        return tile_grid(height, width, self.tile, self.stride or self.tile, self.edge)


@dataclass(frozen=True)
class EncodeSettings:
    """Everything a worker needs to encode a source image; picklable."""

    data_dir: str
    fields: tuple[Field, ...]
    tiles: TileSpec
    layout: str = "chw"
    npy_layout: str = "auto"
    mode: str = "keep"


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


def source_samples(settings: EncodeSettings, relpath: str, skip_tiles: int = 0) -> list[np.ndarray]:
    """Read one source image and return its samples (tiles in the field's layout) from ``skip_tiles`` on.

    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    path = os.path.join(settings.data_dir, relpath)
    image_field = settings.fields[0]
    image = read_image(path, settings.npy_layout, settings.mode)
    image = cast_checked(image, image_field.np_dtype, path)
    tile = settings.tiles.tile or (image.shape[0], image.shape[1])
    channels = image_field.shape[0] if settings.layout == "chw" else image_field.shape[2]
    if image.shape[2] != channels:
        raise ImageReadError(path, f"{image.shape[2]} channels, the dataset has {channels}")
    if settings.tiles.tile is None and image_field_hw(image_field, settings.layout) != image.shape[:2]:
        raise ImageReadError(path, f"shape {image.shape[:2]} differs from the dataset's "
                                   f"{image_field_hw(image_field, settings.layout)}")
    samples = []
    for y, x in settings.tiles.grid(image.shape[0], image.shape[1])[skip_tiles:]:
        sample = cut_tile(image, y, x, tile)
        if settings.layout == "chw":
            sample = sample.transpose(2, 0, 1)
        samples.append(np.ascontiguousarray(sample))
    return samples


def encode_source(settings: EncodeSettings, relpath: str, label: int | None, skip_tiles: int = 0) -> list[bytes]:
    """Read one source image and return the records of its tiles from ``skip_tiles`` on.

    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    image_field = settings.fields[0]
    encoder = RecordEncoder(settings.fields)
    records = []
    for sample in source_samples(settings, relpath, skip_tiles):
        values: dict[str, Any] = {image_field.name: sample}
        if label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records


def image_field_hw(field: Field, layout: str) -> tuple[int, int]:
    """Return (height, width) of an image field in the given layout."""
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])
