import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import tifffile
from conftest import run_cli
from PIL import Image

import fastload
from fastload.conversion._tiling import tile_grid, tile_origins

pytestmark = pytest.mark.slow  # tier: preprocess_tiles runs in subprocesses


@pytest.fixture(scope="session")
def photo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("photos")
    (d / "a").mkdir()
    (d / "b").mkdir()
    Image.fromarray(skimage.data.astronaut()).save(d / "a" / "astronaut.png")
    Image.fromarray(skimage.data.chelsea()).save(d / "b" / "chelsea.png")
    Image.fromarray(skimage.data.coffee()).save(d / "b" / "coffee.jpg", quality=92)
    return d


@pytest.fixture(scope="session")
def raster_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rasters")
    rng = np.random.default_rng(3)
    grid = np.indices((130, 170)).sum(axis=0)
    for i in range(4):
        bands = (grid[None] * (i + 1) * 40 + rng.integers(0, 500, size=(6, 130, 170))).astype(np.uint16)
        tifffile.imwrite(d / f"scene{i}.tif", bands, photometric="minisblack", planarconfig="separate")
    np.save(d / "scene9.npy", bands.transpose(1, 2, 0)[:, :, :6].copy())
    return d


def load_hwc(path: Path) -> np.ndarray:
    if path.suffix == ".tif":
        return tifffile.imread(path).transpose(1, 2, 0)
    if path.suffix == ".npy":
        return np.load(path)
    return np.asarray(Image.open(path))


def expected_tiles(data_dir: Path, tile: int, stride: int, edge: str, layout: str):
    for rel in sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*") if p.is_file()):
        image = load_hwc(data_dir / rel)
        for y, x in tile_grid(image.shape[0], image.shape[1], (tile, tile), (stride, stride), edge):
            t = np.zeros((tile, tile, image.shape[2]), image.dtype)
            part = image[y:y + tile, x:x + tile]
            t[: part.shape[0], : part.shape[1]] = part
            yield rel, (t.transpose(2, 0, 1) if layout == "chw" else t)


def test_tile_origins():
    assert tile_origins(10, 4, 4, "drop") == [0, 4]
    assert tile_origins(10, 4, 4, "pad") == [0, 4, 8]
    assert tile_origins(10, 4, 3, "pad") == [0, 3, 6]
    assert tile_origins(3, 4, 4, "drop") == []
    assert tile_origins(3, 4, 4, "pad") == [0]


@pytest.mark.parametrize(("edge", "layout", "codec"), [("pad", "chw", "zstd"), ("drop", "hwc", "raw"),
                                                      ("pad", "chw", "png"), ("drop", "hwc", "lz4")])
def test_tiles_of_photographs_equal_numpy_slices(tmp_path, photo_dir, edge, layout, codec):
    out = tmp_path / "out"
    run_cli("preprocess_tiles", "--data-dir", str(photo_dir), "--output-dir", str(out), "--tile-size", "96",
            "--stride", "80", "--edge", edge, "--layout", layout, "--codec", codec, "--samples-per-shard", "50",
            "--labels-from-dirs", "--order", "source", check=True)
    ds = fastload.ShardDataset(out)
    expected = list(expected_tiles(photo_dir, 96, 80, edge, layout))
    assert len(ds) == len(expected) > 50
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == ["a", "b"]
    starts = {s["path"]: s["first_sample"] for s in manifest["sources"]}
    for i, (rel, tile) in enumerate(expected):
        item = ds[i]
        assert np.array_equal(item["image"].numpy(), tile), (i, rel)
        assert int(item["label"]) == (0 if rel.startswith("a/") else 1)
        assert starts[rel] <= i


@pytest.mark.parametrize("codec", ["zstd-shuffle", "lz4-shuffle"])
def test_tiles_of_multiband_uint16_rasters(tmp_path, raster_dir, codec):
    out = tmp_path / "out"
    run_cli("preprocess_tiles", "--data_dir", str(raster_dir), "--output_dir", str(out), "--tile-size", "32x48",
            "--stride", "30x40", "--codec", codec, "--order", "source", check=True)
    ds = fastload.ShardDataset(out)
    assert ds.schema[0].dtype == "uint16" and ds.schema[0].shape == (6, 32, 48)
    i = 0
    for rel in sorted(p.name for p in raster_dir.iterdir()):
        image = load_hwc(raster_dir / rel)
        for y, x in tile_grid(130, 170, (32, 48), (30, 40), "drop"):
            assert np.array_equal(ds[i]["image"].numpy(), image[y:y + 32, x:x + 48].transpose(2, 0, 1))
            i += 1
    assert i == len(ds)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.lmdb"))}


