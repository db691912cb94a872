"""Scenes for the dense-tile benchmarks (benchmarks/test_dense.py): Sentinel-2-like GeoTIFFs with class masks.

Each scene is a 4-band uint16 GeoTIFF of 12-bit values (smooth fields plus sensor noise of a few
levels, as reflectances are), uncompressed and pixel-interleaved (GDAL's default layout), with the
GeoTIFF tags of a 10 m UTM grid, and a uint8 mask TIFF of the same stem in ``labels/`` whose classes
are blobs (the argmax of smooth random fields), so zstd meets data that compresses like real
imagery and real masks, not white noise. The files are uncompressed and contiguous so that the
DataLoader baseline can read any window through ``tifffile.memmap``: its fastest windowed read.

The scene side is ``TILE + k * STRIDE``, so the tiles cover every scene exactly (no padded edge tile)
and MONAI's sliding window visits the same windows as the tiles: the stitching peers then blend the
very same predictions at the very same places.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import tifffile

TILE, STRIDE = 256, 224
BANDS, CLASSES = 4, 6
IGNORE = 255


@dataclass(frozen=True)
class Scenes:
    """A folder of generated scenes: ``scenes/`` (images) and ``labels/`` (masks), same stems."""

    root: Path
    count: int
    side: int

    @property
    def images(self) -> Path:
        return self.root / "scenes"

    @property
    def labels(self) -> Path:
        return self.root / "labels"

    @property
    def tiles_per_scene(self) -> int:
        return ((self.side - TILE) // STRIDE + 1) ** 2

    @property
    def tiles(self) -> int:
        return self.count * self.tiles_per_scene

    @property
    def image_bytes(self) -> int:
        """Bytes of the scenes' pixels (what an image-only conversion reads)."""
        return self.count * self.side * self.side * BANDS * 2

    @property
    def mask_bytes(self) -> int:
        return self.count * self.side * self.side

    def stems(self) -> list[str]:
        return [f"s{i:02d}" for i in range(self.count)]

    def windows(self) -> list[tuple[int, int, int]]:
        """Return (scene index, y, x) of every tile, scene by scene, rows first."""
        starts = range(0, self.side - TILE + 1, STRIDE)
        return [(s, y, x) for s in range(self.count) for y in starts for x in starts]


def smooth_field(rng: np.random.Generator, side: int, cells: int) -> np.ndarray:
    """Return a ``side x side`` float32 field in about [-1, 1]: random values on a coarse grid, cubic-upsampled."""
    coarse = rng.standard_normal((cells, cells)).astype(np.float32)
    return cv2.resize(coarse, (side, side), interpolation=cv2.INTER_CUBIC)


def scene_arrays(rng: np.random.Generator, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (image ``(side, side, BANDS)`` uint16, mask ``(side, side)`` uint8) of one synthetic scene."""
    cells = max(4, side // 48)
    classes = np.stack([smooth_field(rng, side, cells) for _ in range(CLASSES)])
    mask = classes.argmax(axis=0).astype(np.uint8)
    base = smooth_field(rng, side, cells * 2)
    image = np.empty((side, side, BANDS), np.uint16)
    for b in range(BANDS):
        # Reflectance: a level per class (the land cover), texture, and sensor noise of a few levels.
        level = rng.uniform(600, 2800, CLASSES).astype(np.float32)[mask]
        band = level + 250 * base + 120 * smooth_field(rng, side, cells * 4) + rng.normal(0, 6, (side, side))
        image[..., b] = np.clip(band, 0, 4095).astype(np.uint16)
    return image, mask


def geotags(index: int) -> list[tuple[int, str, int, tuple[float, ...], bool]]:
    """Return ModelPixelScale and ModelTiepoint tags of a 10 m grid (tifffile ``extratags``)."""
    return [(33550, "d", 3, (10.0, 10.0, 0.0), True),
            (33922, "d", 6, (0.0, 0.0, 0.0, 400000.0 + 20000.0 * index, 5000000.0, 0.0), True)]


def make_scenes(root: Path, count: int, side: int, seed: int = 0) -> Scenes:
    """Write ``count`` scenes of ``side x side`` pixels under ``root`` (unless already there); return them."""
    if (side - TILE) % STRIDE:
        raise ValueError(f"scene side {side} is not {TILE} + k * {STRIDE}")
    scenes = Scenes(root, count, side)
    done = root / "done"
    if done.exists():
        return scenes
    scenes.images.mkdir(parents=True, exist_ok=True)
    scenes.labels.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, stem in enumerate(scenes.stems()):
        image, mask = scene_arrays(rng, side)
        tifffile.imwrite(scenes.images / f"{stem}.tif", image, photometric="minisblack", planarconfig="contig",
                         extratags=geotags(i))
        tifffile.imwrite(scenes.labels / f"{stem}.tif", mask, photometric="minisblack", extratags=geotags(i))
    done.touch()
    return scenes
