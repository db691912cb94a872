"""Cutting images into tiles: the grid of tile origins and the tiles themselves."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError


def tile_origins(length: int, tile: int, stride: int, edge: str) -> list[int]:
    """Return the start offsets of tiles along one axis.

    ``edge="drop"`` keeps only tiles that fit entirely; ``edge="pad"`` adds tiles
    until every pixel is covered, the last ones padded with zeros.
    """
    if tile <= 0 or stride <= 0:
        raise ArgumentError(f"tile size {tile} and stride {stride} must be positive")
    if edge == "drop":
        return list(range(0, length - tile + 1, stride))
    if edge != "pad":
        raise ArgumentError(f"edge must be 'drop' or 'pad', not {edge!r}")
    origins = []
    start = 0
    while start < length:
        origins.append(start)
        if start + tile >= length:
            break
        start += stride
    return origins


def tile_grid(height: int, width: int, tile: tuple[int, int], stride: tuple[int, int],
              edge: str) -> list[tuple[int, int]]:
    """Return the (y, x) origins of every tile of an image, row by row."""
    ys = tile_origins(height, tile[0], stride[0], edge)
    xs = tile_origins(width, tile[1], stride[1], edge)
    return [(y, x) for y in ys for x in xs]


def cut_tile(image: np.ndarray, y: int, x: int, tile: tuple[int, int], fill: float = 0) -> np.ndarray:
    """Return the tile at (y, x) of an (H, W, C) image, filled with ``fill`` where it runs past the edge."""
    th, tw = tile
    part = image[y : y + th, x : x + tw]
    if part.shape[0] == th and part.shape[1] == tw:
        return part
    out = np.full((th, tw, image.shape[2]), fill, dtype=image.dtype)
    out[: part.shape[0], : part.shape[1]] = part
    return out
