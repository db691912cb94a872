"""HDF5 input (through h5py): rasters tiled like other images, or stacks of samples read in chunks.

A raster file holds exactly one 2-D or 3-D dataset, laid out like an NPY
array (``--npy-layout``, bands-first detected). A stack is a dataset of shape
``(N, ...)`` named by ``--h5-dataset`` (labels, shape ``(N,)``, by
``--h5-labels``); it is read ``rows`` samples at a time, never whole, so files
larger than memory convert. Compression and chunking are h5py's business.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from ..errors import ImageReadError
from ..format._record import Field, RecordEncoder
from ._casts import cast_checked
from ._layouts import npy_layout_of
from ._picks import place, raise_read_errors

CHUNK_BYTES = 16 << 20  # about this much of a stack is read per task


def _datasets(f: h5py.File) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    f.visititems(lambda name, obj: found.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    return found


def _raster(f: h5py.File, path: str | os.PathLike) -> Any:
    images = [(n, d) for n, d in _datasets(f) if d.ndim in (2, 3)]
    if len(images) != 1:
        names = ", ".join(f"{n} {d.shape}" for n, d in _datasets(f)) or "none"
        raise ImageReadError(path, f"an HDF5 raster must hold exactly one 2-D or 3-D dataset (found: {names}); "
                                   "for stacks of samples pass --h5-dataset NAME")
    return images[0][1]


def probe_raster(path: str | os.PathLike, layout: str) -> tuple[tuple[int, int, int], str]:
    """Return ((height, width, channels), dtype) of the raster in an HDF5 file."""
    with h5py.File(path, "r") as f:
        ds = _raster(f, path)
        if ds.ndim == 2:
            return (ds.shape[0], ds.shape[1], 1), ds.dtype.name
        chw = npy_layout_of(ds.shape, layout) == "chw"
        shape = (ds.shape[1], ds.shape[2], ds.shape[0]) if chw else tuple(ds.shape)
        return (int(shape[0]), int(shape[1]), int(shape[2])), ds.dtype.name


def read_raster(path: str | os.PathLike, layout: str) -> np.ndarray:
    """Read the raster of an HDF5 file as (height, width, channels)."""
    with h5py.File(path, "r") as f:
        ds = _raster(f, path)
        arr = ds[()]
    if arr.ndim == 3 and npy_layout_of(arr.shape, layout) == "chw":
        arr = arr.transpose(1, 2, 0)
    return arr


@dataclass(frozen=True)
class StackInfo:
    """The samples of one HDF5 file: count, per-sample shape and dtype, and the rows read per task."""

    count: int
    shape: tuple[int, ...]
    dtype: str
    rows: int


def probe_stack(path: str | os.PathLike, dataset: str, labels: str | None) -> StackInfo:
    """Check ``dataset`` (and ``labels``) in an HDF5 file and describe them; raise ImageReadError."""
    try:
        with h5py.File(path, "r") as f:
            if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
                names = ", ".join(n for n, _ in _datasets(f)) or "none"
                raise ImageReadError(path, f"no dataset {dataset!r} (--h5-dataset); the file has: {names}")
            ds = f[dataset]
            if ds.ndim < 1 or ds.shape[0] == 0:
                raise ImageReadError(path, f"dataset {dataset!r} of shape {ds.shape} holds no samples")
            if labels is not None:
                if labels not in f or not isinstance(f[labels], h5py.Dataset):
                    raise ImageReadError(path, f"no dataset {labels!r} (--h5-labels)")
                lab = f[labels]
                if lab.shape != (ds.shape[0],) or lab.dtype.kind not in "iu":
                    raise ImageReadError(path, f"labels {labels!r} must be integers of shape ({ds.shape[0]},), "
                                               f"not {lab.dtype} {lab.shape}")
            sample_bytes = max(1, int(np.prod(ds.shape[1:])) * ds.dtype.itemsize)
            rows = max(1, CHUNK_BYTES // sample_bytes)
            if ds.chunks:  # whole HDF5 chunks per task: each is decompressed once
                rows = max(ds.chunks[0], rows - rows % ds.chunks[0])
            return StackInfo(int(ds.shape[0]), tuple(int(d) for d in ds.shape[1:]), ds.dtype.name, rows)
    except ImageReadError:
        raise
    except Exception as err:
        raise ImageReadError(path, f"unreadable HDF5 file ({type(err).__name__}: {err})") from None


@dataclass(frozen=True)
class StackSettings:
    """What a worker needs to encode rows of a stack; picklable."""

    data_dir: str
    fields: tuple[Field, ...]
    dataset: str
    labels: str | None


def encode_stack_rows(settings: StackSettings, relpath: str, label: int | None, first: int, stop: int) -> list[bytes]:
    """Read rows ``first:stop`` of the stack in one file and return their records."""
    path = os.path.join(settings.data_dir, relpath)
    try:
        with h5py.File(path, "r") as f:
            rows = f[settings.dataset][first:stop]
            labels = f[settings.labels][first:stop] if settings.labels else None
    except Exception as err:
        raise ImageReadError(path, f"reading rows {first}..{stop - 1} of {settings.dataset!r}: "
                                   f"{type(err).__name__}: {err}") from None
    return _encode_rows(settings, rows, labels, label, f"{path} rows {first}..{stop - 1}")


def encode_stack_picked(settings: StackSettings, picks: Sequence[tuple[str, int | None, list[int], list[int]]],
                        n: int) -> list[bytes]:
    """Return the records of ``n`` rows of several stacks (each file opened once) at their slots (a shuffled write).

    ``picks``: per file (path, label, rows in increasing order, their slots in the task).
    """
    parts, unreadable = [], []
    for relpath, label, rows, slots in picks:
        path = os.path.join(settings.data_dir, relpath)
        where = np.asarray(rows, dtype=np.int64)
        try:
            with h5py.File(path, "r") as f:
                data = f[settings.dataset][where]
                labels = f[settings.labels][where] if settings.labels else None
        except Exception as err:  # the others are still read, to name every bad file
            unreadable.append(ImageReadError(path, f"reading {len(rows)} rows of {settings.dataset!r} from row "
                                                   f"{rows[0]}: {type(err).__name__}: {err}"))
            continue
        parts.append((slots, _encode_rows(settings, data, labels, label, f"{path} rows {rows[0]}..{rows[-1]}")))
    raise_read_errors(unreadable)
    return place(parts, n)


def _encode_rows(settings: StackSettings, rows: np.ndarray, labels: np.ndarray | None, label: int | None,
                 where: str) -> list[bytes]:
    """Return the records of ``rows`` (cast to the schema, checked), labelled by ``labels`` or ``label``."""
    image_field = settings.fields[0]
    rows = cast_checked(rows, image_field.np_dtype, where)
    encoder = RecordEncoder(settings.fields)
    records = []
    for i in range(len(rows)):
        values: dict[str, Any] = {image_field.name: np.ascontiguousarray(rows[i])}
        if labels is not None:
            values["label"] = np.int64(labels[i])
        elif label is not None:
            values["label"] = np.int64(label)
        records.append(encoder.encode(values))
    return records
