"""``write_arrays``: write in-memory arrays as a shard dataset (no image files involved)."""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ._dtypes import dtype_name
from ._format import DEFAULT_ZSTD_LEVEL, Field, RecordEncoder
from ._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from ._shard_writer import write_shard
from .errors import SchemaMismatchError


def write_arrays(out_dir: str | os.PathLike, arrays: Mapping[str, np.ndarray], codec: str | Mapping[str, str] = "raw",
                 level: int = DEFAULT_ZSTD_LEVEL, samples_per_shard: int = 1024, overwrite: bool = False) -> Manifest:
    """Write ``arrays`` (field name -> array of shape ``[N, *field shape]``) as a dataset in ``out_dir``.

    ``codec`` is one codec for every field or a mapping per field. Returns the
    manifest written. Raises SchemaMismatchError when the arrays disagree in N.
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
    for name, a in arrays.items():
        field_codec = codec if isinstance(codec, str) else codec.get(name, "raw")
        options = {"level": level} if field_codec != "raw" else {}
        fields.append(Field(name, dtype_name(a.dtype), tuple(a.shape[1:]), field_codec, options))
    out.mkdir(parents=True, exist_ok=True)
    encoder = RecordEncoder(fields)
    shards = []
    for index, start in enumerate(range(0, n, samples_per_shard)):
        stop = min(start + samples_per_shard, n)
        records = [encoder.encode({name: a[i] for name, a in arrays.items()}) for i in range(start, stop)]
        shards.append(write_shard(out, index, records))
    provenance = {"tool": "fastload.write_arrays",
                  "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    manifest = Manifest(fields, shards, provenance)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return manifest
