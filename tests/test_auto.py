"""``codec="auto"``: the rule, and its choice on noise, smooth rasters and photographs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import skimage.data
from conftest import run_cli
from PIL import Image

import fastload
from fastload.conversion._auto import BALANCED_FRACTION, SPEED_FRACTION, Trial, pick


def trials(*rows: tuple[str, float, float]) -> list[Trial]:
    return [Trial(codec, ratio, 100.0, speed) for codec, ratio, speed in rows]


def test_pick_applies_the_stated_rule():
    measured = trials(("raw", 1.0, 1000.0), ("zstd", 1.5, 100.0), ("lz4", 1.2, 600.0), ("png", 2.0, 20.0))
    assert pick(measured, "size").codec == "png"
    assert pick(measured, "balanced").codec == "zstd"  # png decodes at 2 % of raw, under BALANCED_FRACTION
    assert pick(measured, "speed").codec == "lz4"
    assert pick(trials(("raw", 1.0, 1000.0), ("lz4", 0.99, 900.0)), "size").codec == "raw"
    # a codec within 1 % of raw's size loses to raw even when measured faster (noise stays raw under any load)
    for prefer in ("size", "balanced", "speed"):
        assert pick(trials(("raw", 1.0, 900.0), ("lz4", 1.005, 1000.0)), prefer).codec == "raw"
    # sizes within 1 % are a tie, which the faster codec wins
    assert pick(trials(("raw", 1.0, 1000.0), ("zstd", 1.50, 100.0), ("lz4", 1.495, 600.0)), "size").codec == "lz4"
    with pytest.raises(ValueError, match="prefer"):
        pick(measured, "fast")


def photo_tiles() -> np.ndarray:
    photos = [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea()]
    return np.stack([p[y:y + 64, x:x + 64] for p in photos for y in range(0, 256, 64) for x in range(0, 256, 64)]
                    ).transpose(0, 3, 1, 2).copy()


def smooth_raster() -> np.ndarray:
    rng = np.random.default_rng(0)
    grid = np.indices((32, 32)).sum(axis=0)
    bands = grid[None, None] * np.arange(1, 7)[None, :, None, None] + rng.integers(0, 50, (48, 1, 1, 1))
    return (1000 + bands + rng.normal(0, 2, (48, 6, 32, 32))).astype(np.uint16)


def noise() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (48, 3, 32, 32), dtype=np.uint8)


def choice_of(tmp_path, data: np.ndarray, **kwargs) -> dict:
    m = fastload.write_arrays(tmp_path / "ds", {"x": data}, codec="auto", overwrite=True, **kwargs)
    choice = m.provenance["codec_choice"]["x"]
    assert m.fields[0].codec == choice["chosen"]
    got = fastload.ShardDataset(tmp_path / "ds")
    if choice["chosen"] != "jpeg":
        assert all(np.array_equal(got[i]["x"].numpy(), data[i]) for i in (0, len(data) - 1))
    return choice


@pytest.mark.parametrize("prefer", ["speed", "balanced", "size"])
def test_noise_stays_raw(tmp_path, prefer):
    assert choice_of(tmp_path, noise(), prefer=prefer)["chosen"] == "raw"


def test_smooth_uint16_rasters_get_a_shuffle_codec(tmp_path):
    choice = choice_of(tmp_path, smooth_raster(), prefer="size")
    assert choice["chosen"].endswith("-shuffle")
    assert {t["codec"] for t in choice["trials"]} == {"raw", "zstd", "zstd-shuffle", "lz4", "lz4-shuffle"}


def test_photographs_get_png_for_size_and_jpeg_only_when_lossy_is_allowed(tmp_path):
    choice = choice_of(tmp_path, photo_tiles(), prefer="size")
    assert choice["chosen"] == "png" and choice["codec_options"] == {"layout": "chw", "level": 6}
    assert "jpeg" not in {t["codec"] for t in choice["trials"]}
    assert "lz4-shuffle" not in {t["codec"] for t in choice["trials"]}  # the identity shuffle of uint8 is not tried
    lossy = choice_of(tmp_path, photo_tiles(), prefer="size", lossy_ok=True)
    assert lossy["chosen"] == "jpeg"


@pytest.mark.parametrize("data", [photo_tiles, smooth_raster, noise])
@pytest.mark.parametrize("prefer", ["speed", "balanced"])
def test_the_recorded_choice_follows_the_rule_from_the_recorded_measurements(tmp_path, data, prefer):
    choice = choice_of(tmp_path, data(), prefer=prefer)
    measured = [Trial(t["codec"], t["ratio"], t["encode_mb_s"], t["decode_mb_s"]) for t in choice["trials"]]
    assert pick(measured, prefer).codec == choice["chosen"]
    raw = next(t for t in measured if t.codec == "raw")
    fraction = BALANCED_FRACTION if prefer == "balanced" else SPEED_FRACTION
    eligible = [t for t in measured if t.decode_mb_s >= fraction * raw.decode_mb_s or t.codec == "raw"]
    chosen = next(t for t in measured if t.codec == choice["chosen"])
    assert chosen.ratio >= max(t.ratio for t in eligible) / 1.1  # never over 10 % larger than the best allowed
    assert choice["rule"].startswith("smallest output among codecs decoding at least")


def test_preprocess_tiles_codec_auto_records_its_choice(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(skimage.data.astronaut()).save(src / "a.png")
    out = tmp_path / "out"
    r = run_cli("preprocess_tiles", "--data-dir", str(src), "--output-dir", str(out), "--tile-size", "64",
                "--codec", "auto", "--prefer", "size", "--no-progress", "--order", "source", check=True)
    assert "codec auto (size) for 'image': png (tried raw 1.00x" in r.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"][0]["codec"] == "png"
    choice = manifest["provenance"]["codec_choice"]["image"]
    assert choice["chosen"] == "png" and choice["samples"] == 64 and choice["decoder"] == "native"
    assert manifest["provenance"]["options"]["prefer"] == "size"
    tile = np.asarray(Image.open(src / "a.png"))[:64, 64:128].transpose(2, 0, 1)
    assert np.array_equal(fastload.ShardDataset(out)[1]["image"].numpy(), tile)