def manifest_without_time(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc["provenance"].pop("created")
    return doc


@pytest.mark.parametrize("codec", ["zstd", "lz4", "png", "jpeg"])
def test_workers_give_byte_identical_output(tmp_path, photo_dir, codec):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_cli("preprocess_tiles", "--data-dir", str(photo_dir), "--output-dir", str(out), "--tile-size", "64",
                "--codec", codec, "--workers", str(workers), "--shard-size", "30KB" if codec == "jpeg" else "100KB",
                check=True)
        outs.append(out)
    assert len(shard_bytes(outs[0])) > 3
    assert shard_bytes(outs[0]) == shard_bytes(outs[1])
    assert manifest_without_time(outs[0] / "manifest.json") == manifest_without_time(outs[1] / "manifest.json")


def test_shard_size_limit_is_respected(tmp_path, raster_dir):
    out = tmp_path / "out"
    run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(out), "--tile-size", "32",
            "--shard-size", "100KB", check=True)
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["shards"]) > 3
    record = 6 * 32 * 32 * 2
    assert all(s["count"] * record <= 100_000 for s in m["shards"])


def test_val_split_is_by_source_and_seeded(tmp_path, raster_dir):
    def split(seed, name):
        out = tmp_path / name
        run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(out), "--tile-size", "40",
                "--val-fraction", "0.4", "--seed", str(seed), check=True)
        docs = {s: json.loads((out / s / "manifest.json").read_text()) for s in ("train", "val")}
        return {s: [x["path"] for x in d["sources"]] for s, d in docs.items()}, out

    first, out = split(0, "a")
    again, _ = split(0, "b")
    assert first == again
    assert len(first["val"]) == 2 and len(first["train"]) == 3
    assert not set(first["train"]) & set(first["val"])
    assert len(fastload.ShardDataset(out / "val")) == 2 * len(tile_grid(130, 170, (40, 40), (40, 40), "drop"))
    others = [split(seed, f"s{seed}")[0]["val"] for seed in (1, 2, 3)]
    assert any(o != first["val"] for o in others)


def test_labels_from_csv(tmp_path, raster_dir):
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"{p.name},{i % 3}\n" for i, p in enumerate(sorted(raster_dir.iterdir()))))
    out = tmp_path / "out"
    run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(out), "--labels", str(csv),
            "--order", "source", check=True)
    ds = fastload.ShardDataset(out)
    assert [int(ds[i]["label"]) for i in range(len(ds))] == [0, 1, 2, 0, 1]


def test_dtype_cast_and_refused_lossy_cast(tmp_path, raster_dir):
    ok = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(tmp_path / "f"),
                 "--dtype", "float32", check=True)
    assert ok.returncode == 0
    assert fastload.ShardDataset(tmp_path / "f")[0]["image"].dtype.is_floating_point
    bad = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(tmp_path / "u"),
                  "--dtype", "uint8")
    assert bad.returncode == 1 and "scene0.tif" in bad.stderr and "do not fit --dtype uint8" in bad.stderr
    assert not (tmp_path / "u" / "manifest.json").exists()


# ---- bad input ---------------------------------------------------------------------------------


