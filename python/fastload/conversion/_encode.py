"""Turning one source image into encoded records (run in the preprocess worker processes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FastloadError, ImageReadError, PreprocessError
from ..format._record import Field, RecordEncoder
from ..storage import RemoteFolder
from ._casts import cast_checked
from ._images import read_image
from ._picks import place, raise_read_errors
from ._scene_tiles import DenseSpec, kept_origins, tile_values
from ._source_files import readable_source, source_name
from ._sources import Source
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
    dense: DenseSpec = DenseSpec()  # partner rasters, windows and class counts of tiled scenes


def source_samples(settings: EncodeSettings, relpath: str, skip_tiles: int = 0,
                   stop_tiles: int | None = None, picked: Sequence[int] | None = None) -> list[np.ndarray]:
    """Read one source image and return its image samples (tiles in the field's layout) ``skip_tiles:stop_tiles``.

    With ``picked`` (tile indices, any order), those tiles instead, in that order. Only the image:
    what ``--codec auto`` tries its codecs on.
    Raises ImageReadError naming the file when it cannot be read or disagrees with the schema.
    """
    image = _read_source_image(settings, relpath)
    tile = settings.tiles.tile or (image.shape[0], image.shape[1])
    origins = _origins(settings, settings.tiles.grid(image.shape[0], image.shape[1]), skip_tiles, stop_tiles, picked,
                       source_name(settings.data_dir, settings.remote, relpath))
    samples = []
    for y, x in origins:
        sample = cut_tile(image, y, x, tile)
        if settings.layout == "chw":
            sample = sample.transpose(2, 0, 1)
        samples.append(np.ascontiguousarray(sample))
    return samples


def _read_source_image(settings: EncodeSettings, relpath: str) -> np.ndarray:
    """Return the source image ``relpath`` as (H, W, C), cast and checked against the image field."""
    with readable_source(settings.data_dir, settings.remote, relpath) as path:
        image = read_image(path, settings.npy_layout, settings.mode)
    path = source_name(settings.data_dir, settings.remote, relpath)
    image_field = settings.fields[0]
    image = cast_checked(image, image_field.np_dtype, path)
    channels = image_field.shape[0] if settings.layout == "chw" else image_field.shape[2]
    if image.shape[2] != channels:
        raise ImageReadError(path, f"{image.shape[2]} channels, the dataset has {channels}")
    if settings.tiles.tile is None and image_field_hw(image_field, settings.layout) != image.shape[:2]:
        raise ImageReadError(path, f"shape {image.shape[:2]} differs from the dataset's "
                                   f"{image_field_hw(image_field, settings.layout)}")
    return image


def _origins(settings: EncodeSettings, grid: list[tuple[int, int]], skip_tiles: int, stop_tiles: int | None,
             picked: Sequence[int] | None, path: str) -> list[tuple[int, int]]:
    if picked is None:
        return grid[skip_tiles:stop_tiles]
    if any(not 0 <= t < len(grid) for t in picked):
        raise ImageReadError(path, f"{len(grid)} tiles, fewer than when it was probed (did it change?)")
    return [grid[t] for t in picked]


def scene_rasters(settings: EncodeSettings, source: Source,
                  only: Sequence[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a scene: field name -> (H, W, C) raster of the image and of each partner, and field name -> file name.

    ``only``: the partner fields to read (the image is then not read). Raises ImageReadError naming
    the file that cannot be read or whose size, bands or dtype differ from the image's or the field's.
    """
    image_name = source_name(settings.data_dir, settings.remote, source.relpath)
    rasters: dict[str, np.ndarray] = {}
    names = {"image": image_name}
    if only is None:
        rasters["image"] = _read_source_image(settings, source.relpath)
    fields = {f.name: f for f in settings.fields}
    for partner, relpath in zip(settings.dense.partners, source.partners):
        if only is not None and partner.name not in only:
            continue
        with readable_source(partner.data_dir, partner.remote, relpath) as path:
            raster = read_image(path, settings.npy_layout, "labels" if partner.role == "target" else "keep")
        where = names[partner.name] = partner.where(relpath)
        check_partner(raster, fields[partner.name], settings.layout, where)
        rasters[partner.name] = raster
    height, width = next(iter(rasters.values())).shape[:2] if only is not None else rasters["image"].shape[:2]
    for name, raster in rasters.items():
        if raster.shape[:2] != (height, width):
            raise ImageReadError(names[name], f"size {raster.shape[0]}x{raster.shape[1]} differs from its image "
                                              f"{image_name} ({height}x{width})")
    return rasters, names


def check_partner(raster: np.ndarray, field: Field, layout: str, where: str) -> None:
    """Raise ImageReadError when a partner raster's bands or dtype differ from its field's."""
    bands = 1 if len(field.shape) == 2 else (field.shape[0] if layout == "chw" else field.shape[2])
    if raster.shape[2] != bands:
        raise ImageReadError(where, f"{raster.shape[2]} band(s), field {field.name!r} has {bands}")
    if raster.dtype != field.np_dtype:
        raise ImageReadError(where, f"dtype {raster.dtype}, field {field.name!r} has {field.dtype}")


def scene_origins(settings: EncodeSettings, rasters: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """Return the origins of a scene's tiles: its grid, less the tiles ``--min-labelled`` drops."""
    height, width = next(iter(rasters.values())).shape[:2]
    grid = settings.tiles.grid(height, width)
    tile = settings.tiles.tile or (height, width)
    return kept_origins(settings.dense, grid, rasters, tile)


def count_tiles(settings: EncodeSettings, source: Source) -> int:
    """Return the tiles of a scene that ``--min-labelled`` keeps (reads only the target it looks at)."""
    target = settings.dense.labelled_target
    rasters, _ = scene_rasters(settings, source, only=[target] if target else None)
    return len(scene_origins(settings, rasters))


def encode_source(settings: EncodeSettings, source: Source, scene: int, skip_tiles: int = 0,
                  stop_tiles: int | None = None, picked: Sequence[int] | None = None) -> list[bytes]:
    """Read one scene (source image and partners) and return the records of its tiles ``skip_tiles:stop_tiles``.

    ``scene``: the source's index in the dataset (its ``scene`` field). With ``picked``, the
    records of those tiles, in that order. Raises ImageReadError naming the file when it cannot be
    read or disagrees with the schema.
    """
    if not settings.dense.partners and not settings.dense.windows:  # whole images, or tiles of the image only
        samples = source_samples(settings, source.relpath, skip_tiles, stop_tiles, picked)
        return _records(settings, ({settings.fields[0].name: s} for s in samples), source.label)
    rasters, names = scene_rasters(settings, source)
    origins = _origins(settings, scene_origins(settings, rasters), skip_tiles, stop_tiles, picked, names["image"])
    height, width = rasters["image"].shape[:2]
    tile = settings.tiles.tile or (height, width)
    return _records(settings, (tile_values(settings.dense, rasters, names, scene, o, tile, settings.layout)
                               for o in origins), source.label)


def _records(settings: EncodeSettings, samples: Iterable[dict[str, Any]], label: int | None) -> list[bytes]:
    encoder = RecordEncoder(settings.fields)
    records = []
    for values in samples:
        if label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records


def image_field_hw(field: Field, layout: str) -> tuple[int, int]:
    """Return (height, width) of an image field in the given layout."""
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])


# What a task of a shuffled write encodes from one source: (source, its scene index, tiles, their slots in the task).
Pick = tuple[Source, int, list[int], list[int]]


def encode_picked(settings: EncodeSettings, picks: Sequence[Pick], n: int) -> list[bytes]:
    """Return the records of ``n`` tiles of several sources, each read once, at their slots (a shuffled write).

    Raises ImageReadError naming the file that cannot be read, PreprocessError naming it on another error.
    """
    parts, unreadable = [], []
    for source, scene, tiles, slots in picks:
        relpath = source.relpath
        try:
            parts.append((slots, encode_source(settings, source, scene, picked=tiles)))
        except ImageReadError as err:  # the others are still read, to name every bad file
            unreadable.append(err)
        except FastloadError:
            raise
        except Exception as err:
            raise PreprocessError(f"{source_name(settings.data_dir, settings.remote, relpath)}: "
                                  f"{type(err).__name__}: {err}") from err
    raise_read_errors(unreadable)
    return place(parts, n)
