"""Merging ``fastload.Mosaic``'s parts from every rank into finished scenes.

No rank knows when a scene it shares with others is complete, so each rank saves what it holds of its
unfinished scenes at close (``_mosaic_files``), and the merge adds the parts of each scene up: clip by the
same nearest-centre rule as one process (so the bytes are the same), the blends by adding their sums. A
tile that two ranks both predicted (a loader's padding repeats the last samples, ``even_batches``) is
counted once: clip needs nothing, the blends take the extra copies out with the predictions each rank kept
of its last tiles (the ring). A scene whose parts do not add up to its ``tiles`` is reported missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FastloadError
from ..format._scenes import Scene
from ._mosaic_accum import SceneAccumulator, importance_map
from ._mosaic_files import load_part, load_ring, part_path, rank_dir, read_closed, write_scene

SETTINGS = ("blend", "channels", "format", "dtype", "world_size", "dataset", "fill")


@dataclass(frozen=True)
class MergeJob:
    """What a merge needs: the dataset's scenes and output names, the output folder, the run's settings."""

    scenes: Sequence[Scene]
    stems: Sequence[str]
    out_dir: Path
    settings: dict[str, Any]  # SETTINGS, and "tile": [th, tw] or None


def run_settings(out_dir: Path, world_size: int | None = None) -> dict[str, Any]:
    """Return the settings every rank recorded (they must agree); FastloadError naming the rank that differs."""
    first = read_closed(out_dir, 0)
    world = first.get("world_size") if world_size is None else world_size
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise FastloadError(f"{out_dir}: rank 0 recorded world_size {world!r}")
    settings = {k: first.get(k) for k in SETTINGS}
    tiles = {tuple(first["tile"])} if first.get("tile") else set()
    for r in range(1, world):
        doc = read_closed(out_dir, r)
        differs = [k for k in SETTINGS if doc.get(k) != settings[k]]
        if differs:
            raise FastloadError(f"{out_dir}: rank {r} ran with other settings than rank 0 "
                                f"({', '.join(f'{k}={doc.get(k)!r} against {settings[k]!r}' for k in differs)})")
        if doc.get("tile"):
            tiles.add(tuple(doc["tile"]))
    if len(tiles) > 1:
        raise FastloadError(f"{out_dir}: the ranks saw predictions of different tile sizes {sorted(tiles)}")
    settings["tile"] = list(tiles.pop()) if tiles else None
    return settings


def merge_ranks(job: MergeJob, only_rank: int | None = None) -> tuple[list[Path], list[str]]:
    """Merge the parts of every scene (those with ``index % world_size == only_rank`` if given).

    Return the files written and, per scene that stays incomplete, a line saying how many tiles it lacks.
    """
    settings = job.settings
    world, blend, channels = settings["world_size"], settings["blend"], settings["channels"]
    done: set[int] = set()
    for r in range(world):
        done.update(int(i) for i in read_closed(job.out_dir, r).get("done", []))
    dirs = [rank_dir(job.out_dir, r) for r in range(world)]
    rings = [load_ring(d) for d in dirs] if blend != "clip" else [{} for _ in dirs]
    tile = (int(settings["tile"][0]), int(settings["tile"][1])) if settings["tile"] else None
    weights = importance_map(tile[0], tile[1], blend) if tile else np.ones((1, 1))
    dtype = np.dtype(settings["dtype"]) if settings["dtype"] else None
    written, missing = [], []
    for i, scene in enumerate(job.scenes):
        if (only_rank is not None and i % world != only_rank) or i in done or scene.tiles == 0:
            continue
        parts = [(r, part_path(d, i)) for r, d in enumerate(dirs) if part_path(d, i).exists()]
        if not parts or tile is None:
            missing.append(f"{scene.path} (scene {i}): {scene.tiles} of {scene.tiles} tiles missing")
            continue
        acc = SceneAccumulator(i, scene.height, scene.width, channels, blend, tile, weights)
        holders: dict[tuple[int, int, int, int], list[int]] = {}
        for r, path in parts:
            part = load_part(path, blend, channels)
            _check_part(path, part, scene, acc)
            acc.absorb(part)
            for row in part["tiles"]:
                holders.setdefault((int(row[0]), int(row[1]), int(row[2]), int(row[3])), []).append(r)
        if blend != "clip":
            _count_once(acc, i, scene, holders, rings)
        if len(acc.tiles) < scene.tiles:
            missing.append(f"{scene.path} (scene {i}): {scene.tiles - len(acc.tiles)} of {scene.tiles} tiles missing")
            continue
        if len(acc.tiles) > scene.tiles:
            raise FastloadError(f"{scene.path} (scene {i}): {len(acc.tiles)} different tiles, the manifest says "
                                f"{scene.tiles}")
        stitched = acc.result(dtype, _fill_of(settings.get("fill")), f"{scene.path} (scene {i})")
        written.append(write_scene(job.out_dir, job.stems[i], stitched, settings["format"], scene.georef))
    return written, missing


def _fill_of(recorded: Any) -> float | None:
    """Return the ``fill`` a rank recorded (``"nan"`` for NaN, which JSON cannot hold)."""
    if recorded == "nan":
        return float("nan")
    if recorded is None or (isinstance(recorded, (int, float)) and not isinstance(recorded, bool)):
        return recorded
    raise FastloadError(f"a rank recorded fill {recorded!r}, not a number")


def _check_part(path: Path, part: dict[str, np.ndarray], scene: Scene, acc: SceneAccumulator) -> None:
    y0, x0, y1, x1 = (int(v) for v in part["bbox"])
    tiles = part["tiles"]
    if not (0 <= y0 <= y1 <= scene.height and 0 <= x0 <= x1 <= scene.width) or (
            len(tiles) and (tiles[:, 0].min() < y0 or tiles[:, 1].min() < x0 or (tiles[:, 0] + tiles[:, 2]).max() > y1
                            or (tiles[:, 1] + tiles[:, 3]).max() > x1)):
        raise FastloadError(f"{path}: bounding box {[y0, x0, y1, x1]} does not fit scene {scene.path} "
                            f"({scene.height} x {scene.width}) or its tiles")
    if acc.blend == "clip":
        if acc.dtype is not None and part["value"].dtype != acc.dtype:
            raise FastloadError(f"{path}: predictions of dtype {part['value'].dtype}, another rank's are {acc.dtype}")
        if len(part["winner"]) and part["winner"].max(initial=-1) >= len(tiles):
            raise FastloadError(f"{path}: a pixel names tile {int(part['winner'].max())} of {len(tiles)}")


def _count_once(acc: SceneAccumulator, index: int, scene: Scene,
                holders: dict[tuple[int, int, int, int], list[int]],
                rings: Sequence[dict[tuple[int, tuple[int, int, int, int]], np.ndarray]]) -> None:
    """Take out the extra copies of tiles that several ranks added (the blends' sums counted each)."""
    for window, ranks in holders.items():
        if len(ranks) < 2:
            continue
        kept = [rings[r][(index, window)] for r in ranks if (index, window) in rings[r]]
        if len(kept) < len(ranks) - 1:
            raise FastloadError(f"{scene.path} (scene {index}): tile at window {window} was added on ranks {ranks}, "
                                f"and too long before their close to be counted once; give each rank distinct "
                                f"samples (ShardLoader(even_batches=False)) or use blend='clip'")
        for prediction in kept[:len(ranks) - 1]:
            acc.subtract(window, prediction)
