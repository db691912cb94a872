"""``write_arrays``: write in-memory arrays as a shard dataset (no image files involved)."""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import ArgumentError, SchemaMismatchError
from ..format._codecs import CODECS, IMAGE_CODECS, default_options, guess_layout
from ..format._dtypes import dtype_name
from ..format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from ..format._record import Field, RecordEncoder
from ..format._scenes import (
    SCENE_FIELD,
    SCENES_KEY,
    WINDOW_FIELD,
    Scene,
    build_scenes,
    check_scene_indices,
    check_windows,
)
from ._auto import Choice, choose_codec, sample_indices
from ._output_dir import foreign_entry
from ._samples import check_sample_bytes
from ._shard_labels import label_histogram, shard_labels_doc
from ._shard_writer import dataset_id, write_shard
from ._write_groups import GroupedOrder, group_samples_for
from ._write_order import check_order, check_seed, order_doc


def write_arrays(out_dir: str | os.PathLike, arrays: Mapping[str, np.ndarray], codec: str | Mapping[str, str] = "raw",
                 level: int | None = None, samples_per_shard: int = 1024, overwrite: bool = False, *,
                 layout: str | None = None, quality: int | None = None, subsampling: str | None = None,
                 prefer: str = "balanced", lossy_ok: bool = False, order: str = "source", seed: int = 0,
                 scenes: Sequence[Mapping[str, Any] | str | os.PathLike[str]] | None = None) -> Manifest:
    """Write ``arrays`` (field name -> array of shape ``[N, *field shape]``) as a dataset in ``out_dir``.

    ``codec`` is one codec for every field or a mapping per field (fields not
    named are raw). ``level`` is the zstd, lz4 or png level (default: zstd 3,
    lz4 0 = fast, png 6); ``layout`` ('chw' or 'hwc') says how 3-D image fields
    are laid out for png and jpeg (inferred when only one reading has 1 to 4
    channels); ``quality`` and ``subsampling`` are jpeg's. ``"auto"`` tries the
    codecs that fit a field on a sample of it and picks by ``prefer``
    ('speed', 'size' or 'balanced'; see ``fastload._auto``), jpeg only with
    ``lossy_ok``; the choice and its measurements go to the manifest's
    ``provenance.codec_choice``. ``order``: ``"source"`` (the default) writes
    sample ``i`` of the arrays at position ``i``; ``"shuffled"`` writes them in
    the seeded permutation of ``seed`` across shards that ``write_dataset`` and
    ``preprocess_tiles`` use by default (position ``p`` holds
    ``_write_groups.GroupedOrder(seed, None, N, G).samples(p, p + 1)``, every sample a source of its own, G
    from ``GROUP_BYTES``; recorded in the
    manifest's ``order``). The arrays are the caller's, in memory, so the
    default keeps their order.

    ``scenes``: where the samples were cut from (data tiled elsewhere), recorded in the manifest's
    ``scenes`` for ``fastload.Mosaic``: a list of dicts as the manifest holds them (``path``,
    ``height``, ``width``, ``tiles``, optional ``files`` and ``georef``) or of TIFF paths (size and
    GeoTIFF/OME georeferencing read with tifffile; recorded by file name). With a ``scene`` field
    (int64 index into ``scenes``) ``tiles`` is counted from it (a ``tiles`` given must agree), and
    every index and ``window`` (``(y, x, height, width)``) is checked to lie in its scene; without
    one each dict needs ``tiles``. ArgumentError naming the scene or the sample otherwise.

    Returns the manifest written. Raises SchemaMismatchError when the arrays disagree in N or a codec
    cannot hold a field (the message names the codecs that can).
    """
    out = Path(out_dir)
    replace = out.exists() and any(out.iterdir())
    if replace:
        if not overwrite:
            raise FileExistsError(f"{out}: exists and is not empty (pass overwrite=True)")
        foreign = foreign_entry(out)
        if foreign is not None:
            raise FileExistsError(f"{out}: not a fastload dataset ({foreign.relative_to(out)} is not a file a run "
                                  "writes); refusing to overwrite it")
    if not arrays:
        raise ArgumentError("write_arrays needs at least one field")
    if samples_per_shard < 1:
        raise ArgumentError(f"samples_per_shard must be positive, not {samples_per_shard}")
    check_order(order)
    seed = check_seed(seed)
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise SchemaMismatchError(f"fields differ in sample count: {counts}")
    n = next(iter(counts.values()))
    check_codecs(codec, list(arrays))
    scene_list = _scenes_of_arrays(scenes, arrays) if scenes is not None else None
    fields = []
    choices = {}
    for name, a in arrays.items():
        field_codec = codec if isinstance(codec, str) else codec.get(name, "raw")
        if field_codec == "auto":
            a = np.asarray(a[sample_indices(len(a), a[0].nbytes if len(a) else 0)]) if len(a) else a
        field, choice = plan_field(name, a, field_codec, level, layout, quality, subsampling, prefer, lossy_ok)
        fields.append(field)
        if choice is not None:
            choices[name] = choice.to_json()
    check_sample_bytes(fields, "write_arrays")
    if replace:  # once every argument is checked: a refused call deletes nothing
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    encoder = RecordEncoder(fields)
    shards = []
    identity = _identity(arrays, samples_per_shard)
    if order == "shuffled":
        identity += f" order=shuffled seed={seed}"
    ident = dataset_id(fields, identity, [])
    group = group_samples_for(sum(a[0].nbytes for a in arrays.values()) if n else 1)
    permutation = GroupedOrder(seed, None, n, group) if order == "shuffled" else None  # a source per sample
    histograms = []
    for index, start in enumerate(range(0, n, samples_per_shard)):
        stop = min(start + samples_per_shard, n)
        picks = permutation.samples(start, stop).tolist() if permutation is not None else range(start, stop)
        records = [encoder.encode({name: a[i] for name, a in arrays.items()}) for i in picks]
        histograms.append(label_histogram(fields, records))
        shards.append(write_shard(out, index, records, (fields, ident)))
    provenance: dict = {"tool": "fastload.write_arrays",
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if choices:
        provenance["codec_choice"] = choices
    extra: dict = {"order": order_doc(order, seed, group)}
    labels = shard_labels_doc(histograms)
    if labels is not None:
        extra["shard_labels"] = labels
    if scene_list is not None:
        extra[SCENES_KEY] = [s.to_json() for s in scene_list]
    manifest = Manifest(fields, shards, provenance, extra, dataset_id=ident)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return manifest


def _scenes_of_arrays(scenes: Sequence[Mapping[str, Any] | str | os.PathLike[str]],
                      arrays: Mapping[str, np.ndarray]) -> list[Scene]:
    """Return ``write_arrays``' scenes: tiles counted from a ``scene`` field, whose indices and windows are checked."""
    if SCENE_FIELD not in arrays or isinstance(scenes, (str, bytes, os.PathLike)) or not isinstance(scenes, Sequence):
        return build_scenes(scenes, None, "write_arrays", ArgumentError)  # (refuses scenes that are not a list)
    count = len(scenes)
    index = check_scene_indices(arrays[SCENE_FIELD], count, 0, "write_arrays", ArgumentError)
    scene_list = build_scenes(scenes, np.bincount(index, minlength=count).tolist(), "write_arrays", ArgumentError)
    check_windows(scene_list, index, arrays.get(WINDOW_FIELD), 0, "write_arrays", ArgumentError)
    return scene_list


def _identity(arrays: Mapping[str, np.ndarray], samples_per_shard: int) -> str:
    """Return what identifies what ``write_arrays`` writes: shard size, fields, a hash of every array's bytes."""
    h = xxhash.xxh3_128()
    for name, a in arrays.items():
        h.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode())
        for start in range(0, len(a), 4096):  # in slices: a memory-mapped array is not copied whole
            h.update(np.ascontiguousarray(a[start:start + 4096]).data)
    return f"write_arrays samples_per_shard={samples_per_shard} content={h.hexdigest()}"


