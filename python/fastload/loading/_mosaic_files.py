"""``fastload.Mosaic``'s files: finished scenes (written atomically) and the parts of unfinished ones.

A finished scene is ``OUT/<stem>.tif`` (planar ``(C, H, W)``, the scene's GeoTIFF tags copied, an OME pixel
size written back as OME metadata) or ``OUT/<stem>.npy``, written to a hidden temporary name, flushed to
disk and renamed into place, so a crash never leaves a file that looks complete.

Parts live in ``OUT/.mosaic-parts/rank-<r>/``: ``scene-<index>.npz`` per unfinished scene (the
accumulators in their bounding box, ``_mosaic_accum.SceneAccumulator.to_part``), ``ring.npz`` (the last
tiles a rank added, with their predictions: what the merge needs to count a tile repeated on two ranks
once) and, last, ``closed.json`` (the run's settings and the scenes the rank finished itself).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FastloadError
from ..format._georef import georef_extratags
from ..format._manifest import fsync_dir, write_json_atomic

PARTS_DIR = ".mosaic-parts"
CLOSED_NAME = "closed.json"
RING_NAME = "ring.npz"
FORMATS = ("tif", "npy")
_BIGTIFF_BYTES = 2**32 - 2**25  # past this a classic TIFF cannot address its data


def rank_dir(out_dir: Path, rank: int) -> Path:
    """Return the directory of rank ``rank``'s parts."""
    return out_dir / PARTS_DIR / f"rank-{rank}"


def part_path(directory: Path, index: int) -> Path:
    """Return the part file of scene ``index`` in a rank's directory."""
    return directory / f"scene-{index:08d}.npz"


def _atomic(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a hidden temporary beside ``path``, flush it to disk and rename it to ``path``."""
    tmp = path.with_name(f".{path.name[:200]}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_scene(out_dir: Path, stem: str, array: np.ndarray, fmt: str, georef: Mapping[str, Any] | None) -> Path:
    """Write one finished ``(C, H, W)`` scene as ``OUT/<stem>.<fmt>``, atomically; return its path."""
    path = out_dir / f"{stem}.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)  # a scene in a sub-folder of the sources: the same here
    if fmt == "npy":
        _atomic(path, lambda f: np.save(f, array, allow_pickle=False))
        return path
    import tifffile

    options: dict[str, Any] = {"photometric": "minisblack", "extratags": georef_extratags(georef),
                               "bigtiff": array.nbytes > _BIGTIFF_BYTES}
    if array.shape[0] > 1:  # one plane per channel; a single channel is a plain (1, H, W) page
        options["planarconfig"] = "separate"
    size = (georef or {}).get("pixel_size")
    if size:
        options["ome"] = True
        options["metadata"] = {"axes": "CYX", "PhysicalSizeX": size["x"], "PhysicalSizeY": size["y"],
                               "PhysicalSizeXUnit": size["unit"], "PhysicalSizeYUnit": size["unit"]}
    else:
        options["metadata"] = None
    _atomic(path, lambda f: tifffile.imwrite(f, array, **options))
    return path


def save_part(directory: Path, index: int, part: Mapping[str, np.ndarray]) -> None:
    """Write scene ``index``'s part (``SceneAccumulator.to_part``) into a rank's directory, atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = dict(part)
    _atomic(part_path(directory, index), lambda f: np.savez(f, **arrays))


def load_part(path: Path, blend: str, channels: int) -> dict[str, np.ndarray]:
    """Read a part and check its arrays agree with each other; FastloadError naming the file otherwise."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            part = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as err:
        raise FastloadError(f"{path}: unreadable mosaic part: {err}") from None
    keys = ("value", "winner") if blend == "clip" else ("num", "weight")
    if not {"tiles", "bbox", *keys} <= set(part):
        raise FastloadError(f"{path}: not a {blend!r} mosaic part (it has {sorted(part)})")
    tiles, bbox = part["tiles"], part["bbox"]
    y0, x0, y1, x1 = (int(v) for v in bbox) if bbox.shape == (4,) else (0, 0, -1, -1)
    plane, cube = part[keys[1]], part[keys[0]]
    if (tiles.ndim != 2 or tiles.shape[1] != 4 or plane.shape != (y1 - y0, x1 - x0)
            or cube.shape != (channels, y1 - y0, x1 - x0)):
        raise FastloadError(f"{path}: mosaic part of inconsistent shapes (bbox {bbox.tolist()}, {keys[0]} "
                            f"{list(cube.shape)}, {channels} channels)")
    return part


def save_ring(directory: Path, ring: list[tuple[int, tuple[int, int, int, int], np.ndarray]]) -> None:
    """Write the last tiles a rank added (scene, window, prediction), for the merge's repeat correction."""
    directory.mkdir(parents=True, exist_ok=True)
    if not ring:
        return
    keys = np.array([(s, *w) for s, w, _ in ring], np.int64)
    preds = np.stack([p.astype(np.float32) for _, _, p in ring])
    _atomic(directory / RING_NAME, lambda f: np.savez(f, keys=keys, preds=preds))


def load_ring(directory: Path) -> dict[tuple[int, tuple[int, int, int, int]], np.ndarray]:
    """Return a rank's ring as (scene, window) -> prediction (empty when it saved none)."""
    path = directory / RING_NAME
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys, preds = npz["keys"], npz["preds"]
    except (OSError, ValueError, KeyError) as err:
        raise FastloadError(f"{path}: unreadable mosaic ring: {err}") from None
    return {(int(k[0]), (int(k[1]), int(k[2]), int(k[3]), int(k[4]))): p for k, p in zip(keys, preds)}


def write_closed(directory: Path, doc: Mapping[str, Any]) -> None:
    """Write a rank's ``closed.json`` (its settings and finished scenes): the sign it closed normally."""
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / CLOSED_NAME, doc)


def read_closed(out_dir: Path, rank: int) -> dict[str, Any]:
    """Return rank ``rank``'s ``closed.json``; FastloadError when the rank did not close (yet)."""
    path = rank_dir(out_dir, rank) / CLOSED_NAME
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FastloadError(f"{path}: missing: rank {rank} has not closed its Mosaic (merge once every rank "
                            f"has closed)") from None
    except (OSError, ValueError) as err:
        raise FastloadError(f"{path}: unreadable: {err}") from None
    if not isinstance(doc, dict):
        raise FastloadError(f"{path}: not a mosaic rank record")
    return doc


def remove_parts(out_dir: Path, rank: int | None = None) -> None:
    """Remove one rank's parts (or all of them with ``rank`` None); the parts folder too once it is empty."""
    root = out_dir / PARTS_DIR
    shutil.rmtree(root if rank is None else rank_dir(out_dir, rank), ignore_errors=True)
    try:
        root.rmdir()
    except OSError:
        pass
