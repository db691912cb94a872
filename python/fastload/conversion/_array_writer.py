"""``write_arrays``: write in-memory arrays as a shard dataset (no image files involved)."""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import SchemaMismatchError
from ..format._codecs import IMAGE_CODECS, default_options, guess_layout
from ..format._dtypes import dtype_name
from ..format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from ..format._record import Field, RecordEncoder
from ._auto import choose_codec, sample_indices
from ._samples import check_sample_bytes
from ._shard_writer import write_shard


def write_arrays(out_dir: str | os.PathLike, arrays: Mapping[str, np.ndarray], codec: str | Mapping[str, str] = "raw",
                 level: int | None = None, samples_per_shard: int = 1024, overwrite: bool = False, *,
                 layout: str | None = None, quality: int | None = None, subsampling: str | None = None,
                 prefer: str = "balanced", lossy_ok: bool = False) -> Manifest:
    """Write ``arrays`` (field name -> array of shape ``[N, *field shape]``) as a dataset in ``out_dir``.

    ``codec`` is one codec for every field or a mapping per field (fields not
    named are raw). ``level`` is the zstd, lz4 or png level (default: zstd 3,
    lz4 0 = fast, png 6); ``layout`` ('chw' or 'hwc') says how 3-D image fields
    are laid out for png and jpeg (inferred when only one reading has 1 to 4
    channels); ``quality`` and ``subsampling`` are jpeg's. ``"auto"`` tries the
    codecs that fit a field on a sample of it and picks by ``prefer``
    ('speed', 'size' or 'balanced'; see ``fastload._auto``), jpeg only with
    ``lossy_ok``; the choice and its measurements go to the manifest's
    ``provenance.codec_choice``. Returns the manifest
    written. Raises SchemaMismatchError when the arrays disagree in N or a codec
    cannot hold a field (the message names the codecs that can).
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out}: exists and is not empty (pass overwrite=True)")
        if not (out / MANIFEST_NAME).exists():
            raise FileExistsError(f"{out}: not a fastload dataset; refusing to overwrite it")
        shutil.rmtree(out)
    if not arrays:
        raise ValueError("write_arrays needs at least one field")
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be positive, not {samples_per_shard}")
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise SchemaMismatchError(f"fields differ in sample count: {counts}")
    n = next(iter(counts.values()))
    fields = []
    choices = {}
    for name, a in arrays.items():
        field_codec = codec if isinstance(codec, str) else codec.get(name, "raw")
        shape = tuple(a.shape[1:])
        image_codec = field_codec in IMAGE_CODECS or field_codec == "auto"
        field_layout = (layout or guess_layout(shape)) if image_codec and len(shape) == 3 else None
        if field_codec == "auto":
            sample = np.asarray(a[sample_indices(len(a), a[0].nbytes if len(a) else 0)]) if len(a) else a
            choice = choose_codec(name, sample, field_layout, prefer, lossy_ok)
            choices[name] = choice.to_json()
            fields.append(choice.field)
            continue
        options = default_options(field_codec, level, field_layout, quality, subsampling)
        fields.append(Field(name, dtype_name(a.dtype), shape, field_codec, options))
    check_sample_bytes(fields, "write_arrays")
    out.mkdir(parents=True, exist_ok=True)
    encoder = RecordEncoder(fields)
    shards = []
    for index, start in enumerate(range(0, n, samples_per_shard)):
        stop = min(start + samples_per_shard, n)
        records = [encoder.encode({name: a[i] for name, a in arrays.items()}) for i in range(start, stop)]
        shards.append(write_shard(out, index, records))
    provenance: dict = {"tool": "fastload.write_arrays",
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if choices:
        provenance["codec_choice"] = choices
    manifest = Manifest(fields, shards, provenance)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return manifest
