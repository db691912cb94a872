"""Turning one source image into encoded records (run in the preprocess worker processes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._format import Field, RecordEncoder
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
    npy_layout: str = "hwc"


def cast_checked(image: np.ndarray, dtype: np.dtype, path: str) -> np.ndarray:
    """Cast an image to ``dtype``, refusing integer casts that would change values."""
    if image.dtype == dtype:
        return image
    if np.can_cast(image.dtype, dtype, "safe") or dtype.kind == "f":
        return image.astype(dtype)
    if dtype.kind in "iu" and image.dtype.kind in "iub":
        info = np.iinfo(dtype)
        lo, hi = (int(image.min()), int(image.max())) if image.size else (0, 0)
        if lo < info.min or hi > info.max:
            raise ImageReadError(path, f"values {lo}..{hi} do not fit --dtype {dtype.name}")
        return image.astype(dtype)
    if dtype.kind == "b":
        raise ImageReadError(path, f"cannot cast {image.dtype} to bool without loss")
    if dtype.kind in "iu" and image.dtype.kind == "f":
        if not np.all(np.isfinite(image)) or not np.array_equal(image, np.round(image)):
            raise ImageReadError(path, f"float values are not whole numbers; refusing --dtype {dtype.name}")
        return cast_checked(image.astype(np.int64), dtype, path)
    return image.astype(dtype)


def encode_source(settings: EncodeSettings, relpath: str, label: int | None, skip_tiles: int = 0) -> list[bytes]:
    """Read one source image and return the records of its tiles from ``skip_tiles`` on.

    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    path = os.path.join(settings.data_dir, relpath)
    image_field = settings.fields[0]
    image = read_image(path, settings.npy_layout)
    image = cast_checked(image, image_field.np_dtype, path)
    tile = settings.tiles.tile or (image.shape[0], image.shape[1])
    channels = image_field.shape[0] if settings.layout == "chw" else image_field.shape[2]
    if image.shape[2] != channels:
        raise ImageReadError(path, f"{image.shape[2]} channels, the dataset has {channels}")
    if settings.tiles.tile is None and image_field_hw(image_field, settings.layout) != image.shape[:2]:
        raise ImageReadError(path, f"shape {image.shape[:2]} differs from the dataset's "
                                   f"{image_field_hw(image_field, settings.layout)}")
    encoder = RecordEncoder(settings.fields)
    records = []
    for y, x in settings.tiles.grid(image.shape[0], image.shape[1])[skip_tiles:]:
        sample = cut_tile(image, y, x, tile)
        if settings.layout == "chw":
            sample = sample.transpose(2, 0, 1)
        values: dict[str, Any] = {image_field.name: np.ascontiguousarray(sample)}
        if label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records


def image_field_hw(field: Field, layout: str) -> tuple[int, int]:
    """Return (height, width) of an image field in the given layout."""
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])
