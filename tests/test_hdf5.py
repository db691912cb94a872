"""HDF5 input: stacks of samples read in row chunks, and rasters tiled like other images."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload.conversion import _hdf5
from fastload.preprocess import main as preprocess_main


def shard_bytes(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("*.lmdb"))]


def preprocess(data: Path, out: Path, *options: str):
    return run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(out), "--no-progress", *options)


@pytest.fixture(scope="session")
def stacks(tmp_path_factory) -> tuple[Path, list[np.ndarray], list[np.ndarray]]:
    d = tmp_path_factory.mktemp("stacks")
    rng = np.random.default_rng(5)
    images, labels = [], []
    for i, n in enumerate((37, 50)):
        x = rng.integers(0, 255, size=(n, 3, 16, 16), dtype=np.uint8)
        y = rng.integers(0, 10, size=n).astype(np.int32)
        with h5py.File(d / f"part{i}.h5", "w") as f:
            f.create_dataset("images", data=x, chunks=(8, 3, 16, 16), compression="gzip")
            f.create_dataset("labels", data=y)
        images.append(x)
        labels.append(y)
    return d, images, labels


def test_stacks_are_read_in_chunks_and_equal_the_source(tmp_path, stacks, monkeypatch):
    data, images, labels = stacks
    info = _hdf5.probe_stack(data / "part0.h5", "images", "labels")
    assert info.count == 37 and info.shape == (3, 16, 16) and info.rows % 8 == 0
    monkeypatch.setattr(_hdf5, "CHUNK_BYTES", 10 * 3 * 16 * 16)
    assert _hdf5.probe_stack(data / "part0.h5", "images", None).rows == 8  # whole HDF5 chunks, about 10 rows
    calls = []
    real = _hdf5.encode_stack_rows
    monkeypatch.setattr(_hdf5, "encode_stack_rows", lambda *a: calls.append(a[3:]) or real(*a))
    argv = ["--data-dir", str(data), "--output-dir", str(tmp_path / "o"), "--no-progress", "--h5-dataset", "images",
            "--h5-labels", "labels", "--codec", "zstd", "--samples-per-shard", "20", "--order", "source"]
    assert preprocess_main(argv) == 0
    assert calls[:5] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 37)] and calls[5] == (0, 8)
    monkeypatch.setattr(_hdf5, "encode_stack_rows", real)
    assert preprocess_main([*argv[:3], str(tmp_path / "w2"), *argv[4:], "--workers", "2"]) == 0
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "w2")
    ds = fastload.ShardDataset(tmp_path / "o")
    assert len(ds) == 87 and ds.schema[0].shape == (3, 16, 16)
    x, y = np.concatenate(images), np.concatenate(labels)
    for i in range(87):
        assert np.array_equal(ds[i]["image"].numpy(), x[i]) and int(ds[i]["label"]) == y[i]
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [(s["path"], s["samples"]) for s in m["sources"]] == [("part0.h5", 37), ("part1.h5", 50)]


def test_stacks_read_rows_without_loading_the_file(stacks):
    data, images, _ = stacks
    settings = _hdf5.StackSettings(str(data), (fastload.Field("image", "uint8", (3, 16, 16)),), "images", None)
    records = _hdf5.encode_stack_rows(settings, "part1.h5", None, 10, 13)
    assert len(records) == 3


def test_missing_h5_dataset_names_the_file_and_the_datasets(tmp_path, stacks):
    r = preprocess(stacks[0], tmp_path / "o", "--h5-dataset", "pixels")
    assert r.returncode == 1 and "part0.h5" in r.stderr and "part1.h5" in r.stderr
    assert "no dataset 'pixels' (--h5-dataset); the file has: images, labels" in r.stderr


def test_h5_option_combinations_are_refused(tmp_path, stacks):
    r = preprocess(stacks[0], tmp_path / "o", "--h5-dataset", "images", "--tile-size", "8")
    assert r.returncode == 2 and "cannot be combined with --tile-size" in r.stderr
    r = preprocess(stacks[0], tmp_path / "o", "--h5-labels", "labels")
    assert r.returncode == 2 and "--h5-labels needs --h5-dataset" in r.stderr


def test_hdf5_rasters_are_tiled_like_other_images(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(2)
    scene = rng.integers(0, 60000, size=(4, 64, 96)).astype(np.uint16)  # bands first
    with h5py.File(data / "scene.hdf5", "w") as f:
        f.create_dataset("bands", data=scene, chunks=(1, 32, 32), compression="lzf")
    r = preprocess(data, tmp_path / "o", "--tile-size", "32", "--order", "source")
    assert r.returncode == 0, r.stderr
    ds = fastload.ShardDataset(tmp_path / "o")
    assert len(ds) == 6 and ds.schema[0].shape == (4, 32, 32)
    assert np.array_equal(ds[4]["image"].numpy(), scene[:, 32:64, 32:64])
    with h5py.File(data / "two.h5", "w") as f:
        f.create_dataset("a", data=scene)
        f.create_dataset("b", data=scene)
    r = preprocess(data, tmp_path / "p", "--tile-size", "32")
    assert r.returncode == 1 and "two.h5" in r.stderr and "exactly one 2-D or 3-D dataset" in r.stderr
