"""Golden datasets (tests/data/golden, written once by scripts/make_golden.py): every format version keeps reading.

The values are computed here again from the formula (not taken from the script), so a reader that
decodes wrongly, or a golden file that changed, fails. The v4 dataset is also written again with
today's writer: its shard files and manifest must be byte-identical to the committed ones, so an
accidental change of the format (a record header, a block, the manifest, the binding) is caught.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import shutil
from pathlib import Path

import lmdb
import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload.format._blocks import BLOCK_HEADER, iter_block_records
from fastload.format._manifest import MANIFEST_NAME
from fastload.format._verify import verify_dataset

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
VERSIONS = [1, 2, 3, 4]
COUNTS = [5, 3]
SHARDS = ["shard-00000.lmdb", "shard-00001.lmdb"]


def expected() -> dict[str, np.ndarray]:
    """The golden samples, field by field (the formula of scripts/make_golden.py, written out again)."""
    n = sum(COUNTS)
    image = np.zeros((n, 3, 4, 4), np.uint8)
    vec = np.zeros((n, 2, 3), np.uint16)
    label = np.zeros(n, np.int64)
    for i in range(n):
        for c in range(3):
            for y in range(4):
                for x in range(4):
                    image[i, c, y, x] = (37 * i + 16 * c + 4 * y + 3 * x) % 256
        for j in range(2):
            for k in range(3):
                vec[i, j, k] = 0 if i % 5 == 3 else (4099 * i + 257 * j + 31 * k) % 65536
        label[i] = (2**33 * i + 7) * (1 if i % 2 == 0 else -1)
    return {"image": image, "vec": vec, "label": label}


def golden(version: int) -> Path:
    return GOLDEN / f"v{version}"


def dataset_values(path: Path) -> dict[str, np.ndarray]:
    ds = fastload.ShardDataset(path)
    return {name: np.stack([ds[i][name].numpy() for i in range(len(ds))]) for name in ("image", "vec", "label")}


def loader_values(path: Path, backend: str) -> dict[str, np.ndarray]:
    options = {"num_threads": 2} if backend == "native" else {"num_workers": 0}
    batches = list(fastload.ShardLoader(path, batch_size=3, backend=backend, **options))
    return {name: np.concatenate([b[name].numpy() for b in batches]) for name in ("image", "vec", "label")}


def assert_golden_values(got: dict[str, np.ndarray]) -> None:
    for name, want in expected().items():
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_files_are_small_and_of_their_version(version):
    doc = json.loads((golden(version) / MANIFEST_NAME).read_text())
    assert doc["format_version"] == version and [s["count"] for s in doc["shards"]] == COUNTS
    assert [s["file"] for s in doc["shards"]] == SHARDS
    assert doc["provenance"] == {"tool": "fastload scripts/make_golden.py"}  # no date: rewrites are byte-identical
    assert sorted(p.name for p in golden(version).iterdir()) == [MANIFEST_NAME, *SHARDS]
    assert sum(p.stat().st_size for p in golden(version).iterdir()) < 100_000


@pytest.mark.parametrize("version", VERSIONS)
def test_shard_dataset_reads_every_golden_version(version):
    assert_golden_values(dataset_values(golden(version)))


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("version", VERSIONS)
def test_shard_loader_reads_every_golden_version(version, backend):
    assert_golden_values(loader_values(golden(version), backend))


@pytest.mark.parametrize("version", VERSIONS)
def test_verify_finds_every_golden_version_sound(version):
    report = verify_dataset(golden(version))
    assert report.ok and report.shards == 2 and report.records == 8
    assert bool(report.notes) == (version < 4)  # v1 and v2: their weaker guarantees; v3: its size; all: upgrade
    assert all("fastload upgrade" in note for note in report.notes)
    r = run_cli("fastload", "verify", str(golden(version)), "--no-progress")
    assert r.returncode == 0 and "OK: 2 shards, 8 records" in r.stdout


def test_golden_v4_shards_hold_one_block_each_with_both_index_widths():
    widths = []
    for shard, count in zip(SHARDS, COUNTS):
        env = lmdb.open(str(golden(4) / shard), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            values = [bytes(v) for _, v in txn.cursor()]
        env.close()
        assert len(values) == 1 and len(list(iter_block_records(values))) == count
        widths.append(BLOCK_HEADER.unpack_from(values[0], 0)[2])
    assert widths == [2, 0]  # the first block has a record of another length (sample 3's zstd frame)


def load_script():
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "scripts" / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(mmap.PAGESIZE != 4096, reason="LMDB writes pages of the OS page size; the golden files have 4 KiB")
def test_todays_writer_writes_the_golden_v4_dataset_byte_for_byte(tmp_path):
    script = load_script()
    recorded = json.loads((golden(4).parent / script.LIBRARIES_FILE).read_text())
    if script.writer_libraries() != recorded:  # their output is in the bytes, and is theirs to change
        pytest.skip(f"the golden files were written with {recorded}, this writer runs on "
                    f"{script.writer_libraries()}: the bytes may differ without a format change")
    script.write_golden(tmp_path / "v4", 4)
    for name in [MANIFEST_NAME, *SHARDS]:
        assert (tmp_path / "v4" / name).read_bytes() == (golden(4) / name).read_bytes(), (
            f"{name}: today's writer writes the golden v4 dataset differently: the format changed (a record, a "
            "block, the binding, the manifest), or a library under it did (LMDB, zstd). A deliberate format change "
            "is a new format version: add its golden dataset with scripts/make_golden.py --version N")


@pytest.mark.skipif(mmap.PAGESIZE != 4096, reason="LMDB writes pages of the OS page size; the golden files have 4 KiB")
def test_upgrading_golden_v3_gives_golden_v4_exactly(tmp_path):
    shutil.copytree(golden(3), tmp_path / "v3")
    fastload.upgrade_dataset(tmp_path / "v3")
    for name in SHARDS:
        assert (tmp_path / "v3" / name).read_bytes() == (golden(4) / name).read_bytes(), name
    upgraded = json.loads((tmp_path / "v3" / MANIFEST_NAME).read_text())
    v3_fingerprint = fastload.ShardDataset(golden(3)).manifest.fingerprint
    golden4 = fastload.ShardDataset(golden(4)).manifest
    assert upgraded.pop("upgraded_from") == {"format_version": 3, "fingerprint": v3_fingerprint,
                                             "content": golden4.content_fingerprint}
    assert upgraded == json.loads((golden(4) / MANIFEST_NAME).read_text())


@pytest.mark.parametrize("version", [1, 2])
def test_upgrading_golden_v1_v2_keeps_the_values(tmp_path, version):
    shutil.copytree(golden(version), tmp_path / "ds")
    fastload.upgrade_dataset(tmp_path / "ds")
    assert json.loads((tmp_path / "ds" / MANIFEST_NAME).read_text())["format_version"] == 4
    assert_golden_values(dataset_values(tmp_path / "ds"))
    assert_golden_values(loader_values(tmp_path / "ds", "native"))
    assert verify_dataset(tmp_path / "ds").ok
