"""Turning one source image into encoded records (run in the preprocess worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ImageReadError
from ..format._record import Field, RecordEncoder
from ..storage import RemoteFolder
from ._casts import cast_checked
from ._images import read_image
from ._source_files import readable_source, source_name
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

    data_dir: str  # a local directory, or the URL of ``remote``
    fields: tuple[Field, ...]
    tiles: TileSpec
    layout: str = "chw"
    npy_layout: str = "auto"
    mode: str = "keep"
    remote: RemoteFolder | None = None  # the folder in object storage the sources are read from


def source_samples(settings: EncodeSettings, relpath: str, skip_tiles: int = 0,
                   stop_tiles: int | None = None) -> list[np.ndarray]:
    """Read one source image and return its samples (tiles in the field's layout) ``skip_tiles:stop_tiles``.

    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    with readable_source(settings.data_dir, settings.remote, relpath) as path:
        image = read_image(path, settings.npy_layout, settings.mode)
    path = source_name(settings.data_dir, settings.remote, relpath)
    image_field = settings.fields[0]
    image = cast_checked(image, image_field.np_dtype, path)
    tile = settings.tiles.tile or (image.shape[0], image.shape[1])
    channels = image_field.shape[0] if settings.layout == "chw" else image_field.shape[2]
    if image.shape[2] != channels:
        raise ImageReadError(path, f"{image.shape[2]} channels, the dataset has {channels}")
    if settings.tiles.tile is None and image_field_hw(image_field, settings.layout) != image.shape[:2]:
        raise ImageReadError(path, f"shape {image.shape[:2]} differs from the dataset's "
                                   f"{image_field_hw(image_field, settings.layout)}")
    samples = []
    for y, x in settings.tiles.grid(image.shape[0], image.shape[1])[skip_tiles:stop_tiles]:
        sample = cut_tile(image, y, x, tile)
        if settings.layout == "chw":
            sample = sample.transpose(2, 0, 1)
        samples.append(np.ascontiguousarray(sample))
    return samples


def encode_source(settings: EncodeSettings, relpath: str, label: int | None, skip_tiles: int = 0,
                  stop_tiles: int | None = None) -> list[bytes]:
    """Read one source image and return the records of its tiles ``skip_tiles:stop_tiles`` (to the end: None).

    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    image_field = settings.fields[0]
    encoder = RecordEncoder(settings.fields)
    records = []
    for sample in source_samples(settings, relpath, skip_tiles, stop_tiles):
        values: dict[str, Any] = {image_field.name: sample}
        if label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records


def image_field_hw(field: Field, layout: str) -> tuple[int, int]:
    """Return (height, width) of an image field in the given layout."""
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])