def check_codecs(codec: str | Mapping[str, str], names: Sequence[str] | None) -> None:
    """Refuse an unknown codec, or a per-field mapping naming a field the data does not have (``names``)."""
    per_field = {None: codec} if isinstance(codec, str) else dict(codec)
    for name, c in per_field.items():
        if c not in CODECS and c != "auto":
            where = "" if name is None else f" for field {name!r}"
            raise ArgumentError(f"unknown codec {c!r}{where}; use one of {[*CODECS, 'auto']}")
    if names is None:
        return
    unknown = [n for n in per_field if n is not None and n not in names]
    if unknown:
        raise ArgumentError(f"codec names field(s) {unknown} that the data does not have; its fields are {list(names)}")


def plan_field(name: str, samples: np.ndarray, codec: str, level: int | None = None, layout: str | None = None,
               quality: int | None = None, subsampling: str | None = None, prefer: str = "balanced",
               lossy_ok: bool = False) -> tuple[Field, Choice | None]:
    """Return the field of ``samples`` (``[n, *field shape]``) stored with ``codec``, and auto's choice if any.

    ``layout`` applies to 3-D fields under an image codec (or auto), guessed
    when only one reading has 1 to 4 channels; ``level``, ``quality`` and
    ``subsampling`` fill the codec's options (``default_options``). With
    ``"auto"`` the codecs that fit are tried on ``samples`` (``choose_codec``).
    """
    shape = tuple(samples.shape[1:])
    image_codec = codec in IMAGE_CODECS or codec == "auto"
    field_layout = (layout or guess_layout(shape)) if image_codec and len(shape) == 3 else None
    if codec == "auto":
        choice = choose_codec(name, samples, field_layout, prefer, lossy_ok)
        return choice.field, choice
    options = default_options(codec, level, field_layout, quality, subsampling)
    return Field(name, dtype_name(samples.dtype), shape, codec, options), None
