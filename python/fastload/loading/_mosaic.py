"""``fastload.Mosaic``: whole-scene prediction, stitched from the predictions of a dataset's tiles.

A dataset cut from scenes (``preprocess_tiles --tile-size``, ``write_arrays(..., scenes=...)``) records
each scene in its manifest and, in each sample, the ``scene`` it came from and the ``window``
``(y, x, height, width)`` it covers. Run a model over the tiles and hand each batch with its predictions to
``Mosaic.add``; a scene is written as ``OUT/<its path without suffix>.tif`` (or ``.npy``) as soon as all its
tiles have arrived, and freed, so memory follows the scenes in flight, not the dataset::

    loader = fastload.ShardLoader("tiles/", batch_size=32, shuffle=False)
    with fastload.Mosaic("tiles/", "predicted/", channels=5, blend="gaussian") as mosaic:
        for batch in loader:
            mosaic.add(batch, model(batch["image"].float()))

How overlapping tiles combine (``blend``) is explained in ``_mosaic_accum.py``: ``"clip"`` (nearest tile
centre; integer predictions allowed; the bytes do not depend on batch order, threads or ranks),
``"average"`` and ``"gaussian"`` (MONAI's importance map; float32 output). Several ranks: each saves its
unfinished scenes as parts at close and the scenes are merged (``_mosaic_merge.py``): by the ranks
themselves when ``torch.distributed`` is initialised, else by ``Mosaic.merge`` run once after every rank
closed. ``out_dir`` must then be one folder every rank sees (a shared file system across nodes).
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentTypeError, DatasetError, FastloadError, FastloadWarning
from ..format._codecs import guess_layout
from ..format._manifest import Manifest, load_manifest
from ..format._scenes import SCENE_FIELD, WINDOW_FIELD, Scene, check_windows, scene_stem, scenes_of
from ..format._splits import resolve_dataset_path
from ..storage import is_remote
from ._distributed import resolve_distributed
from ._mosaic_accum import BLENDS, SceneAccumulator, importance_map
from ._mosaic_files import (
    FORMATS,
    load_part,
    part_path,
    rank_dir,
    remove_parts,
    save_part,
    save_ring,
    write_closed,
    write_scene,
)
from ._mosaic_merge import MergeJob, merge_ranks, run_settings

MAX_CHANNELS = 1 << 16
WRITES_IN_FLIGHT = 1  # finished scenes waiting for the writer thread (one more is being written)
Window = tuple[int, int, int, int]


class Mosaic:
    """Stitch tile predictions back into whole scenes, written as each scene completes.

    ``path``: the dataset the tiles come from (a directory; ``split=`` for a root with splits; a URL of
    object storage with ``storage_options`` as ``ShardDataset``: only its manifest is read). ``out_dir``:
    where ``<the scene's path without its suffix>.tif`` (planar ``(C, H, W)``, the scene's GeoTIFF tags and OME pixel
    size copied) or ``.npy`` go; an existing file of that name is replaced. ``channels``: C, checked on
    every batch. ``blend``: ``"clip"``, ``"average"`` or ``"gaussian"`` (``_mosaic_accum.py``). ``dtype``:
    the output's (default: the predictions' for clip, which must cast to it safely; float32 for the blends,
    which take a float dtype only).

    Memory: a scene being stitched holds ``C * H * W`` values and an int32 per pixel (clip) or
    ``4 * (C + 1) * H * W`` bytes (float32 sums, the blends). Past ``max_scenes_in_memory`` scenes in
    flight, the one least recently added to is saved to ``OUT/.mosaic-parts/`` and read back when its next
    tile comes (with a FastloadWarning the first time: an order that spreads scenes, ``shuffle=True``,
    makes that slow; predict with ``shuffle=False``).

    ``rank``, ``world_size``: default from ``torch.distributed`` when initialised. With several ranks a
    scene a rank saw whole is written by it; the rest are merged at ``close`` (see the module docstring).
    ``fill``: the value of pixels no tile covers (edges past the last whole tile of a dataset cut
    with ``--edge drop``; tiles ``--min-labelled`` dropped), NaN allowed for a float output; without
    it such pixels are an error (convert the scenes to predict over with ``--edge pad``).

    Use it as a context manager: a normal exit closes it (FastloadError listing the scenes that lack tiles,
    with how many); an exception leaves no unfinished scene behind. ``written`` lists the files this
    object wrote. Constructing one removes the parts its rank left in ``out_dir`` before (a crashed run's;
    run ``Mosaic.merge`` first if they are a finished run's).
    """

    def __init__(self, path: str | os.PathLike[str], out_dir: str | os.PathLike[str], channels: int,
                 blend: str = "clip", format: str = "tif", *, dtype: Any = None, rank: int | None = None,
                 world_size: int | None = None, max_scenes_in_memory: int = 8, split: str | None = None,
                 storage_options: Any = None, fill: float | None = None) -> None:
        if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
            raise ArgumentError(f"channels must be an integer in [1, {MAX_CHANNELS}], not {channels!r}")
        if blend not in BLENDS:
            raise ArgumentError(f"blend must be one of {list(BLENDS)}, not {blend!r}")
        if format not in FORMATS:
            raise ArgumentError(f"format must be one of {list(FORMATS)}, not {format!r}")
        if (isinstance(max_scenes_in_memory, bool) or not isinstance(max_scenes_in_memory, int)
                or max_scenes_in_memory < 1):
            raise ArgumentError(f"max_scenes_in_memory must be a positive integer, not {max_scenes_in_memory!r}")
        self.dtype = _output_dtype(dtype, blend)
        self.fill = _fill(fill, self.dtype)
        self.channels, self.blend, self.format = channels, blend, format
        self.max_scenes_in_memory = max_scenes_in_memory
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        manifest, where = _open_manifest(path, split, storage_options)
        self.scenes, self.stems, self.tile = _scenes(manifest, where)
        self._fingerprint = manifest.fingerprint
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._parts = rank_dir(self.out_dir, self.rank)
        remove_parts(self.out_dir, self.rank)  # a crashed run's parts would be merged into this one's
        self._weights = importance_map(*self.tile, blend) if self.tile else None
        self._live: OrderedDict[int, SceneAccumulator] = OrderedDict()  # least recently added to first
        self._spilled: dict[int, int] = {}  # scene -> tiles in its saved part
        self._done: set[int] = set()
        self._ring: deque[tuple[int, Window, np.ndarray]] = deque(maxlen=max(8, 2 * self.world_size))
        self._value_dtype: np.dtype | None = None
        self._warned = False
        self._closed = False
        self.written: list[Path] = []
        # Finished scenes are divided and written on one thread while the next tiles are added; at most
        # WRITES_IN_FLIGHT wait for it, so memory stays bounded (the errors surface at the next add or close).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastload-mosaic")
        self._writes: deque[Future[Path]] = deque()

    # ---- adding tiles ----

    def add(self, batch: Any, predictions: Any) -> None:
        """Add a batch's predictions, ``(B, C, th, tw)``: a torch tensor (on any device) or numpy array.

        ``batch`` is the loader's dict, with ``"scene"`` ``(B,)`` and ``"window"`` ``(B, 4)``; each
        prediction covers its whole tile (``th x tw``, the dataset's tile size). Only each window's
        top-left ``height x width`` of a prediction is used (the rest of a padded edge tile is padding).
        A tile added twice counts once. ArgumentError naming the scene and the window when a prediction
        does not fit (channels, batch size, tile size, a window outside its scene).
        """
        if self._closed:
            raise FastloadError("Mosaic.add: the mosaic is closed")
        scene, window = _batch_arrays(batch)
        preds = _predictions(predictions)
        if preds.ndim != 4 or preds.shape[1] != self.channels:
            raise ArgumentError(f"Mosaic.add: predictions of shape {list(preds.shape)}; expected (B, {self.channels}"
                                f", tile height, tile width)")
        if not len(scene) == len(window) == len(preds):
            raise ArgumentError(f"Mosaic.add: {len(preds)} predictions for a batch of {len(scene)} scene indices and "
                                f"{len(window)} windows")
        check_windows(self.scenes, scene, window, 0, "Mosaic.add", ArgumentError)
        self._check_dtype(preds.dtype)
        th, tw = preds.shape[2:]
        if self.tile is None:  # a dataset without an "image" field: the first batch fixes the tile size
            self.tile = (int(th), int(tw))
            self._weights = importance_map(th, tw, self.blend)
        for k in range(len(preds)):
            index = int(scene[k])
            wnd: Window = (int(window[k, 0]), int(window[k, 1]), int(window[k, 2]), int(window[k, 3]))
            if (th, tw) != self.tile or wnd[2] > th or wnd[3] > tw:
                raise ArgumentError(f"Mosaic.add: {self.scenes[index].path} window {wnd}: predictions of "
                                    f"{th} x {tw} pixels; the dataset's tiles are {self.tile[0]} x {self.tile[1]}")
            self._add_tile(index, wnd, preds[k])

    def _check_dtype(self, dtype: np.dtype) -> None:
        if dtype.kind not in "uif":
            raise ArgumentTypeError(f"Mosaic.add: predictions of dtype {dtype}; give numbers (cast a bool mask "
                                    f"to uint8)")
        if self.blend != "clip":
            if dtype.kind != "f":
                raise ArgumentTypeError(f"Mosaic.add: {dtype} predictions with blend={self.blend!r}: only clip "
                                        f"keeps integers (labels); give floats (scores) to blend")
            return
        if self._value_dtype is None:
            if self.dtype is not None and not np.can_cast(dtype, self.dtype):
                raise ArgumentTypeError(f"Mosaic.add: {dtype} predictions do not cast safely to dtype={self.dtype}")
            self._value_dtype = dtype
        elif dtype != self._value_dtype:
            raise ArgumentTypeError(f"Mosaic.add: {dtype} predictions after {self._value_dtype} ones (clip keeps "
                                    f"the predictions' dtype: give one)")

    def _add_tile(self, index: int, window: Window, prediction: np.ndarray) -> None:
        if index in self._done:
            return  # a repeat of a tile of a scene already written (a loader pads its last batches)
        acc = self._scene(index)
        if not acc.add(window, prediction):
            return
        if self.world_size > 1 and self.blend != "clip":
            self._ring.append((index, window, np.array(prediction, np.float32)))
        scene = self.scenes[index]
        if len(acc.tiles) > scene.tiles:
            raise FastloadError(f"Mosaic.add: {scene.path} (scene {index}): {len(acc.tiles)} different tiles, "
                                f"the manifest says {scene.tiles} (predictions of another dataset?)")
        if len(acc.tiles) == scene.tiles:
            del self._live[index]
            self._writes.append(self._writer.submit(_finish_scene, acc, self.dtype, self.fill,
                                                    f"{scene.path} (scene {index})", self.out_dir, self.stems[index],
                                                    self.format, scene.georef))
            self._done.add(index)
            while len(self._writes) > WRITES_IN_FLIGHT:  # bounded memory; an earlier scene's error surfaces here
                self.written.append(self._writes.popleft().result())

    def _scene(self, index: int) -> SceneAccumulator:
        """Return scene ``index``'s accumulator: in memory, read back from its part, or new (spilling another)."""
        acc = self._live.get(index)
        if acc is not None:
            self._live.move_to_end(index)
            return acc
        while len(self._live) >= self.max_scenes_in_memory:
            self._spill()
        scene = self.scenes[index]
        assert self.tile is not None and self._weights is not None
        acc = SceneAccumulator(index, scene.height, scene.width, self.channels, self.blend, self.tile, self._weights)
        if index in self._spilled:
            path = part_path(self._parts, index)
            acc.absorb(load_part(path, self.blend, self.channels))
            path.unlink()
            del self._spilled[index]
        self._live[index] = acc
        return acc

    def _spill(self) -> None:
        index, acc = self._live.popitem(last=False)
        if not self._warned:
            self._warned = True
            warnings.warn(f"fastload.Mosaic: more than max_scenes_in_memory={self.max_scenes_in_memory} scenes in "
                          f"flight; saving {self.scenes[index].path} to {self._parts} until its next tile (an "
                          f"order that spreads scenes, shuffle=True, makes this slow: predict with "
                          f"shuffle=False)", FastloadWarning, stacklevel=4)
        save_part(self._parts, index, acc.to_part())
        self._spilled[index] = len(acc.tiles)

    # ---- closing ----

    def close(self) -> None:
        """Finish: one rank checks every scene was written; several save their parts and merge (see the class)."""
        if self._closed:
            return
        self._closed = True
        failure: BaseException | None = None
        try:
            self.flush()
        except Exception as err:  # a scene that could not be written; the rest is still closed in order
            failure = err if isinstance(err, FastloadError) else FastloadError(
                f"Mosaic({self.out_dir}): writing a scene failed: {type(err).__name__}: {err}")
        finally:
            self._stop_writer()
        if self.world_size == 1:
            missing = self._missing()
            self._live.clear()
            remove_parts(self.out_dir, self.rank)
            if failure is not None and missing:
                raise FastloadError(f"{failure}; and " + _incomplete(self.out_dir, missing)) from failure
            if failure is not None:
                raise failure
            if missing:
                raise FastloadError(_incomplete(self.out_dir, missing))
            return
        try:  # several ranks: reach the barriers whatever happened here, so that no rank waits for this one
            self._save_parts()
        except Exception as err:
            failure = failure or err
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._merge_distributed()
        if failure is not None:
            raise failure

    def abort(self) -> None:
        """Drop every unfinished scene and this rank's parts; write nothing more (what an exception exit does)."""
        self._closed = True
        self._live.clear()
        self._stop_writer()
        remove_parts(self.out_dir, self.rank)

    def flush(self) -> list[Path]:
        """Wait until every finished scene is on disk (they are written on a thread); return ``written``."""
        while self._writes:
            self.written.append(self._writes.popleft().result())
        return self.written

    def _stop_writer(self) -> None:
        """Wait for the scenes being written (each whole, or not at all) and join the writer thread."""
        self._writer.shutdown(wait=True)
        for done in self._writes:
            if done.exception() is None:
                self.written.append(done.result())
        self._writes.clear()

    def __del__(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            writer.shutdown(wait=True)

    def _missing(self) -> list[str]:
        lines = []
        for i, scene in enumerate(self.scenes):
            if i in self._done or scene.tiles == 0:
                continue
            have = len(self._live[i].tiles) if i in self._live else self._spilled.get(i, 0)
            lines.append(f"{scene.path} (scene {i}): {scene.tiles - have} of {scene.tiles} tiles missing")
        return lines

    def _settings(self) -> dict[str, Any]:
        return {"version": 1, "rank": self.rank, "world_size": self.world_size, "blend": self.blend,
                "channels": self.channels, "format": self.format,
                "fill": None if self.fill is None else ("nan" if np.isnan(self.fill) else self.fill),
                "dtype": None if self.dtype is None else self.dtype.str, "dataset": self._fingerprint,
                "tile": list(self.tile) if self.tile else None, "done": sorted(self._done)}

    def _save_parts(self) -> None:
        for index, acc in self._live.items():
            save_part(self._parts, index, acc.to_part())
        self._live.clear()
        save_ring(self._parts, [r for r in self._ring if r[0] not in self._done])
        write_closed(self._parts, self._settings())  # last: the sign this rank closed normally

    def _merge_distributed(self) -> None:
        dist = torch.distributed
        dist.barrier()
        error: FastloadError | None = None
        try:
            job = MergeJob(self.scenes, self.stems, self.out_dir, run_settings(self.out_dir, self.world_size))
            written, missing = merge_ranks(job, only_rank=self.rank)
            self.written += written
            if missing:
                error = FastloadError(_incomplete(self.out_dir, missing))
        except FastloadError as err:
            error = err
        except Exception as err:  # untyped (a disk full): still reach the barrier, then raise it typed
            error = FastloadError(f"Mosaic({self.out_dir}): merging rank {self.rank}'s scenes failed: "
                                  f"{type(err).__name__}: {err}")
        self._parts.mkdir(parents=True, exist_ok=True)
        (self._parts / ("merged" if error is None else "failed")).touch()
        dist.barrier()
        if self.rank == 0 and all((rank_dir(self.out_dir, r) / "merged").exists() for r in range(self.world_size)):
            remove_parts(self.out_dir)
        if error is not None:
            raise error

    @staticmethod
    def merge(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, split: str | None = None,
              storage_options: Any = None) -> list[Path]:
        """Merge the parts every rank left in ``out_dir`` into the finished scenes; return the files written.

        For ranks run without ``torch.distributed`` (``Mosaic(..., rank=r, world_size=W)`` in separate
        jobs): run it once, after every rank closed its Mosaic. The settings come from the ranks' records;
        the result is the one a single process gives (the same bytes for clip, within float rounding for
        the blends). FastloadError listing the scenes that lack tiles; the parts are removed on success.
        """
        out = Path(out_dir)
        settings = run_settings(out)
        manifest, where = _open_manifest(path, split, storage_options)
        if manifest.fingerprint != settings["dataset"]:
            raise FastloadError(f"{out}: the parts were predicted on another dataset than {where}")
        scenes, stems, _ = _scenes(manifest, where)
        written, missing = merge_ranks(MergeJob(scenes, stems, out, settings))
        if missing:
            raise FastloadError(_incomplete(out, missing))
        remove_parts(out)
        return written

    def __enter__(self) -> Mosaic:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return (f"Mosaic({len(self.scenes)} scenes -> {str(self.out_dir)!r}, blend={self.blend!r}, "
                f"{len(self._done)} written, {len(self._live)} in memory, rank {self.rank} of {self.world_size})")


def _incomplete(out_dir: Path, missing: list[str]) -> str:
    more = f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else ""
    return (f"Mosaic({out_dir}): {len(missing)} scene(s) incomplete, not written:\n  " + "\n  ".join(missing[:20])
            + more)


def _finish_scene(acc: SceneAccumulator, dtype: np.dtype | None, fill: float | None, where: str, out_dir: Path,
                  stem: str, fmt: str, georef: Any) -> Path:
    """Divide a finished scene's sums and write it (on the writer thread); return its path."""
    return write_scene(out_dir, stem, acc.result(dtype, fill, where), fmt, georef)


def _fill(fill: Any, dtype: np.dtype | None) -> float | None:
    """Return ``fill`` checked: a number the output dtype holds exactly (NaN: floats only), or None."""
    if fill is None:
        return None
    if isinstance(fill, bool) or not isinstance(fill, (int, float, np.integer, np.floating)) or np.isinf(fill):
        raise ArgumentError(f"fill must be a number (or float('nan') for a float output), not {fill!r}")
    if dtype is not None and dtype.kind in "iu" and (np.isnan(fill) or float(fill) != int(fill) or not
                                                     np.iinfo(dtype).min <= int(fill) <= np.iinfo(dtype).max):
        raise ArgumentError(f"fill {fill!r} is not a value of the output dtype {dtype}")
    return float(fill)


def _output_dtype(dtype: Any, blend: str) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"dtype {dtype!r} is not a numpy dtype") from None
    if out.kind not in "uif" or (blend != "clip" and out.kind != "f"):
        raise ArgumentError(f"dtype {out} with blend={blend!r}: the blends write floats"
                            if blend != "clip" else f"dtype {out}: give a numeric dtype")
    return out


def _open_manifest(path: Any, split: str | None, storage_options: Any) -> tuple[Manifest, str]:
    """Return the dataset's manifest and where it is (for messages); a URL's through ``ShardDataset``."""
    if is_remote(path):
        from ._dataset import ShardDataset

        dataset = ShardDataset(path, split=split, storage_options=storage_options)
        try:
            return dataset.manifest, str(path)
        finally:
            dataset.close()
    if storage_options is not None:
        raise ArgumentError(f"storage_options are for a dataset in object storage, not the local path {str(path)!r}")
    directory = resolve_dataset_path(path, split)
    return load_manifest(directory), str(directory)


def _scenes(manifest: Manifest, where: str) -> tuple[list[Scene], list[str], tuple[int, int] | None]:
    """Return the dataset's scenes, their output stems (unique) and the tile size its ``image`` field stores."""
    scenes = scenes_of(manifest, where)
    names = {f.name for f in manifest.fields}
    if scenes is None or SCENE_FIELD not in names or WINDOW_FIELD not in names:
        raise DatasetError(f"{where}: records no scenes (a manifest 'scenes' list and fields {SCENE_FIELD!r}, "
                           f"{WINDOW_FIELD!r}): write it with preprocess_tiles --tile-size, or write_arrays(..., "
                           f"scenes=...) with those fields")
    stems: list[str] = []
    seen: dict[str, int] = {}
    for i, scene in enumerate(scenes):
        try:
            stem = scene_stem(scene)
        except ValueError as err:
            raise DatasetError(f"{where}: scene {i}: no usable output name: {err}") from None
        key = stem.casefold()  # a.tif and A.tif are one file on Windows and macOS
        if key in seen:
            raise ArgumentError(f"{where}: scenes {seen[key]} ({scenes[seen[key]].path}) and {i} ({scene.path}) "
                                f"would both be written as {stem!r}")
        seen[key] = i
        stems.append(stem)
    return scenes, stems, _tile_size(manifest)


def _tile_size(manifest: Manifest) -> tuple[int, int] | None:
    field = next((f for f in manifest.fields if f.name == "image"), None)
    if field is None or len(field.shape) not in (2, 3):
        return None
    if len(field.shape) == 2:
        return field.shape[0], field.shape[1]
    options = manifest.provenance.get("options") if isinstance(manifest.provenance, dict) else None
    recorded = options.get("layout") if isinstance(options, dict) else None  # preprocess_tiles --layout
    layout = field.codec_options.get("layout") or (recorded if recorded in ("chw", "hwc") else None) \
        or guess_layout(field.shape) or "chw"
    return (field.shape[1], field.shape[2]) if layout == "chw" else (field.shape[0], field.shape[1])


def _batch_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    try:
        scene, window = batch[SCENE_FIELD], batch[WINDOW_FIELD]
    except (KeyError, TypeError, IndexError):
        raise ArgumentError(f"Mosaic.add: the batch must be a dict with the fields {SCENE_FIELD!r} and "
                            f"{WINDOW_FIELD!r} (load them: ShardLoader(fields=...) must include them)") from None
    scene, window = _numpy(scene), _numpy(window)
    return scene.reshape(-1) if scene.ndim == 0 else scene, window


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _predictions(predictions: Any) -> np.ndarray:
    if isinstance(predictions, torch.Tensor):
        tensor = predictions.detach()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()  # numpy has no bfloat16
        return tensor.cpu().numpy()
    if isinstance(predictions, np.ndarray):
        return predictions
    raise ArgumentTypeError(f"Mosaic.add: predictions must be a torch tensor or a numpy array, not "
                            f"{type(predictions).__name__}")
