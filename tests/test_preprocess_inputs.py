"""Inputs read as their users mean them: NPY layout, Pillow modes, label CSVs."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

import fastload
from fastload.conversion._images import npy_layout_of

pytestmark = pytest.mark.slow  # tier: preprocess_tiles runs in subprocesses


def preprocess(data: Path, out: Path, *options: str):
    return run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(out), "--no-progress", *options)


@pytest.mark.parametrize(("shape", "layout"), [((5, 256, 256), "chw"), ((256, 256, 5), "hwc"), ((3, 40, 90), "chw"),
                                               ((40, 90, 4), "hwc"), ((200, 300, 100), "hwc")])
def test_npy_layout_is_detected(shape, layout):
    assert npy_layout_of(shape, "auto") == layout
    assert npy_layout_of(shape, "hwc") == "hwc"


@pytest.mark.parametrize("shape", [(64, 64, 64), (3, 256, 3), (100, 120, 130)])
def test_ambiguous_npy_layout_is_refused(shape):
    with pytest.raises(ValueError, match="pass --npy-layout chw or --npy-layout hwc"):
        npy_layout_of(shape, "auto")


def test_bands_first_npy_scenes_are_tiled_as_bands(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    scenes = [rng.integers(0, 60000, size=(5, 256, 256)).astype(np.uint16) for _ in range(2)]
    for i, s in enumerate(scenes):
        np.save(data / f"scene{i}.npy", s)
    r = preprocess(data, tmp_path / "o", "--tile-size", "64", "--order", "source")
    assert r.returncode == 0, r.stderr
    ds = fastload.ShardDataset(tmp_path / "o")
    assert ds.schema[0].shape == (5, 64, 64) and len(ds) == 2 * 16
    assert np.array_equal(ds[5]["image"].numpy(), scenes[0][:, 64:128, 64:128])


def test_ambiguous_npy_is_an_error_naming_the_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "cube.npy", np.zeros((64, 64, 64), np.uint8))
    r = preprocess(data, tmp_path / "o")
    assert r.returncode == 1 and "cube.npy: 3-D array of shape (64, 64, 64)" in r.stderr
    assert "pass --npy-layout chw or --npy-layout hwc" in r.stderr and "ValueError" not in r.stderr
    assert preprocess(data, tmp_path / "p", "--npy-layout", "chw").returncode == 0


@pytest.fixture(scope="session")
def mixed_modes(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("modes")
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(d / "rgb.png")
    Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8)).save(d / "grey.png")
    Image.fromarray(rng.integers(0, 255, (32, 32, 4), dtype=np.uint8)).save(d / "rgba.png")
    return d


def test_mixed_modes_suggest_mode_and_mode_converts(tmp_path, mixed_modes):
    r = preprocess(mixed_modes, tmp_path / "o")
    assert r.returncode == 1 and "images differ in channels" in r.stderr and "--mode RGB" in r.stderr
    assert "rgb.png" in r.stderr or "rgba.png" in r.stderr
    for mode, channels in (("RGB", 3), ("L", 1), ("RGBA", 4)):
        out = tmp_path / mode
        assert preprocess(mixed_modes, out, "--mode", mode, "--order", "source").returncode == 0  # ds[i]: file i
        ds = fastload.ShardDataset(out)
        assert ds.schema[0].shape == (channels, 32, 32)
        for i, name in enumerate(sorted(p.name for p in mixed_modes.iterdir())):
            expected = np.asarray(Image.open(mixed_modes / name).convert(mode)).reshape(32, 32, channels)
            assert np.array_equal(ds[i]["image"].numpy(), expected.transpose(2, 0, 1))


def test_mode_refuses_16_bit_images(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    Image.fromarray(np.full((8, 8), 4000, np.uint16)).save(data / "deep.png")
    r = preprocess(data, tmp_path / "o", "--mode", "RGB")
    assert r.returncode == 1 and "deep.png" in r.stderr and "--mode keep" in r.stderr


@pytest.fixture(scope="session")
def four_images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("four")
    for i in range(4):
        np.save(d / f"im{i}.npy", np.full((4, 4), i, np.uint8))
    return d


def labels_of(out: Path) -> list[int]:
    ds = fastload.ShardDataset(out)
    return [int(ds[i]["label"]) for i in range(len(ds))]


def test_csv_header_is_detected_and_label_column_found_by_name(tmp_path, four_images):
    csv = tmp_path / "labels.csv"
    csv.write_text("filename,split,label\n" + "".join(f"im{i}.npy,train,{'cat' if i % 2 else 'dog'}\n"
                                                      for i in range(4)))
    assert preprocess(four_images, tmp_path / "o", "--labels", str(csv), "--order", "source").returncode == 0
    assert labels_of(tmp_path / "o") == [1, 0, 1, 0]
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["classes"] == ["cat", "dog"]
    assert fastload.ShardDataset(tmp_path / "o").classes == ["cat", "dog"]


def test_csv_columns_by_name(tmp_path, four_images):
    csv = tmp_path / "labels.csv"
    csv.write_text("kind,img,score\n" + "".join(f"{i * 10},im{i}.npy,{3 - i}\n" for i in range(4)))
    r = preprocess(four_images, tmp_path / "o", "--labels", str(csv), "--path-column", "img",
                   "--label-column", "score", "--order", "source")
    assert r.returncode == 0, r.stderr
    assert labels_of(tmp_path / "o") == [3, 2, 1, 0]
    r = preprocess(four_images, tmp_path / "p", "--labels", str(csv), "--label-column", "nope")
    assert r.returncode == 1 and "labels.csv: no column 'nope'" in r.stderr and "score" in r.stderr


def test_csv_with_three_columns_and_no_label_column_is_an_error(tmp_path, four_images):
    csv = tmp_path / "labels.csv"
    csv.write_text("filename,split,quality\n" + "".join(f"im{i}.npy,train,{i}\n" for i in range(4)))
    r = preprocess(four_images, tmp_path / "o", "--labels", str(csv))
    assert r.returncode == 1 and "labels.csv: 3 columns" in r.stderr and "--label-column" in r.stderr
    headless = tmp_path / "headless.csv"
    headless.write_text("".join(f"im{i}.npy,train,{i}\n" for i in range(4)))
    r = preprocess(four_images, tmp_path / "p", "--labels", str(headless))
    assert r.returncode == 1 and "headless.csv: 3 columns and no header" in r.stderr and "--label-column" in r.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()


def test_csv_without_header_and_integer_labels(tmp_path, four_images):
    csv = tmp_path / "labels.csv"
    csv.write_text("".join(f"im{i}.npy,{i * 2}\n" for i in range(4)))
    assert preprocess(four_images, tmp_path / "o", "--labels", str(csv), "--order", "source").returncode == 0
    assert labels_of(tmp_path / "o") == [0, 2, 4, 6]
    assert "classes" not in json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert fastload.ShardDataset(tmp_path / "o").classes is None
