"""Cutting every raster of one scene on one grid: the image, its inputs and targets, and each tile's window.

A scene is the source image and its partner files (``_partners.py``), all of the image's height
and width. Each tile becomes one sample: the image's tile, each partner's tile on the same
window, the ``scene`` index and the ``window`` (y, x, height, width) the tile covers in the
scene, and per target with a class count the pixels of each class it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ImageReadError
from ..format._scenes import CLASS_PIXELS_SUFFIX, SCENE_FIELD, WINDOW_FIELD
from ._partners import Partner
from ._tiling import cut_tile

MAX_CLASSES = 1024  # --num-classes: a per-tile count field of int32 per class


@dataclass(frozen=True)
class DenseSpec:
    """What a scene gives besides its image tiles; picklable (part of ``EncodeSettings``).

    ``partners``: the ``--inputs`` then ``--targets`` folders. ``windows``: write the ``scene``
    and ``window`` fields (every tiled run). ``classes``: target name -> K, for the targets whose
    per-tile class pixel counts are written. ``ignore_index``: the target value that is not a
    label (not counted; the padding of targets). ``min_labelled``: keep only tiles whose labelled
    pixels (inside the scene, not ``ignore_index``) of ``labelled_target`` are at least this
    fraction of the tile.
    """

    partners: tuple[Partner, ...] = ()
    windows: bool = False
    classes: tuple[tuple[str, int], ...] = ()
    ignore_index: float | None = None
    min_labelled: float | None = None
    labelled_target: str | None = None

    @property
    def targets(self) -> tuple[Partner, ...]:
        """Return the target partners."""
        return tuple(p for p in self.partners if p.role == "target")


def window_of(y: int, x: int, tile: tuple[int, int], height: int, width: int) -> np.ndarray:
    """Return the (y, x, height, width) of the scene a tile at (y, x) covers, as int64."""
    return np.array([y, x, min(tile[0], height - y), min(tile[1], width - x)], np.int64)


def labelled_fraction(target: np.ndarray, y: int, x: int, tile: tuple[int, int], ignore: float | None) -> float:
    """Return the fraction of a tile's pixels that are inside the scene and not ``ignore`` (band 0 of ``target``)."""
    part = target[y:y + tile[0], x:x + tile[1], 0]
    labelled = part.size if ignore is None else int(np.count_nonzero(part != ignore))
    return labelled / (tile[0] * tile[1])


def kept_origins(spec: DenseSpec, grid: list[tuple[int, int]], rasters: dict[str, np.ndarray],
                 tile: tuple[int, int]) -> list[tuple[int, int]]:
    """Return the origins of ``grid`` that ``--min-labelled`` keeps (all of them without it)."""
    if spec.min_labelled is None or spec.labelled_target is None:
        return grid
    target = rasters[spec.labelled_target]
    return [(y, x) for y, x in grid if labelled_fraction(target, y, x, tile, spec.ignore_index) >= spec.min_labelled]


def class_pixels(target: np.ndarray, window: np.ndarray, classes: int, ignore: float | None, where: str) -> np.ndarray:
    """Return the pixels of each class 0..classes-1 in a one-band target tile's (H, W) window, as int32.

    Pixels equal to ``ignore`` are not counted. Any other value outside 0..classes-1 is an
    ImageReadError naming the file, the window and the value: a count that silently dropped it
    would weigh the tile wrongly.
    """
    values = target[:window[2], :window[3]]
    if ignore is not None:
        values = values[values != ignore]
    values = values.ravel()
    if values.size:
        low, high = values.min(), values.max()
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise ImageReadError(where, f"value {bad} in the tile at (y={window[0]}, x={window[1]}) is not a class "
                                        f"0..{classes - 1} (--num-classes {classes})"
                                        + ("" if ignore is None else f" nor the --ignore-index {ignore:g}"))
    return np.bincount(values.astype(np.int64), minlength=classes).astype(np.int32)


def tile_values(spec: DenseSpec, rasters: dict[str, np.ndarray], names: dict[str, str], scene: int,
                origin: tuple[int, int], tile: tuple[int, int], layout: str) -> dict[str, Any]:
    """Return the field values of the tile at ``origin`` (image and partner fields, window, class counts).

    ``rasters``: field name -> (H, W, C) array of the scene; ``names``: field name -> the file, for
    messages. A single-band target becomes a 2-D field; the others are in ``layout``.
    """
    y, x = origin
    height, width = rasters["image"].shape[:2]
    values: dict[str, Any] = {}
    targets = {p.name for p in spec.targets}
    for name, raster in rasters.items():
        is_target = name in targets
        fill = spec.ignore_index if is_target and spec.ignore_index is not None else 0
        part = cut_tile(raster, y, x, tile, fill)
        if is_target and part.shape[2] == 1:
            values[name] = np.ascontiguousarray(part[:, :, 0])
        else:
            values[name] = np.ascontiguousarray(part.transpose(2, 0, 1) if layout == "chw" else part)
    window = window_of(y, x, tile, height, width)
    if spec.windows:
        values[SCENE_FIELD] = np.int64(scene)
        values[WINDOW_FIELD] = window
    for name, classes in spec.classes:
        # a counted target has one band: its field value is the (H, W) tile just cut
        values[name + CLASS_PIXELS_SUFFIX] = class_pixels(values[name], window, classes, spec.ignore_index,
                                                          names[name])
    return values
