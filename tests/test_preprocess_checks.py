"""preprocess_tiles never exits 0 with a wrong or empty result: options, casts, empty outputs, bad files."""

import json
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import tifffile
from conftest import run_cli
from PIL import Image

import fastload

pytestmark = pytest.mark.slow  # tier: preprocess_tiles runs in subprocesses


@pytest.fixture(scope="session")
def mixed_sizes(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mixed_sizes")
    Image.fromarray(skimage.data.astronaut()).save(d / "astronaut.png")  # 512x512
    Image.fromarray(skimage.data.chelsea()).save(d / "chelsea.png")  # 300x451
    Image.fromarray(skimage.data.coffee()).save(d / "coffee.jpg")  # 400x600
    return d


def preprocess(data: Path, out: Path, *options: str):
    return run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(out), "--no-progress", *options)


def test_tile_larger_than_every_image_is_an_error_naming_them(tmp_path, mixed_sizes):
    r = preprocess(mixed_sizes, tmp_path / "o", "--tile-size", "2048")
    assert r.returncode == 1
    assert "would hold 0 samples" in r.stderr and "--edge pad" in r.stderr
    for name in ("astronaut.png (512x512)", "chelsea.png (300x451)", "coffee.jpg (400x600)"):
        assert name in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    assert preprocess(mixed_sizes, tmp_path / "p", "--tile-size", "2048", "--edge", "pad").returncode == 0
    assert len(fastload.ShardDataset(tmp_path / "p")) == 3


def test_an_empty_split_is_an_error(tmp_path, mixed_sizes):
    # Seed 0 sends astronaut.png (the only image of 512 or more) to one split; the other split is empty.
    results = [preprocess(mixed_sizes, tmp_path / f"o{seed}", "--tile-size", "500", "--val-fraction", "0.34",
                          "--seed", str(seed)) for seed in range(4)]
    assert {r.returncode for r in results} == {1}
    for r in results:
        assert "split 'train' would hold 0 samples" in r.stderr or "split 'val' would hold 0 samples" in r.stderr
        assert "--edge pad" in r.stderr
    assert not list(tmp_path.rglob("manifest.json")) and not list(tmp_path.rglob("splits.json"))


def test_images_without_tiles_are_warned_and_listed(tmp_path, mixed_sizes):
    r = preprocess(mixed_sizes, tmp_path / "o", "--tile-size", "400")
    assert r.returncode == 0, r.stderr
    assert "warning: 1 image(s) are smaller than --tile-size 400x400" in r.stderr and "chelsea.png" in r.stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["no_tiles"] == [{"path": "chelsea.png", "height": 300, "width": 451}]
    assert m["total"] == 2


@pytest.mark.parametrize(("values", "dtype", "message"), [
    ([0, 70000], "float16", "not all exact in --dtype float16 (max 65504); use --dtype float32"),
    ([0, 3001], "float16", "not all exact in --dtype float16 (max 65504); use --dtype float32"),
    ([0, 1e39], "float32", "overflow --dtype float32"),
    ([-1, 200], "uint8", "do not fit --dtype uint8; use --dtype int16"),
    ([0.5, 2], "int32", "not whole numbers"),
])
def test_lossy_casts_are_refused_naming_a_dtype_that_fits(tmp_path, values, dtype, message):
    data = tmp_path / "data"
    data.mkdir()
    source_dtype = {"float16": np.uint32, "float32": np.float64, "uint8": np.int32, "int32": np.float64}[dtype]
    image = np.zeros((8, 8), source_dtype)
    image[0, :2] = values
    np.save(data / "x.npy", image)
    r = preprocess(data, tmp_path / "o", "--dtype", dtype)
    assert r.returncode == 1 and "x.npy" in r.stderr and message in r.stderr, r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_uint16_to_float16_overflow_names_float32(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "scene.npy", np.full((16, 16), 65535, np.uint16))
    r = preprocess(data, tmp_path / "o", "--dtype", "float16")
    assert r.returncode == 1 and "scene.npy" in r.stderr and "use --dtype float32" in r.stderr
    assert "RuntimeWarning" not in r.stderr


