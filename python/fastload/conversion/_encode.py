"""Turning one source image into encoded records (run in the preprocess worker processes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..errors import FastloadError, ImageReadError, PreprocessError
from ..format._record import Field, RecordEncoder
from ..storage import RemoteFolder
from ._casts import cast_checked
from ._images import read_image
from ._picks import place, raise_read_errors
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
                   stop_tiles: int | None = None, picked: Sequence[int] | None = None) -> list[np.ndarray]:
    """Read one source image and return its samples (tiles in the field's layout) ``skip_tiles:stop_tiles``.

    With ``picked`` (tile indices, any order), those tiles instead, in that order.
    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema
    (or has fewer tiles than ``picked`` names: it changed since it was probed).
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
    grid = settings.tiles.grid(image.shape[0], image.shape[1])
    if picked is not None:
        if any(not 0 <= t < len(grid) for t in picked):
            raise ImageReadError(path, f"{len(grid)} tiles, fewer than when it was probed (did it change?)")
        origins = [grid[t] for t in picked]
    else:
        origins = grid[skip_tiles:stop_tiles]
    samples = []
    for y, x in origins:
        sample = cut_tile(image, y, x, tile)
        if settings.layout == "chw":
            sample = sample.transpose(2, 0, 1)
        samples.append(np.ascontiguousarray(sample))
    return samples


def encode_source(settings: EncodeSettings, relpath: str, label: int | None, skip_tiles: int = 0,
                  stop_tiles: int | None = None, picked: Sequence[int] | None = None) -> list[bytes]:
    """Read one source image and return the records of its tiles ``skip_tiles:stop_tiles`` (to the end: None).

    With ``picked``, the records of those tiles, in that order.
    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    image_field = settings.fields[0]
    encoder = RecordEncoder(settings.fields)
    records = []
    for sample in source_samples(settings, relpath, skip_tiles, stop_tiles, picked):
        values: dict[str, Any] = {image_field.name: sample}
        if label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records


def image_field_hw(field: Field, layout: str) -> tuple[int, int]:
    """Return (height, width) of an image field in the given layout."""
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])


# What a task of a shuffled write encodes from one source: (path, label, tiles, their slots in the task).
Pick = tuple[str, Optional[int], list[int], list[int]]  # Optional: evaluated at run time, on Python 3.9 too


def encode_picked(settings: EncodeSettings, picks: Sequence[Pick], n: int) -> list[bytes]:
    """Return the records of ``n`` tiles of several sources, each read once, at their slots (a shuffled write).

    Raises ImageReadError naming the file that cannot be read, PreprocessError naming it on another error.
    """
    parts, unreadable = [], []
    for relpath, label, tiles, slots in picks:
        try:
            parts.append((slots, encode_source(settings, relpath, label, picked=tiles)))
        except ImageReadError as err:  # the others are still read, to name every bad file
            unreadable.append(err)
        except FastloadError:
            raise
        except Exception as err:
            raise PreprocessError(f"{source_name(settings.data_dir, settings.remote, relpath)}: "
                                  f"{type(err).__name__}: {err}") from err
    raise_read_errors(unreadable)
    return place(parts, n)
