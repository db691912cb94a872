"""Where each tile came from: the manifest's ``scenes`` list and the ``scene``/``window`` sample fields.

A dataset cut from whole scenes (``preprocess_tiles --tile-size``, or ``write_arrays(..., scenes=...)``)
records in ``manifest.extra["scenes"]`` one entry per source scene, and in each sample the index of its
scene (field ``scene``, int64 ``()``) and the part of it the tile covers (field ``window``, int64 ``(4,)``:
``(y, x, height, width)`` in scene pixels, held at the tile's top-left). Each entry::

    {"path": "sub/a.tif", "height": 1000, "width": 1200, "tiles": 20,
     "files": {"masks": "sub/a.png"}, "georef": {...}}     # files and georef optional

``tiles`` is how many samples of this dataset come from the scene (what ``fastload.Mosaic`` waits for
before it writes the scene); ``georef`` is ``_georef.py``'s. The manifest is untrusted: ``check_scenes``
validates every value (types, booleans are not integers, sizes positive and bounded, paths non-empty
strings without NUL, the georef) and raises a DatasetError naming the manifest and the scene index.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._extension import require as native_core
from ..errors import DatasetError, FastloadError
from ._georef import GeorefProblem, check_georef, read_scene_info
from ._record import max_sample_bytes

SCENE_FIELD = "scene"
WINDOW_FIELD = "window"
CLASS_PIXELS_SUFFIX = "_class_pixels"
SCENES_KEY = "scenes"  # the manifest's key

MAX_SIDE = 2**31 - 1  # a scene's height or width
MAX_PIXELS = 2**40  # height * width
MAX_TILES = 2**63 - 1
MAX_SCENES = 1 << 24
MAX_PATH_CHARS = 4096
MAX_FILES = 64
MAX_FIELD_CHARS = 128
_KEYS = {"path", "height", "width", "tiles", "files", "georef"}
_REQUIRED = {"path", "height", "width", "tiles"}


@dataclass(frozen=True)
class Scene:
    """One source scene: its path (or name), size in pixels, tile count, partner files and georef."""

    path: str
    height: int
    width: int
    tiles: int
    files: dict[str, str]
    georef: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        """Return the manifest's JSON form."""
        return scene_doc(self.path, self.height, self.width, self.tiles, self.files, self.georef)


def scene_doc(path: str, height: int, width: int, tiles: int, files: Mapping[str, str] | None = None,
              georef: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return one entry of the manifest's ``scenes`` (``files`` and ``georef`` left out when empty)."""
    doc: dict[str, Any] = {"path": path, "height": height, "width": width, "tiles": tiles}
    if files:
        doc["files"] = dict(files)
    if georef:
        doc["georef"] = dict(georef)
    return doc


class _Problem(ValueError):
    pass


def check_scenes(doc: Any, where: str, error: type[FastloadError] = DatasetError) -> list[Scene]:
    """Validate a ``scenes`` list (untrusted) and return its scenes; raise ``error`` naming ``where`` and the index.

    ``where`` names the document (a manifest's path); ``error`` is DatasetError for a manifest, an
    ArgumentError for a caller's argument. The message reads ``{where}: scenes[3].height: ...``.
    """
    if not isinstance(doc, list):
        raise error(f"{where}: scenes: expected a list, not {type(doc).__name__}")
    if len(doc) > MAX_SCENES:
        raise error(f"{where}: scenes: {len(doc)} scenes; at most {MAX_SCENES}")
    scenes = []
    for i, entry in enumerate(doc):
        try:
            scenes.append(_check_scene(entry))
        except (_Problem, GeorefProblem) as err:
            raise error(f"{where}: scenes[{i}]{'' if str(err).startswith('.') else ': '}{err}") from None
    return scenes


def _check_scene(entry: Any) -> Scene:
    if not isinstance(entry, dict):
        raise _Problem(f"expected an object, not {type(entry).__name__}")
    missing = sorted(_REQUIRED - set(entry))
    if missing:
        raise _Problem(f"missing key {missing[0]!r}")
    unknown = sorted(str(k)[:40] for k in set(entry) - _KEYS)
    if unknown:
        raise _Problem(f"unknown key {unknown[0]!r}")
    path = _path(entry["path"], ".path")
    height = _int(entry["height"], ".height", 1, MAX_SIDE)
    width = _int(entry["width"], ".width", 1, MAX_SIDE)
    if height * width > MAX_PIXELS:
        raise _Problem(f"{height} x {width} pixels; a scene holds at most 2**40")
    tiles = _int(entry["tiles"], ".tiles", 0, MAX_TILES)
    files = _files(entry.get("files", {}))
    georef = entry.get("georef")
    if georef is not None:
        georef = check_georef(georef, ".georef")
    return Scene(path, height, width, tiles, files, georef or None)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"{where}: {str(value)[:40]!r} is not an integer")
    if not lo <= value <= hi:
        raise _Problem(f"{where}: {value} is out of range [{lo}, {hi}]")
    return value


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _Problem(f"{where}: expected a non-empty string")
    if len(value) > MAX_PATH_CHARS or "\0" in value:
        raise _Problem(f"{where}: a path is 1 to {MAX_PATH_CHARS} characters without NUL")
    return value


