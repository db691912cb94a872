"""One scene being stitched by ``fastload.Mosaic``: its accumulators, tile by tile, and as saved parts.

The blends (``BLENDS``):

- ``"clip"``: each output pixel comes from the tile whose centre (the full tile's, ``th x tw``, so a padded
  edge tile's centre may lie outside the scene) is nearest the pixel's centre; ties go to the tile of the
  smaller ``(y, x)`` origin. The winner is a pure function of the pixel and the set of tiles covering it,
  so the result does not depend on the order tiles arrive in, nor on how they were split across threads,
  batches or ranks. Held per pixel: the value (the predictions' dtype) and the winning tile's id (int32)
  in the scene's table of tile origins.
- ``"average"``: the mean of every tile covering the pixel.
- ``"gaussian"``: the mean weighted by an importance map, as MONAI's ``sliding_window_inference``: a
  centred gaussian of sigma ``0.125 * tile size`` per axis, normalised to a maximum of 1 and floored at
  ``1e-3`` so that a tile's edges keep some weight (a pixel covered by edges only still gets a value).

The blends sum ``weight * prediction`` and ``weight`` in float32, as MONAI does (4 bytes per channel and
pixel, plus 4 per pixel), with torch's in-place fused ops (no temporary per tile); the result is
``sum / weight`` as float32, the same for any order of the tiles within float rounding. Pixels no tile
covers take ``result``'s ``fill``.

A part (``to_part``/``absorb``) is the accumulators cut to the bounding box of the tiles seen, with the
tile table; parts of the same scene (spilled, or from other ranks) merge into the same result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import FastloadError

BLENDS = ("clip", "average", "gaussian")
SIGMA_SCALE = 0.125
WEIGHT_FLOOR = 1e-3


def importance_map(th: int, tw: int, blend: str) -> np.ndarray:
    """Return the weight of each pixel of a ``th x tw`` tile under ``blend`` (float64; ones for average)."""
    if blend != "gaussian":
        return np.ones((th, tw), np.float64)
    axes = []
    for n in (th, tw):
        i = np.arange(n, dtype=np.float64)
        sigma = SIGMA_SCALE * n
        axes.append(np.exp(-0.5 * ((i - (n - 1) / 2) / sigma) ** 2))
    weights = np.outer(axes[0], axes[1])
    weights /= weights.max()
    return np.maximum(weights, WEIGHT_FLOOR)


def _squared_distance(py: np.ndarray, px: np.ndarray, oy: Any, ox: Any, th: int, tw: int) -> np.ndarray:
    """Return 4x the squared distance from pixel centres to the centres of tiles at origins ``(oy, ox)``."""
    return (2 * (py - oy) + 1 - th) ** 2 + (2 * (px - ox) + 1 - tw) ** 2


class SceneAccumulator:
    """The accumulators of one scene: ``add`` tiles, ``absorb`` parts, then ``result``."""

    _distance_dtype: type[np.signedinteger[Any]] = np.int64

    def __init__(self, index: int, height: int, width: int, channels: int, blend: str, tile: tuple[int, int],
                 weights: np.ndarray) -> None:
        self.index, self.height, self.width, self.channels, self.blend = index, height, width, channels, blend
        self.tile = tile
        self._distance_dtype = np.int32 if 2 * (2 * max(tile)) ** 2 < 2**31 else np.int64
        self.weights = weights  # the importance map of a whole tile (blends)
        self.tiles: dict[tuple[int, int, int, int], int] = {}  # window -> id (its row in origins)
        self._origins = np.zeros((16, 2), np.int64)  # row id: the tile's (y, x); grown by doubling
        self.bbox = [height, width, 0, 0]  # y0, x0, y1, x1 of the tiles seen
        self.value: np.ndarray | None = None  # clip: (C, H, W) in the predictions' dtype
        self.winner: np.ndarray | None = None  # clip: (H, W) int32 tile id, -1 where none
        self.best: np.ndarray | None = None  # clip: (H, W) the winner's squared distance (x4), NONE where none
        rows, cols = np.ogrid[0:tile[0], 0:tile[1]]
        self._d2 = _squared_distance(rows, cols, 0, 0, tile[0], tile[1]).astype(self._distance_dtype)
        self._weights32 = torch.from_numpy(np.ascontiguousarray(weights, np.float32))
        self.num: np.ndarray | None = None  # blends: (C, H, W) float32 sum of weight * prediction
        self.weight: np.ndarray | None = None  # blends: (H, W) float32 sum of weights

    @property
    def nbytes(self) -> int:
        """Return the bytes the accumulators hold."""
        return sum(a.nbytes for a in (self.value, self.winner, self.best, self.num, self.weight) if a is not None)

    @property
    def dtype(self) -> np.dtype | None:
        """Return the dtype of the values held (clip: the predictions'; blends: float32), None before a tile."""
        if self.blend != "clip":
            return np.dtype(np.float32)
        return None if self.value is None else self.value.dtype

    def _allocate(self, dtype: np.dtype) -> None:
        shape = (self.channels, self.height, self.width)
        if self.blend == "clip":
            if self.value is None:
                self.value = np.zeros(shape, dtype)
                self.winner = np.full((self.height, self.width), -1, np.int32)
                self.best = np.full((self.height, self.width), np.iinfo(self._distance_dtype).max,
                                    self._distance_dtype)
        elif self.num is None:
            self.num = np.zeros(shape, np.float32)
            self.weight = np.zeros((self.height, self.width), np.float32)

    def _register(self, window: tuple[int, int, int, int]) -> int:
        ident = self.tiles.get(window)
        if ident is None:
            ident = self.tiles[window] = len(self.tiles)
            if ident == len(self._origins):
                self._origins = np.concatenate([self._origins, np.zeros_like(self._origins)])
            self._origins[ident] = window[0], window[1]
            y, x, h, w = window
            b = self.bbox
            b[0], b[1], b[2], b[3] = min(b[0], y), min(b[1], x), max(b[2], y + h), max(b[3], x + w)
        return ident

    def add(self, window: tuple[int, int, int, int], prediction: np.ndarray) -> bool:
        """Add one tile's ``(C, th, tw)`` prediction for ``window`` (checked by the caller); False if seen before."""
        if window in self.tiles:
            return False
        y, x, h, w = window
        crop = prediction[:, :h, :w]
        self._allocate(crop.dtype)
        ident = self._register(window)
        if self.blend == "clip":
            self._clip_merge(y, x, crop, ident, self._d2[:h, :w])
        else:
            assert self.num is not None and self.weight is not None
            region = torch.from_numpy(self.num)[:, y:y + h, x:x + w]
            values = torch.from_numpy(crop if crop.dtype == np.float32 else crop.astype(np.float32))
            weights = self._weights32[:h, :w]
            if self.blend == "average":
                region.add_(values)
            else:
                region.addcmul_(values, weights)
            torch.from_numpy(self.weight)[y:y + h, x:x + w].add_(weights)
        return True

    def _clip_merge(self, y: int, x: int, values: np.ndarray, ids: int | np.ndarray, d_new: np.ndarray) -> None:
        """Take ``values`` where tiles ``ids`` (one id, or one per pixel, -1: none) beat the winners at ``(y, x)``.

        ``d_new``: the new tiles' squared distances (the dtype's maximum where none). Beating is being nearer,
        or as near with a smaller ``(y, x)`` origin (compared only on those ties, which are few).
        """
        assert self.value is not None and self.winner is not None and self.best is not None
        h, w = d_new.shape
        best = self.best[y:y + h, x:x + w]
        current = self.winner[y:y + h, x:x + w]
        take = d_new < best
        ties = np.flatnonzero(d_new == best)  # both have a tile there: the maximum is never a real distance
        if ties.size and (isinstance(ids, int) or bool((ids.flat[ties] >= 0).any())):
            new = np.full(ties.size, ids) if isinstance(ids, int) else ids.flat[ties]
            new_y, new_x = self._origins[new, 0], self._origins[new, 1]
            cur = current.flat[ties]
            cur_y, cur_x = self._origins[cur, 0], self._origins[cur, 1]
            take.flat[ties] = (new >= 0) & ((new_y < cur_y) | ((new_y == cur_y) & (new_x < cur_x)))
        np.copyto(self.value[:, y:y + h, x:x + w], values, where=take[None])
        np.copyto(current, ids, where=take)
        np.copyto(best, d_new, where=take)

    def to_part(self) -> dict[str, np.ndarray]:
        """Return the arrays of a part: the accumulators inside the bounding box, the tile windows, the box."""
        y0, x0, y1, x1 = self.bbox
        windows = np.zeros((len(self.tiles), 4), np.int64)
        for window, ident in self.tiles.items():
            windows[ident] = window
        part = {"tiles": windows, "bbox": np.array(self.bbox, np.int64)}
        if self.blend == "clip":
            assert self.value is not None and self.winner is not None
            part["value"], part["winner"] = self.value[:, y0:y1, x0:x1], self.winner[y0:y1, x0:x1]
        else:
            assert self.num is not None and self.weight is not None
            part["num"], part["weight"] = self.num[:, y0:y1, x0:x1], self.weight[y0:y1, x0:x1]
        return part

    def absorb(self, part: dict[str, np.ndarray]) -> list[tuple[int, int, int, int]]:
        """Merge a part (``to_part``'s arrays, checked by the caller); return the windows this already had.

        Clip merges by the same rule as ``add``, so a repeated tile changes nothing. The blends add the
        sums: a repeated tile is counted twice, and the caller takes it out (``subtract``).
        """
        windows = [tuple(int(v) for v in row) for row in part["tiles"]]
        repeated = [wnd for wnd in windows if wnd in self.tiles]
        if not windows:
            return repeated
        y0, x0, y1, x1 = (int(v) for v in part["bbox"])
        if self.blend == "clip":
            self._allocate(part["value"].dtype)
            mapping = np.array([self._register(wnd) for wnd in windows], np.int32)  # type: ignore[arg-type]
            ids = np.where(part["winner"] >= 0, mapping[np.maximum(part["winner"], 0)], -1).astype(np.int32)
            py, px = np.ogrid[y0:y1, x0:x1]
            origin = self._origins[np.maximum(ids, 0)]
            d_new = _squared_distance(py, px, origin[..., 0], origin[..., 1], *self.tile)
            d_new = np.where(ids >= 0, d_new, np.iinfo(self._distance_dtype).max).astype(self._distance_dtype)
            self._clip_merge(y0, x0, part["value"], ids, d_new)
        else:
            self._allocate(np.dtype(np.float32))
            assert self.num is not None and self.weight is not None
            for wnd in windows:
                self._register(wnd)  # type: ignore[arg-type]
            self.num[:, y0:y1, x0:x1] += part["num"]
            self.weight[y0:y1, x0:x1] += part["weight"]
        return repeated

    def subtract(self, window: tuple[int, int, int, int], prediction: np.ndarray) -> None:
        """Take one copy of a tile counted twice out of the blends' sums (its prediction as ``add`` had it)."""
        assert self.num is not None and self.weight is not None
        y, x, h, w = window
        weights = self._weights32[:h, :w]
        values = torch.from_numpy(np.ascontiguousarray(prediction[:, :h, :w], np.float32))
        torch.from_numpy(self.num)[:, y:y + h, x:x + w].addcmul_(values, weights, value=-1)
        torch.from_numpy(self.weight)[y:y + h, x:x + w].sub_(weights)

    def result(self, dtype: np.dtype | None, fill: float | None = None, where: str = "") -> np.ndarray:
        """Return the stitched ``(C, H, W)`` scene (frees the accumulators); ``dtype`` casts it.

        Pixels no tile covered (edge pixels past the last whole tile of a dataset converted with
        ``--edge drop``; tiles ``--min-labelled`` dropped) take ``fill`` (NaN allowed in a float
        output); without ``fill`` they are a FastloadError naming ``where``: a value there would be
        a guess.
        """
        if self.blend == "clip":
            out = self.value if self.value is not None else np.zeros((self.channels, self.height, self.width))
            covered = self.winner >= 0 if self.winner is not None else np.zeros((self.height, self.width), bool)
        else:
            assert self.num is not None and self.weight is not None
            out = np.zeros(self.num.shape, dtype if dtype is not None else np.float32)
            covered = self.weight > 0
            np.divide(self.num, self.weight, out=out, where=covered, casting="same_kind")
        self.value = self.winner = self.best = self.num = self.weight = None
        out = out if dtype is None or out.dtype == dtype else out.astype(dtype)
        if not covered.all():
            if fill is None:
                raise FastloadError(f"{where}: {int(covered.size - covered.sum())} of {covered.size} pixel(s) no "
                                    "tile covers (a dataset cut with --edge drop leaves the edges past the last "
                                    "whole tile out: convert scenes to predict over with --edge pad; "
                                    "--min-labelled drops tiles): pass Mosaic(..., fill=VALUE) to write them as "
                                    "VALUE (fill=float('nan') in a float output)")
            limits = np.iinfo(out.dtype) if out.dtype.kind in "iu" else None
            if limits is not None and (not np.isfinite(fill) or fill != int(fill)
                                       or not limits.min <= fill <= limits.max):
                raise FastloadError(f"{where}: fill {fill!r} is not a value of the output dtype {out.dtype}")
            out[:, ~covered] = fill
        return out
