"""Strict validation of ``manifest.json``: every value's type and range, before anything is derived from it.

A manifest is untrusted input. Each problem is a DatasetError naming the file
and the key (``manifest.json: shards[2].count: ...``), never an OSError,
TypeError, OverflowError or RecursionError from further down. The bounds:

- the file is a regular file of at most ``MAX_MANIFEST_BYTES``, UTF-8 JSON with
  no duplicate keys, no NaN/Infinity (nor numbers that overflow to it) and at
  most ``MAX_DEPTH`` levels of nesting, read at a cost linear in its size
  (``_strict_json.py``);
- a schema has 1 to ``MAX_FIELDS`` fields;
- integers are JSON integers (not booleans, not floats such as ``1e400``) in
  range: counts in [1, 2**63), sizes in [1, 2**63), dimensions in [0, 2**63);
- names are 1 to ``MAX_NAME_CHARS`` printable characters, unique per schema;
- dtypes and codecs are ones this fastload knows, codec options in range, and
  each codec able to hold its field (png/jpeg: dtype, channels, layout);
- shard ``i`` is named ``shard-{i:05d}.lmdb`` as the writers name them, so a
  shard listed twice, dropped or moved is refused, and hashes are
  ``xxh3-128:`` plus 32 lowercase hex digits;
- the optional ``order`` (how positions map to the source order) and
  ``shard_labels`` (per-shard label sets: 1 to ``MAX_LABEL_CLASSES`` counts
  adding up to ``total``, one mask per shard of 1 to 16 hex digits naming
  labels that have samples).
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from ._codecs import CODECS, codec_problem, options_problem
from ._dtypes import NUMPY_DTYPES
from ._record import MAX_FIELDS, READABLE_FORMAT_VERSIONS
from ._strict_json import MAX_DEPTH, JsonProblem, load_strict

# 256 MiB: a preprocess_tiles run over ImageNet's 1.28 million training images writes a
# 126 MB manifest (98 bytes per source image), 100,000 shards take 14 MB (136 bytes each).
MAX_MANIFEST_BYTES = 256 << 20
MAX_NAME_CHARS = 128
MAX_DIMS = 32
LIMIT = 2**63  # every count, size and dimension is below it (the core's sizes are 64-bit)
_HASH = re.compile(r"xxh3-128:[0-9a-f]{32}")
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = _SHOW.maxlong = 40
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # Manifest.fingerprint: XXH3-64 as hex
_DATASET_ID = re.compile(r"[0-9a-f]{32}")
_FIELD_KEYS = {"name", "dtype", "shape", "codec", "codec_options"}
LABEL_FIELD = "label"  # the field whose values ``shard_labels`` counts
MAX_LABEL_CLASSES = 64  # labels 0..63: a shard's label set is one 64-bit mask
_MASK = re.compile(r"[0-9a-f]{1,16}")
_ORDER_KINDS = ("source", "shuffled")
_SHARD_KEYS = {"file", "count", "bytes", "hash"}


def shard_name(index: int) -> str:
    """Return the file name of shard ``index`` (the only name the manifest accepts at that position)."""
    return f"shard-{index:05d}.lmdb"


SHARD_FILE = re.compile(r"shard-\d{5,}\.lmdb")  # every name shard_name gives


_Invalid = JsonProblem  # a problem at a key; read_manifest adds the file

__all__ = ["LABEL_FIELD", "MAX_DEPTH", "MAX_FIELDS", "MAX_LABEL_CLASSES", "MAX_MANIFEST_BYTES", "read_manifest",
           "shard_name", "validate"]


def read_manifest(path: Path) -> dict[str, Any]:
    """Read, parse and validate the manifest at ``path``; return its JSON object."""
    doc = load_strict(path, MAX_MANIFEST_BYTES, "manifest")  # size, depth, duplicates, NaN: DatasetError
    try:
        validate(doc)
    except _Invalid as err:
        raise DatasetError(f"{path}: invalid manifest: {err}") from None
    return doc


def _int(value: Any, where: str, lo: int, hi: int = LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(where, f"{_show(value)} is not an integer")
    if not lo <= value < hi:
        raise _Invalid(where, f"{_show(value)} is out of range [{lo}, {'2**63' if hi == LIMIT else hi})")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(where, f"{_show(value)} is not a string")
    return value


def _show(value: Any) -> str:
    text = _SHOW.repr(value)  # bounded: never a copy of a long string or list
    return text if len(text) <= 40 else text[:37] + "..."


def _object(value: Any, where: str, required: set[str], allowed: set[str] | None = None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(where, f"expected an object, not {type(value).__name__}")
    missing = sorted(required - set(value))
    if missing:
        raise _Invalid(where, f"missing key {missing[0]!r}")
    if allowed is not None and set(value) - allowed:
        raise _Invalid(where, f"unknown key {sorted(set(value) - allowed)[0]!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Invalid(where, f"expected an array, not {type(value).__name__}")
    return value


def _name(value: Any, where: str) -> str:
    name = _str(value, where)
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise _Invalid(where, f"a name is 1 to {MAX_NAME_CHARS} printable characters, not {_show(name)}")
    return name


def validate(doc: Any) -> None:
    """Raise _Invalid at the first value of ``doc`` that breaks docs/FORMAT.md or the bounds above."""
    doc = _object(doc, "", {"format", "format_version", "schema", "total", "shards"})
    if doc["format"] != "fastload-shards":
        raise _Invalid("format", f"{_show(doc['format'])}: not a fastload manifest")
    version = _int(doc["format_version"], "format_version", 0)
    if version not in READABLE_FORMAT_VERSIONS:
        raise _Invalid("format_version", f"format version {version}, this fastload reads {READABLE_FORMAT_VERSIONS}")
    schema = _list(doc["schema"], "schema")
    if not 1 <= len(schema) <= MAX_FIELDS:
        raise _Invalid("schema", f"{len(schema)} fields; a schema has 1 to {MAX_FIELDS}")
    names: set[str] = set()
    for i, field in enumerate(schema):
        _check_field(field, f"schema[{i}]", names)
    shards = _list(doc["shards"], "shards")
    total = 0
    for i, shard in enumerate(shards):
        total += _check_shard(shard, f"shards[{i}]", i)
    _int(doc["total"], "total", 0)
    if total >= LIMIT:
        raise _Invalid("shards", f"the counts add up to {total}, beyond 2**63")
    if doc["total"] != total:
        raise _Invalid("total", f"total {doc['total']} differs from the shards' sum {total}")
    _check_identity(doc, version, bool(shards))
    if "provenance" in doc:
        _object(doc["provenance"], "provenance", set())
    if "classes" in doc:
        for i, name in enumerate(_list(doc["classes"], "classes")):
            _str(name, f"classes[{i}]")
    if "order" in doc:
        _check_order(doc["order"])
    if "shard_labels" in doc:
        _check_shard_labels(doc["shard_labels"], len(shards), total, names)
    if "upgraded_from" in doc:
        _check_upgraded_from(doc["upgraded_from"], version)


def _check_order(order: Any) -> None:
    """``order``: ``{"kind": "source"}``, or ``{"kind": "shuffled", ...}`` with the grouped shuffle's keys.

    The shuffled kind's keys: ``seed``, ``version``, ``epoch``, ``group_bytes``, ``group_samples``.
    """
    kind = _object(order, "order", {"kind"}).get("kind")
    if kind not in _ORDER_KINDS:
        raise _Invalid("order.kind", f"{_show(kind)} is not one of {list(_ORDER_KINDS)}")
    if kind == "source":
        _object(order, "order", {"kind"}, {"kind"})
        return
    keys = {"kind", "seed", "version", "epoch", "group_bytes", "group_samples"}
    _object(order, "order", keys, keys)
    _int(order["seed"], "order.seed", -(2**63), 2**64)
    _int(order["version"], "order.version", 1)
    _int(order["epoch"], "order.epoch", 0)
    _int(order["group_bytes"], "order.group_bytes", 1)
    _int(order["group_samples"], "order.group_samples", 1)


def _check_shard_labels(labels: Any, shards: int, total: int, names: set[str]) -> None:
    """``shard_labels``: the label field, its count per label, and one label mask per shard (docs/FORMAT.md)."""
    keys = {"field", "counts", "masks"}
    labels = _object(labels, "shard_labels", keys, keys)
    if labels["field"] != LABEL_FIELD or LABEL_FIELD not in names:
        raise _Invalid("shard_labels.field", f"{_show(labels['field'])}: the labels counted are those of a "
                                             f"schema field {LABEL_FIELD!r}")
    counts = _list(labels["counts"], "shard_labels.counts")
    if not 1 <= len(counts) <= MAX_LABEL_CLASSES:
        raise _Invalid("shard_labels.counts", f"{len(counts)} labels; 1 to {MAX_LABEL_CLASSES}")
    summed = sum(_int(c, f"shard_labels.counts[{i}]", 0) for i, c in enumerate(counts))
    if summed != total:
        raise _Invalid("shard_labels.counts", f"the counts add up to {summed}, the dataset holds {total} samples")
    masks = _list(labels["masks"], "shard_labels.masks")
    if len(masks) != shards:
        raise _Invalid("shard_labels.masks", f"{len(masks)} masks for {shards} shards")
    present = sum(1 << i for i, c in enumerate(counts) if c)
    for i, mask in enumerate(masks):
        text = _str(mask, f"shard_labels.masks[{i}]")
        if not _MASK.fullmatch(text):
            raise _Invalid(f"shard_labels.masks[{i}]", f"{_show(text)} is not 1 to 16 lowercase hex digits")
        value = int(text, 16)
        if value == 0 or value & ~present:
            raise _Invalid(f"shard_labels.masks[{i}]", f"{_show(text)} names no label, or a label without samples")


def _check_upgraded_from(upgraded: Any, version: int) -> None:
    """v4: what ``fastload upgrade`` rewrote: the older version and fingerprint, and the content it wrote."""
    keys = {"format_version", "fingerprint", "content"}
    upgraded = _object(upgraded, "upgraded_from", keys, keys)
    _int(upgraded["format_version"], "upgraded_from.format_version", 1, version)
    for key in ("fingerprint", "content"):
        if not _FINGERPRINT.fullmatch(_str(upgraded[key], f"upgraded_from.{key}")):
            raise _Invalid(f"upgraded_from.{key}", f"{_show(upgraded[key])} is not 16 lowercase hex digits")


def _check_identity(doc: Mapping[str, Any], version: int, has_shards: bool) -> None:
    """v3: the dataset id every record is bound to, and ``empty: true`` exactly when there are no shards."""
    if version < 3:
        return
    if "dataset_id" not in doc:
        raise _Invalid("", "missing key 'dataset_id' (a format 3 manifest names the dataset its shards are bound to)")
    if not _DATASET_ID.fullmatch(_str(doc["dataset_id"], "dataset_id")):
        raise _Invalid("dataset_id", f"{_show(doc['dataset_id'])} is not 32 lowercase hex digits")
    empty = doc.get("empty", False)
    if not isinstance(empty, bool):
        raise _Invalid("empty", f"{_show(empty)} is not a boolean")
    if not has_shards and not empty:
        raise _Invalid("shards", "no shards, but the dataset was not written empty (no \"empty\": true): "
                                 "the manifest lost its shards")
    if has_shards and empty:
        raise _Invalid("empty", "true, but the manifest lists shards")


def _check_field(field: Any, where: str, names: set[str]) -> None:
    field = _object(field, where, {"name", "dtype", "shape"}, _FIELD_KEYS)
    name = _name(field["name"], f"{where}.name")
    if name in names:
        raise _Invalid(f"{where}.name", f"field name {name!r} appears twice")
    names.add(name)
    dtype = _str(field["dtype"], f"{where}.dtype")
    if dtype not in NUMPY_DTYPES:
        raise _Invalid(f"{where}.dtype", f"unknown dtype {_show(dtype)}; known: {', '.join(NUMPY_DTYPES)}")
    shape = _list(field["shape"], f"{where}.shape")
    if len(shape) > MAX_DIMS:
        raise _Invalid(f"{where}.shape", f"{len(shape)} dimensions; at most {MAX_DIMS}")
    for d, dim in enumerate(shape):
        _int(dim, f"{where}.shape[{d}]", 0)
    codec = _str(field.get("codec", "raw"), f"{where}.codec")
    if codec not in CODECS:
        raise _Invalid(f"{where}.codec", f"unknown codec {_show(codec)}; known: {', '.join(CODECS)}")
    options = _object(field.get("codec_options", {}), f"{where}.codec_options", set())
    if "level" in options:
        _int(options["level"], f"{where}.codec_options.level", -(2**31), 2**31)
    problem = options_problem(codec, options)
    if problem:
        raise _Invalid(f"{where}.codec_options", problem)
    problem = codec_problem(codec, dtype, shape, options)
    if problem:
        raise _Invalid(f"{where}.codec", problem)


def _check_shard(shard: Any, where: str, index: int) -> int:
    shard = _object(shard, where, _SHARD_KEYS, _SHARD_KEYS)
    file = _str(shard["file"], f"{where}.file")
    if "/" in file or "\\" in file or file in ("", ".", ".."):
        raise _Invalid(f"{where}.file", f"shard file name {_show(file)} must be a plain file name")
    if file != shard_name(index):
        raise _Invalid(f"{where}.file", f"{_show(file)} where the writer names shard {index} "
                                        f"{shard_name(index)!r} (a shard listed twice, dropped or moved)")
    count = _int(shard["count"], f"{where}.count", 1)
    _int(shard["bytes"], f"{where}.bytes", 1)
    if not _HASH.fullmatch(_str(shard["hash"], f"{where}.hash")):
        raise _Invalid(f"{where}.hash", f"{_show(shard['hash'])} is not 'xxh3-128:' and 32 lowercase hex digits")
    return count
