"""Bounded cost of the files a dataset directory holds: manifest size and nesting, schema width, splits.json."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload.errors import CorruptRecordError, DatasetError, SchemaMismatchError
from fastload.format import _strict_json
from fastload.format._record import MAX_FIELDS, Field
from fastload.format._splits import write_splits


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bounds") / "ds"
    fastload.write_arrays(out, {"a": np.zeros((4, 3), np.uint8), "b": np.arange(4, dtype=np.int64)})
    return out


@pytest.fixture
def dataset(pristine, tmp_path) -> Path:
    out = tmp_path / "ds"
    out.mkdir()
    for path in pristine.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    return out


def _edit(dataset: Path, change) -> Path:
    path = dataset / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return path


# The child reads a manifest under an address-space limit of its current size plus 12 times the file (so a
# regression fails here rather than swapping the machine) and prints its peak RSS above its RSS before. The peak
# is VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so it would count the forked pytest.
_RSS_CHILD = r"""
import resource, sys
from pathlib import Path
from fastload.format._manifest_check import read_manifest
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
size = Path(sys.argv[1]).stat().st_size
resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + 12 * size + (64 << 20),) * 2)
before = status("VmRSS")
read_manifest(Path(sys.argv[1]))
print(status("VmHWM") - before, size)
"""


@pytest.mark.slow  # tier: parses 50 MB and 10 MB manifests in subprocesses
@pytest.mark.no_asan  # measures peak RSS, which ASan's shadow memory and quarantine inflate (and runs 10x slower)
@pytest.mark.parametrize(("chars", "tail", "ratio"), [(50_000_000, "", 4), (10_000_000, "\U0001F600", 12)],
                         ids=["50 MB ascii", "10 MB held as 4-byte characters"])
def test_checking_a_long_string_costs_a_small_multiple_of_the_file(dataset, chars, tail, ratio):
    # One character beyond U+FFFF makes Python hold the whole string at 4 bytes per character, twice
    # (the decoded text and the parsed value): about 10 times the file, the worst case.
    path = _edit(dataset, lambda d: d["provenance"].update(note="x" * chars + tail))
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    peak, size = map(int, out.stdout.split())
    assert size >= chars and peak < ratio * size, f"checking {size} bytes took {peak} bytes"


HOSTILE = {
    "1e999999 in provenance": ('"created": 1e999999', r"1e999999 is not a finite number"),
    "-1e999 in provenance": ('"created": -1e999', r"-1e999 is not a finite number"),
    "NaN in provenance": ('"created": NaN', r"NaN is not a JSON number"),
    "a 50-digit float": ('"created": 1.' + "1" * 50, r"a number of 52 characters"),
    "4 million empty arrays": ('"created": [' + ",".join(["[]"] * 4_000_001) + "]",
                               r"more than 4000000 arrays and objects"),
    "nesting after an escaped backslash": ('"created": "\\\\", "x": ' + "[" * 65 + "]" * 65,
                                           r"nested deeper than 64 levels"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_values_anywhere_are_refused(dataset, case):
    replacement, expected = HOSTILE[case]
    path = dataset / "manifest.json"
    text, count = re.subn(r'"created": "[^"]*"', lambda _m: replacement, path.read_text())
    assert count == 1
    path.write_text(text)
    with pytest.raises(DatasetError, match=expected) as err:
        fastload.ShardDataset(dataset)
    assert str(path) in str(err.value)


def test_brackets_in_strings_do_not_count_across_chunks():
    chunk = _strict_json._CHUNK
    deep = "[" * 100  # inside strings: not nesting
    for pad in range(chunk - 70, chunk + 3):  # a backslash run and a quote on every side of a chunk's end
        for text in ('["' + "a" * pad + '\\\\", "' + deep + '"]', '["' + "a" * pad + '\\"' + deep + '"]',
                     '{"k": "' + "\\\\" * (pad // 2) + deep + '"}'):
            _strict_json.check_nesting(text.encode())
            json.loads(text)
    with pytest.raises(_strict_json.JsonProblem, match="nested deeper than 64"):
        _strict_json.check_nesting(('["' + "a" * (chunk - 3) + '\\\\"' + ", " + "[" * 64 + "]" * 64 + "]").encode())


def test_unknown_codec_options_are_refused(dataset):
    path = _edit(dataset, lambda d: d["schema"][0].update(codec_options={"layout": "chw", "qualty": 90}))
    with pytest.raises(DatasetError, match=r"schema\[0\]\.codec_options: unknown option 'qualty' for codec 'raw'"):
        fastload.ShardDataset(dataset)
    assert path.exists()
    with pytest.raises(ValueError, match="unknown option 'levle' for codec 'zstd'; it takes layout, level"):
        Field("x", "uint8", (4,), "zstd", {"levle": 3})


def test_schema_width_is_bounded_when_written_and_read(dataset, tmp_path):
    assert MAX_FIELDS == 1024
    wide = {f"f{i}": np.zeros((1,), np.uint8) for i in range(MAX_FIELDS + 1)}
    with pytest.raises(SchemaMismatchError, match=r"a schema of 1025 fields; a schema has 1 to 1024"):
        fastload.write_arrays(tmp_path / "wide", wide)

    def widen(n):
        return lambda d: d["schema"].extend({"name": f"f{i}", "dtype": "uint8", "shape": [1], "codec": "raw"}
                                            for i in range(n - 2))
    _edit(dataset, widen(MAX_FIELDS + 1))
    with pytest.raises(DatasetError, match=r"schema: 1025 fields; a schema has 1 to 1024"):
        fastload.ShardDataset(dataset)


# Records of 2 fields under a manifest of many: the error must come while opening, at a cost linear in the
# width (65,535 fields once never finished; ShardDataset compared Field objects in a list).
_WIDE_CHILD = r"""
import json, sys
from pathlib import Path
import fastload
from fastload.errors import CorruptRecordError, DatasetError
path = Path(sys.argv[1]) / "manifest.json"
doc = json.loads(path.read_text())
base = doc["schema"][:2]
for n, expected in ((65535, DatasetError), (1024, CorruptRecordError)):
    doc["schema"] = base + [{"name": f"f{i}", "dtype": "uint8", "shape": [1]} for i in range(n - 2)]
    path.write_text(json.dumps(doc))
    for make in (lambda: fastload.ShardDataset(sys.argv[1])[0], lambda: next(iter(fastload.ShardLoader(sys.argv[1]))),
                 lambda: fastload.ShardDataset(sys.argv[1], fields=[f"f{i}" for i in range(n - 2)])[0],
                 lambda: next(iter(fastload.ShardLoader(sys.argv[1], backend="torch", num_workers=0)))):
        try:
            make()
        except expected as err:
            print(n, type(err).__name__, str(err).splitlines()[0][-60:])
