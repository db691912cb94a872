"""Strict manifest validation: every hostile value is a DatasetError naming the file and the key."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import DatasetError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manifest") / "ds"
    fastload.write_arrays(out, {"image": np.zeros((12, 2, 2), np.uint8), "label": np.arange(12, dtype=np.int64)},
                          samples_per_shard=4)
    return out


@pytest.fixture
def dataset(pristine, tmp_path) -> Path:
    out = tmp_path / "ds"
    out.mkdir()
    for path in pristine.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    return out


def _set(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        target = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return change


def _shards(change):
    def apply(doc):
        doc["shards"] = change(doc["shards"])
        doc["total"] = sum(s["count"] for s in doc["shards"]) if all(
            isinstance(s.get("count"), int) for s in doc["shards"]) else doc["total"]
    return apply


CASES = {
    "count -1": (_set("shards.0.count", -1), r"shards\[0\]\.count: -1 is out of range \[1, 2\*\*63\)"),
    "count 0": (_set("shards.1.count", 0), r"shards\[1\]\.count: 0 is out of range"),
    "count 2**63": (_set("shards.0.count", 2**63), r"shards\[0\]\.count: 9223372036854775808 is out of range"),
    "count true": (_set("shards.0.count", True), r"shards\[0\]\.count: True is not an integer"),
    "count 4.0": (_set("shards.0.count", 4.0), r"shards\[0\]\.count: 4\.0 is not an integer"),
    "count 1e400": (_set("shards.0.count", float("inf")), r"Infinity is not a JSON number"),
    "count string": (_set("shards.0.count", "4"), r"shards\[0\]\.count: '4' is not an integer"),
    "bytes negative": (_set("shards.2.bytes", -5), r"shards\[2\]\.bytes: -5 is out of range"),
    "bytes huge": (_set("shards.2.bytes", 10**30), r"shards\[2\]\.bytes: 1000000000000000000000000000000 is out"),
    "hash short": (_set("shards.0.hash", "xxh3-128:abc"), r"shards\[0\]\.hash: 'xxh3-128:abc' is not"),
    "hash upper": (_set("shards.0.hash", "xxh3-128:" + "A" * 32), r"shards\[0\]\.hash"),
    "hash int": (_set("shards.0.hash", 5), r"shards\[0\]\.hash: 5 is not a string"),
    "shard listed twice": (_shards(lambda s: [s[0], s[0], s[1], s[2]]),
                           r"shards\[1\]\.file: 'shard-00000\.lmdb' where the writer names shard 1 "
                           r"'shard-00001\.lmdb'"),
    "shard listed 3000 times": (_shards(lambda s: s[:1] * 3000), r"shards\[1\]\.file: 'shard-00000\.lmdb'"),
    "shards reordered": (_shards(lambda s: [s[1], s[0], s[2]]), r"shards\[0\]\.file: 'shard-00001\.lmdb'"),
    "shard dropped": (_shards(lambda s: [s[0], s[2]]), r"shards\[1\]\.file: 'shard-00002\.lmdb'"),
    "300-char shard name": (_set("shards.0.file", "s" * 300), r"shards\[0\]\.file: 'sssss"),
    "shard not an object": (_set("shards.0", [1, 2]), r"shards\[0\]: expected an object, not list"),
    "shard unknown key": (lambda d: d["shards"][0].update(offset=3), r"shards\[0\]: unknown key 'offset'"),
    "total wrong": (_set("total", 13), r"total: total 13 differs from the shards' sum 12"),
    "total bool": (_set("total", False), r"total: False is not an integer"),
    "total missing": (lambda d: d.pop("total"), r"missing key 'total'"),
    "300-char field name": (_set("schema.0.name", "n" * 300), r"schema\[0\]\.name: a name is 1 to 128 printable"),
    "empty field name": (_set("schema.0.name", ""), r"schema\[0\]\.name: a name is 1 to 128"),
    "control char in name": (_set("schema.0.name", "a\nb"), r"schema\[0\]\.name"),
    "duplicate field names": (_set("schema.1.name", "image"), r"schema\[1\]\.name: field name 'image' appears twice"),
    "unknown dtype": (_set("schema.0.dtype", "complex64"), r"schema\[0\]\.dtype: unknown dtype 'complex64'"),
    "dtype not a string": (_set("schema.0.dtype", ["uint8"]), r"schema\[0\]\.dtype: \['uint8'\] is not a string"),
    "unknown codec": (_set("schema.0.codec", "brotli"), r"schema\[0\]\.codec: unknown codec 'brotli'"),
    "negative dimension": (_set("schema.0.shape", [2, -2]), r"schema\[0\]\.shape\[1\]: -2 is out of range"),
    "float dimension": (_set("schema.0.shape", [2, 2.0]), r"schema\[0\]\.shape\[1\]: 2\.0 is not an integer"),
    "huge dimension": (_set("schema.0.shape", [2**64]), r"schema\[0\]\.shape\[0\]: 18446744073709551616 is out"),
    "shape not a list": (_set("schema.0.shape", 4), r"schema\[0\]\.shape: expected an array, not int"),
    "too many dims": (_set("schema.0.shape", [1] * 33), r"schema\[0\]\.shape: 33 dimensions; at most 32"),
    "empty schema": (_set("schema", []), r"schema: 0 fields"),
    "level float": (_set("schema.0.codec_options", {"level": 1.5}), r"schema\[0\]\.codec_options\.level: 1\.5"),
    "format wrong": (_set("format", "other"), r"format: 'other': not a fastload manifest"),
    "format_version 99": (_set("format_version", 99), r"format version 99"),
    "format_version bool": (_set("format_version", True), r"format_version: True is not an integer"),
    "provenance list": (_set("provenance", []), r"provenance: expected an object, not list"),
    "classes ints": (_set("classes", [1]), r"classes\[0\]: 1 is not a string"),
    "not an object": (lambda d: d.clear() or d.update(x=1), r"missing key 'format'"),
    "sample over 2 GiB": (_set("schema.0.shape", [2**20, 2**11 + 1]), r"schema: a sample of 2148532232 decoded bytes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_values_are_dataset_errors(dataset, case):
    change, expected = CASES[case]
    path = dataset / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    for make in (lambda: fastload.ShardDataset(dataset), lambda: fastload.ShardLoader(dataset, backend="native"),
                 lambda: fastload.ShardLoader(dataset, backend="torch", num_workers=0)):
        with pytest.raises(DatasetError, match=expected) as err:
            make()
        assert str(path) in str(err.value)


RAW_CASES = {
    "duplicate shards key": (lambda text: text.rstrip()[:-1] + ', "shards": []}', r"duplicate key 'shards'"),
    "NaN": (lambda text: text.replace('"total": 12', '"total": NaN'), r"NaN is not a JSON number"),
    "1e400": (lambda text: text.replace('"total": 12', '"total": 1e400'), r"1e400 is not a finite number"),
    "huge int": (lambda text: text.replace('"total": 12', '"total": ' + "9" * 5000), r"an integer of 5000 digits"),
    "100000 levels of nesting": (lambda text: text.rstrip()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 r"nested deeper than 64 levels"),
    "not UTF-8": (lambda text: text.replace('"tool"', '"\udcff"'), r"unreadable manifest"),
    "not JSON": (lambda text: "{not json", r"unreadable manifest"),
}


@pytest.mark.parametrize("case", list(RAW_CASES))
def test_hostile_text_is_a_dataset_error(dataset, case):
    change, expected = RAW_CASES[case]
    path = dataset / "manifest.json"
    path.write_bytes(change(path.read_text()).encode("utf-8", "surrogateescape"))
    with pytest.raises(DatasetError, match=expected) as err:
        fastload.ShardDataset(dataset)
    assert str(path) in str(err.value)


def test_manifest_must_be_a_bounded_regular_file(dataset):
    path = dataset / "manifest.json"
    path.unlink()
    os.mkfifo(path)  # opening a FIFO would block: it is refused before any open
    with pytest.raises(DatasetError, match="not a regular file"):
        fastload.ShardDataset(dataset)
    path.unlink()
    with open(path, "wb") as f:
        f.truncate((256 << 20) + 1)
    with pytest.raises(DatasetError, match="larger than 268435456 bytes"):
        fastload.ShardDataset(dataset)