def test_missing_and_empty_input_directories(tmp_path):
    r = run_cli("preprocess_tiles", "--data-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 1 and "nope: no such directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run_cli("preprocess_tiles", "--data-dir", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 1 and "no images found" in r.stderr


def test_mixed_shapes_list_the_offending_files(tmp_path, photo_dir):
    r = run_cli("preprocess_tiles", "--data-dir", str(photo_dir), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 1
    assert "images differ in shape" in r.stderr and "b/chelsea.png" in r.stderr and "b/coffee.jpg" in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_not_an_image_stops_the_run_or_is_skipped(tmp_path, raster_dir):
    data = tmp_path / "data"
    data.mkdir()
    for p in raster_dir.glob("*.tif"):
        (data / p.name).write_bytes(p.read_bytes())
    (data / "scene2.png").write_text("this is not a picture")
    (data / "notes.txt").write_text("ignored")
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 1 and "scene2.png" in r.stderr and "unreadable image" in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "skipping scene2.png" in r.stderr and "notes.txt" in r.stderr
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert [s["path"] for s in m["skipped"]] == ["scene2.png"] and m["total"] == 4


def test_truncated_image_found_while_decoding(tmp_path, photo_dir):
    data = tmp_path / "data"
    data.mkdir()
    full = (photo_dir / "a" / "astronaut.png").read_bytes()
    (data / "a.png").write_bytes(full)
    (data / "b.png").write_bytes(full[: len(full) // 2])
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "o"), "--workers", "2")
    assert r.returncode == 1 and "b.png" in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 0
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["skipped"][0]["path"] == "b.png"


def test_label_csv_naming_a_missing_file(tmp_path, raster_dir):
    csv = tmp_path / "labels.csv"
    csv.write_text("scene0.tif,1\nghost.tif,2\n")
    r = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(tmp_path / "o"),
                "--labels", str(csv))
    assert r.returncode == 1 and "line 2: ghost.tif names a file missing" in r.stderr


def test_unknown_codec_is_a_usage_error(tmp_path, raster_dir):
    r = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(tmp_path / "o"),
                "--codec", "brotli")
    assert r.returncode == 2 and "invalid choice: 'brotli'" in r.stderr


@pytest.mark.parametrize(("codec", "problem", "fits"), [
    ("png", "png holds 1 to 4 channels, not 6", "raw, zstd, zstd-shuffle, lz4, lz4-shuffle"),
    ("jpeg", "jpeg holds uint8, not uint16", "raw, zstd, zstd-shuffle, lz4, lz4-shuffle"),
])
def test_a_codec_that_cannot_hold_the_images_is_refused(tmp_path, raster_dir, codec, problem, fits):
    r = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(tmp_path / "o"),
                "--codec", codec)
    assert r.returncode == 2, r.stderr
    assert problem in r.stderr and f"codecs that fit: {fits}" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_existing_output_is_refused_without_overwrite(tmp_path, raster_dir):
    out = tmp_path / "o"
    args = ("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(out))
    run_cli(*args, check=True)
    r = run_cli(*args)
    assert r.returncode == 2 and "--overwrite" in r.stderr
    assert run_cli(*args, "--overwrite").returncode == 0
    stranger = tmp_path / "home"
    stranger.mkdir()
    (stranger / "thesis.tex").write_text("precious")
    r = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(stranger), "--overwrite")
    assert r.returncode == 2 and "not a fastload output directory" in r.stderr
    assert (stranger / "thesis.tex").exists()


# ---- crash safety ------------------------------------------------------------------------------


def test_sigkill_midway_then_resume_equals_uninterrupted_run(tmp_path, photo_dir):
    common = ["--data-dir", str(photo_dir), "--tile-size", "40", "--stride", "40", "--codec", "zstd",
              "--samples-per-shard", "25", "--labels-from-dirs", "--no-progress"]
    reference = tmp_path / "reference"
    run_cli("preprocess_tiles", *common, "--output-dir", str(reference), check=True)
    n_shards = len(json.loads((reference / "manifest.json").read_text())["shards"])
    assert n_shards >= 6

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fastload.preprocess", *common, "--output-dir", str(out)],
                            env={**os.environ, "FASTLOAD_TEST_SHARD_DELAY": "0.3"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = out / ".progress.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if progress.exists() and len(json.loads(progress.read_text())["shards"]) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(json.loads(progress.read_text())["shards"])
    assert 3 <= done < n_shards, "the run was not interrupted midway"
    assert not (out / "manifest.json").exists()
    with pytest.raises(fastload.DatasetError, match="incomplete dataset.*--resume"):
        fastload.ShardDataset(out)

    r = run_cli("preprocess_tiles", *common, "--output-dir", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    assert shard_bytes(out) == shard_bytes(reference)
    assert manifest_without_time(out / "manifest.json") == manifest_without_time(reference / "manifest.json")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())


def test_resume_refuses_changed_options(tmp_path, raster_dir):
    out = tmp_path / "o"
    out.mkdir()
    (out / ".progress.json").write_text(json.dumps({"fingerprint": "other", "shards": [], "skipped": []}))
    r = run_cli("preprocess_tiles", "--data-dir", str(raster_dir), "--output-dir", str(out), "--resume")
    assert r.returncode == 1 and "other options or changed source files" in r.stderr