"""


@pytest.mark.slow  # tier: writes and opens a schema at the width bound
def test_a_wide_schema_fails_at_open_without_hanging(dataset):
    out = subprocess.run([sys.executable, "-c", _WIDE_CHILD, str(dataset)], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 8, out.stdout
    assert all("65535 DatasetError" in line and "1 to 1024" in line for line in lines[:4]), lines
    assert all("1024 CorruptRecordError" in line and "record has 2 fields, schema has 1024" in line
               for line in lines[4:]), lines
    assert CorruptRecordError  # the parent imports what the child checks


@pytest.fixture
def split_root(pristine, tmp_path) -> Path:
    root = tmp_path / "root"
    for name in ("train", "val"):
        (root / name).mkdir(parents=True)
        for path in pristine.iterdir():
            (root / name / path.name).write_bytes(path.read_bytes())
    write_splits(root, {n: {"path": n, "samples": 4, "sources": 1, "class_counts": None} for n in ("train", "val")},
                 {})
    return root


SPLITS = {
    "100000 levels": (lambda t: t.rstrip()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                      r"invalid splits index: nested deeper than 64 levels"),
    "path 5": (lambda t: t.replace('"path": "val"', '"path": 5'), r"splits\['val'\]\.path: expected a directory name"),
    "path missing": (lambda t: t.replace('"path": "val"', '"path": "5"'), r"splits\['val'\]\.path: '5' is not a dir"),
    "path shared": (lambda t: t.replace('"path": "val"', '"path": "train"'), r"'train' is also split 'train'"),
    "path escapes": (lambda t: t.replace('"path": "val"', '"path": ".."'), r"'\.\.' must be a plain directory name"),
    "class_counts list": (lambda t: t.replace('"class_counts": null', '"class_counts": [1]', 1),
                          r"splits\['train'\]\.class_counts: expected null or an object"),
    "samples 1e999": (lambda t: t.replace('"samples": 4', '"samples": 1e999', 1), r"1e999 is not a finite number"),
    "samples -1": (lambda t: t.replace('"samples": 4', '"samples": -1', 1), r"splits\['train'\]\.samples: -1"),
    "duplicate split": (lambda t: t.replace('"val": {', '"train": {'), r"duplicate key 'train'"),
    "no splits": (lambda t: json.dumps({"format": "fastload-splits", "splits": {}}), r"splits: expected an object"),
    "not UTF-8": (lambda t: t.replace('"val"', '"\udcff"', 1), r"unreadable splits index"),
}


@pytest.mark.parametrize("case", list(SPLITS))
def test_a_hostile_splits_index_is_one_dataset_error(split_root, case):
    change, expected = SPLITS[case]
    path = split_root / "splits.json"
    path.write_bytes(change(path.read_text()).encode("utf-8", "surrogateescape"))
    for make in (lambda: fastload.ShardDataset(split_root, split="train"),
                 lambda: fastload.ShardLoader(split_root, split="train", backend="native")):
        with pytest.raises(DatasetError, match=expected) as err:
            make()
        assert str(path) in str(err.value)
    if case in ("100000 levels", "path 5", "class_counts list"):  # the command line: one line, a failing status
        for command in ("info", "verify"):
            r = run_cli("fastload", command, str(split_root))
            assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, (command, r.stdout, r.stderr)
            assert str(path) in r.stdout + r.stderr and len((r.stdout + r.stderr).strip().splitlines()) == 1