def _files(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_FILES:
        raise _Problem(f".files: expected an object of at most {MAX_FILES} field names to paths")
    for name, path in value.items():
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_FIELD_CHARS or not name.isprintable():
            raise _Problem(f".files: field name {str(name)[:40]!r} is not 1 to {MAX_FIELD_CHARS} printable characters")
        _path(path, f".files[{name[:40]!r}]")
    return dict(value)


def scenes_of(manifest: Any, directory: str | os.PathLike[str]) -> list[Scene] | None:
    """Return the validated scenes of a manifest (a ``Manifest``), or None when it records none.

    ``directory`` is the dataset's (named in errors). With a ``scene`` field in the schema, the tile
    counts must add up to the dataset's samples (every sample comes from a scene).
    """
    doc = manifest.extra.get(SCENES_KEY)
    if doc is None:
        return None
    where = str(Path(directory) / "manifest.json")
    scenes = check_scenes(doc, where)
    if any(f.name == SCENE_FIELD for f in manifest.fields):
        tiles = sum(s.tiles for s in scenes)
        if tiles != manifest.total:
            raise DatasetError(f"{where}: scenes: the tile counts add up to {tiles}, the dataset holds "
                               f"{manifest.total} samples")
    return scenes


MAX_NAME_BYTES = 200  # one component of an output name (file systems allow 255, less a temporary's suffix)


def scene_stem(scene: Scene) -> str:
    """Return the name an output for ``scene`` takes under an output folder: its path without the suffix.

    ``sub/a.tif`` gives ``sub/a`` (outputs mirror the sources' folders, so scenes of one name in two
    folders stay apart). Raises a ValueError for a path that could leave the folder or no file system
    takes: absolute, a drive, ``.`` or ``..`` parts, control characters, a part over 200 bytes.
    """
    parts = scene.path.replace("\\", "/").split("/")
    if parts and "." in parts[-1]:
        parts[-1] = parts[-1].rsplit(".", 1)[0]
    for part in parts:
        if part in ("", ".", "..") or part.startswith(".") or ":" in part or not part.isprintable():
            raise _Problem(f"{scene.path!r} is no relative path of plain names (an output is named by it)")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise _Problem(f"{scene.path!r} has a part over {MAX_NAME_BYTES} bytes")
    return "/".join(parts)


def scene_items(items: Any, where: str, error: type[FastloadError]) -> list[dict[str, Any]]:
    """Return a writer's ``scenes`` as manifest entries: dicts copied, TIFF paths read (``read_scene_info``).

    A path is recorded by its file name, with its size and georef. Every entry is validated
    (``check_scenes``) except that ``tiles`` may be missing, for a writer to count.
    """
    if isinstance(items, (str, bytes, os.PathLike)) or not isinstance(items, Sequence):
        raise error(f"{where}: scenes: expected a list of scene dicts or TIFF paths, not {type(items).__name__}")
    docs: list[Any] = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            info = read_scene_info(item)
            doc = scene_doc(Path(item).name, info["height"], info["width"], 0, None, info["georef"])
            del doc["tiles"]
            docs.append(doc)
        else:
            docs.append(dict(item) if isinstance(item, Mapping) else item)  # anything else: check_scenes says what
    check_scenes([{"tiles": 0, **d} if isinstance(d, dict) else d for d in docs], where, error)
    return docs


def build_scenes(items: Any, counts: Sequence[int] | None, where: str, error: type[FastloadError]) -> list[Scene]:
    """Return the scenes a writer records: ``items`` are entries (dicts as in the manifest) or TIFF paths.

    ``scene_items`` reads the paths. ``counts`` (samples per scene, from the data's ``scene`` field) fill
    ``tiles``, and must agree with a ``tiles`` an entry gives; without them every entry needs its
    ``tiles``. Validated by ``check_scenes``.
    """
    docs = scene_items(items, where, error)
    if counts is not None and len(counts) != len(docs):
        raise error(f"{where}: scenes: {len(docs)} scenes, but the scene field counts {len(counts)}")
    for i, doc in enumerate(docs):
        if counts is not None:
            given = doc.get("tiles")
            if given is not None and given != counts[i]:
                raise error(f"{where}: scenes[{i}].tiles: {str(given)[:40]!r}, but {counts[i]} samples have "
                            f"scene {i}")
            doc["tiles"] = int(counts[i])
        elif "tiles" not in doc:
            raise error(f"{where}: scenes[{i}]: no 'tiles': give the number of samples from this scene, or a "
                        f"{SCENE_FIELD!r} field to count them")
    return check_scenes(docs, where, error)


def check_scene_indices(scene: Any, count: int, first: int, where: str, error: type[FastloadError]) -> np.ndarray:
    """Return samples' ``scene`` indices (shape ``(n,)``) as int64, checked to name one of ``count`` scenes.

    ``error`` names the first sample (numbered from ``first``) whose index is out of range.
    """
    index = np.asarray(scene)
    if index.dtype.kind not in "iu" or index.ndim != 1:
        raise error(f"{where}: the {SCENE_FIELD!r} field must hold integers of shape (), not {index.dtype} "
                    f"{list(index.shape[1:])}")
    bad = np.flatnonzero((index < 0) | (index >= count))
    if bad.size:
        k = int(bad[0])
        raise error(f"{where}: sample {first + k}: scene {int(index[k])} is out of range for {count} scenes")
    return index.astype(np.int64)


def check_windows(scenes: Sequence[Scene], scene: Any, window: Any, first: int, where: str,
                  error: type[FastloadError]) -> None:
    """Check samples' ``scene`` indices (shape ``(n,)``) and ``window``s (``(n, 4)`` or None) against ``scenes``.

    Every index must name a scene and every window ``(y, x, height, width)`` lie inside it with a positive
    size; ``error`` names the first sample that does not (numbered from ``first``) and its scene.
    """
    index = check_scene_indices(scene, len(scenes), first, where, error)
    if window is None:
        return
    win = np.asarray(window)
    if win.dtype.kind not in "iu" or win.shape != (len(index), 4):
        raise error(f"{where}: the {WINDOW_FIELD!r} field must hold integers of shape (4,) per sample, not "
                    f"{win.dtype} {list(win.shape)}")
    win = win.astype(np.int64)
    heights = np.array([s.height for s in scenes], np.int64)[index]
    widths = np.array([s.width for s in scenes], np.int64)[index]
    y, x, h, w = win.T
    outside = (y < 0) | (x < 0) | (h < 1) | (w < 1) | (h > heights - y) | (w > widths - x)
    bad = np.flatnonzero(outside)
    if bad.size:
        k = int(bad[0])
        s = scenes[int(index[k])]
        raise error(f"{where}: sample {first + k}: window (y, x, height, width) = {tuple(int(v) for v in win[k])} "
                    f"is not inside scene {int(index[k])} ({s.path}, {s.height} x {s.width})")


def read_scene_fields(directory: str | os.PathLike[str], manifest: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """Return every sample's ``scene`` (int64 ``(n,)``) and ``window`` (``(n, 4)``, None without the field).

    Read back from the dataset's shards in ``directory`` (every record's checksum verified) through the
    native decoders: what a writer counts once the samples are written.
    """
    fields = list(manifest.fields)
    names = [f.name for f in fields]
    wanted = {n: fields[names.index(n)] for n in (SCENE_FIELD, WINDOW_FIELD) if n in names}
    total = manifest.total
    rows = {n: np.empty(total * f.nbytes, np.uint8) for n, f in wanted.items()}
    fingerprints = manifest.record_fingerprints()
    start = 0
    for s, shard in enumerate(manifest.shards):
        records = native_core().ShardRecords(str(Path(directory) / shard.file), shard.count,
                                             [f.native_spec for f in fields], True, manifest.format_version,
                                             fingerprints[s], max_sample_bytes())
        out = [rows[f.name][start * f.nbytes:] if f.name in rows else None for f in fields]
        records.decode_rows(np.arange(shard.count, dtype=np.uint64), np.arange(shard.count, dtype=np.uint64), out)
        start += shard.count
    arrays = {n: rows[n].view(f.np_dtype).reshape(total, *f.shape) for n, f in wanted.items()}
    scene = arrays[SCENE_FIELD].reshape(total) if SCENE_FIELD in arrays else np.zeros(0, np.int64)
    return scene, arrays.get(WINDOW_FIELD)
