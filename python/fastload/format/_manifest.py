"""The dataset manifest (``manifest.json``): schema, shards, counts and provenance.

A directory is a dataset when it holds a valid manifest; the manifest is
written last, atomically, so a directory without one is an incomplete dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ..errors import ArgumentError, DatasetError
from ._blocks import BLOCK_VERSION
from ._manifest_check import read_manifest
from ._record import (
    FORMAT_VERSION,
    MAX_SAMPLE_BYTES_ENV,
    Field,
    binding_fingerprint,
    max_sample_bytes,
    schema_fingerprint,
)

MANIFEST_NAME = "manifest.json"
HASH_ALGORITHM = "xxh3-128"


@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest lists it."""

    file: str
    count: int
    bytes: int
    hash: str

    def to_json(self) -> dict:
        """Return the manifest's JSON form."""
        return {"file": self.file, "count": self.count, "bytes": self.bytes, "hash": self.hash}


@dataclass
class Manifest:
    """The parsed contents of ``manifest.json``."""

    fields: list[Field]
    shards: list[ShardInfo]
    provenance: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    dataset_id: str | None = None  # v3: what every record is bound to (with its shard's index)

    @property
    def total(self) -> int:
        """Return the number of samples in the dataset."""
        return sum(s.count for s in self.shards)

    @property
    def fingerprint(self) -> str:
        """Return a short hash identifying the dataset's content (schema and shard hashes).

        A dataset rewritten by ``fastload upgrade`` keeps its former fingerprint (``upgraded_from``) while its
        schema and shards are those the upgrade wrote (``upgraded_from.content``): its samples and their
        positions did not change, so loader states and ``Mosaic`` settings saved before still apply.
        """
        own = self.content_fingerprint
        upgraded = self.extra.get("upgraded_from")
        if isinstance(upgraded, dict) and upgraded.get("content") == own:  # the content the upgrade wrote, unchanged
            return str(upgraded["fingerprint"])
        return own

    @property
    def content_fingerprint(self) -> str:
        """Return the hash of this manifest's schema and shard entries (the fingerprint of a dataset never upgraded)."""
        h = xxhash.xxh3_64()
        h.update(json.dumps([f.to_json() for f in self.fields], sort_keys=True).encode())
        for s in self.shards:
            h.update(f"{s.file}:{s.count}:{s.hash}".encode())
        return h.hexdigest()

    @property
    def packed(self) -> bool:
        """Return whether the shards hold blocks of records (format v4) rather than one record per key."""
        return self.format_version >= BLOCK_VERSION

    def record_fingerprints(self) -> list[int]:
        """Return, per shard, the fingerprint each of its records must carry (docs/FORMAT.md).

        v3: the shard's binding to this dataset and its position; v2: the schema's
        fingerprint (v1 records carry none; the list is unused).
        """
        schema = schema_fingerprint(self.fields)
        if self.format_version < 3:
            return [schema] * len(self.shards)
        assert self.dataset_id is not None  # the manifest check requires it from v3
        return [binding_fingerprint(schema, self.dataset_id, i) for i in range(len(self.shards))]

    def to_json(self) -> dict:
        """Return the JSON document written to ``manifest.json``."""
        doc = {
            "format": "fastload-shards",
            "format_version": self.format_version,
            "schema": [f.to_json() for f in self.fields],
            "total": self.total,
            "shards": [s.to_json() for s in self.shards],
            "provenance": self.provenance,
        }
        if self.format_version >= 3:
            if self.dataset_id is None:
                raise ArgumentError(f"a format {self.format_version} manifest needs its dataset_id")
            doc["dataset_id"] = self.dataset_id
            if not self.shards:
                doc["empty"] = True
        doc.update(self.extra)
        return doc