@pytest.mark.parametrize(("options", "message"), [
    (("--level", "99", "--codec", "zstd"), "--level 99 is out of range for --codec zstd: use 1 to 22"),
    (("--level", "5"), "--level 5 has no effect with --codec raw"),
    (("--shard-size", "512"), "'512' has no unit; write e.g. 512MB"),
    (("--edge", "pad"), "--edge needs --tile-size"),
    (("--seed", "3", "--order", "source"), "--seed needs --val-fraction or --order shuffled"),
    (("--label-column", "y"), "--label-column needs --labels"),
    (("--val-fraction", "1.5"), "--val-fraction must be between 0 and 1"),
])
def test_options_are_checked_before_any_image_is_read(tmp_path, options, message):
    # The data directory does not exist: the option error must come first.
    r = preprocess(tmp_path / "no-such-dir", tmp_path / "o", *options)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "no such directory" not in r.stderr


def test_shard_size_with_units(tmp_path, mixed_sizes):
    r = preprocess(mixed_sizes, tmp_path / "o", "--tile-size", "64", "--shard-size", "100KiB")
    assert r.returncode == 0, r.stderr
    shards = json.loads((tmp_path / "o" / "manifest.json").read_text())["shards"]
    assert all(s["count"] * 3 * 64 * 64 <= 100 * 1024 for s in shards) and len(shards) > 3


def test_every_unreadable_image_is_listed_in_one_pass(tmp_path, mixed_sizes):
    data = tmp_path / "data"
    data.mkdir()
    png = (mixed_sizes / "astronaut.png").read_bytes()
    jpg = (mixed_sizes / "coffee.jpg").read_bytes()
    (data / "a_good.png").write_bytes(png)
    (data / "b_truncated.png").write_bytes(png[: len(png) // 2])
    (data / "c_truncated.jpg").write_bytes(jpg[: len(jpg) // 2])
    tifffile.imwrite(data / "d.tif", np.zeros((512, 512, 3), np.uint8))
    tif = (data / "d.tif").read_bytes()
    (data / "d.tif").write_bytes(tif[: len(tif) // 2])
    (data / "e_garbage.png").write_text("not a picture")
    r = preprocess(data, tmp_path / "o", "--workers", "2")
    assert r.returncode == 1
    assert "4 unreadable image(s)" in r.stderr and "--skip-bad" in r.stderr
    for name in ("b_truncated.png", "c_truncated.jpg", "d.tif", "e_garbage.png"):
        assert name in r.stderr
    assert "a_good.png" not in r.stderr
    assert not list((tmp_path / "o").glob("*shard*"))  # nothing was written before the probe finished
    ok = preprocess(data, tmp_path / "s", "--skip-bad")
    assert ok.returncode == 0
    skipped = json.loads((tmp_path / "s" / "manifest.json").read_text())["skipped"]
    assert sorted(s["path"] for s in skipped) == ["b_truncated.png", "c_truncated.jpg", "d.tif", "e_garbage.png"]


def corrupt_png_data(png: bytes) -> bytes:
    """Scramble the compressed pixels but keep every chunk CRC valid: only decoding finds it."""
    import struct
    import zlib

    at = png.index(b"IDAT") - 4
    length = struct.unpack(">I", png[at:at + 4])[0]
    body = bytes((b * 7 + 13) % 256 for b in png[at + 8:at + 8 + length])
    chunk = png[at:at + 4] + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return png[:at] + chunk + png[at + 12 + length:]


def test_images_failing_only_in_decoding_are_all_listed(tmp_path, mixed_sizes):
    data = tmp_path / "data"
    data.mkdir()
    png = (mixed_sizes / "astronaut.png").read_bytes()
    for name in ("a.png", "c.png", "e.png"):
        (data / name).write_bytes(png)
    for name in ("b.png", "d.png"):
        (data / name).write_bytes(corrupt_png_data(png))
    r = preprocess(data, tmp_path / "o", "--tile-size", "256", "--samples-per-shard", "4", "--order", "source")
    assert r.returncode == 1
    assert "2 image(s) failed to decode" in r.stderr and "b.png" in r.stderr and "d.png" in r.stderr
    assert "--skip-bad" in r.stderr and "--resume" in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    assert len(json.loads((tmp_path / "o" / ".progress.json").read_text())["shards"]) == 1  # a.png's 4 tiles


def test_a_split_without_any_image_is_an_error(tmp_path, mixed_sizes):
    r = preprocess(mixed_sizes, tmp_path / "o", "--tile-size", "64", "--val-fraction", "0.1")  # 0.3 images: none
    assert r.returncode == 1
    assert "split 'val' would hold 0 samples: no source image falls into it" in r.stderr
    assert "change --val-fraction" in r.stderr and not (tmp_path / "o").exists()