def shard_label_sets(manifest: Manifest) -> tuple[list[int], list[int]] | None:
    """Return the manifest's ``shard_labels`` as (count per label, label mask per shard), or None without it.

    Manifests written before it (or without an integer ``label`` field of few classes) have none.
    The manifest was validated when loaded (``_manifest_check``); one built in memory is checked here.
    """
    doc = manifest.extra.get("shard_labels")
    if not isinstance(doc, dict):
        return None
    counts, masks = doc.get("counts"), doc.get("masks")
    if not isinstance(counts, list) or not isinstance(masks, list) or len(masks) != len(manifest.shards):
        return None
    try:
        return [int(c) for c in counts], [int(m, 16) for m in masks]
    except (TypeError, ValueError):  # a manifest built in memory with something else there
        return None


def file_hash(path: str | os.PathLike) -> str:
    """Return the content hash of a file as written in the manifest (``xxh3-128:<hex>``)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return f"{HASH_ALGORITHM}:{h.hexdigest()}"


def json_temp_path(path: Path) -> Path:
    """Return the temporary file that ``write_json_atomic`` writes before renaming it to ``path``.

    A run stopped between the two leaves it behind: the output folder's checks know it by this name.
    """
    return path.with_name(f".{path.name}.tmp")


def write_json_atomic(path: str | os.PathLike, doc: Mapping) -> None:
    """Write JSON to a temporary file, fsync it and rename it over ``path``."""
    path = Path(path)
    tmp = json_temp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike) -> None:
    """Fsync a directory so a rename in it survives a crash (a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _refuse_stray_shards(directory: Path, path: Path) -> None:
    """Refuse a manifest without shards beside shard files: it lost its shards rather than being empty."""
    try:
        stray = sorted(p.name for p in directory.iterdir() if p.name.startswith("shard-") and p.name.endswith(".lmdb"))
    except OSError as err:
        raise DatasetError(f"{directory}: cannot list the dataset directory ({err.strerror})") from None
    if stray:
        more = f" and {len(stray) - 3} more" if len(stray) > 3 else ""
        raise DatasetError(f"{path}: invalid manifest: shards: none listed, but shard files lie beside it "
                           f"({', '.join(stray[:3])}{more}): the manifest lost its shards")


UPGRADE_DIR = ".upgrade"  # `fastload upgrade` stages the new dataset here (conversion/_upgrade.py)
UPGRADE_COMMIT = "COMMIT"  # in UPGRADE_DIR: the new dataset is complete and checked; a rerun finishes it


def load_manifest(directory: str | os.PathLike) -> Manifest:
    """Read and validate ``DIR/manifest.json``; raise DatasetError saying what is wrong."""
    directory = Path(directory)
    if not directory.exists():
        raise DatasetError(f"{directory}: no such dataset directory")
    if not directory.is_dir():
        raise DatasetError(f"{directory}: not a directory (a dataset is a directory with {MANIFEST_NAME})")
    path = directory / MANIFEST_NAME
    if not path.exists():
        hint = ""
        if (directory / UPGRADE_DIR / UPGRADE_COMMIT).exists():
            hint = f" (an upgrade was interrupted after its commit: run `fastload upgrade {directory}` to finish it)"
        elif any(directory.glob("*.lmdb*")) or (directory / ".progress.json").exists():
            hint = " (shards are present: an interrupted preprocess_tiles run? continue it with --resume)"
        raise DatasetError(f"{directory}: incomplete dataset, no {MANIFEST_NAME}{hint}")
    doc = read_manifest(path)  # every value's type and range checked: DatasetError naming the key
    fields = [Field.from_json(f) for f in doc["schema"]]
    shards = [ShardInfo(s["file"], s["count"], s["bytes"], s["hash"]) for s in doc["shards"]]
    if not shards:
        _refuse_stray_shards(directory, path)
    known = {"format", "format_version", "schema", "total", "shards", "provenance", "dataset_id", "empty"}
    extra = {k: v for k, v in doc.items() if k not in known}
    manifest = Manifest(fields, shards, dict(doc.get("provenance", {})), extra, doc["format_version"],
                        doc.get("dataset_id"))
    limit = max_sample_bytes()
    sample = sum(f.nbytes for f in fields)
    if sample > limit:
        raise DatasetError(f"{path}: schema: a sample of {sample} decoded bytes exceeds the limit of {limit} bytes "
                           f"(set {MAX_SAMPLE_BYTES_ENV} to read larger samples)")
    return manifest
