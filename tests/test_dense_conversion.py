"""preprocess_tiles with --targets and --inputs: scenes, masks and co-registered inputs cut on one grid.

Every tile is checked against the source rasters it was cut from (numpy slicing of the files), so a
tile paired with the wrong mask, shifted by a pixel, or padded with a label would fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

import fastload
from fastload.conversion.preprocess import main

SIZES = [(150, 170), (96, 96), (200, 130)]
NAMES = ["s0", "s1", "sub/s2"]
IGNORE = 255


def make_scenes(root: Path, mask_suffix: str = ".png", palette: bool = False, seed: int = 0) -> Path:
    """Write three GeoTIFF scenes, their masks (classes 0..3, an ignored corner) and float32 DEMs (.npy)."""
    rng = np.random.default_rng(seed)
    for i, (name, (h, w)) in enumerate(zip(NAMES, SIZES)):
        for folder in ("scenes", "labels", "dem"):
            (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        tifffile.imwrite(root / "scenes" / f"{name}.tif", image,
                         extratags=[(33550, "d", 3, (10.0, 10.0, 0.0), True),
                                    (33922, "d", 6, (0, 0, 0, 500000.0 + i, 4600000.0, 0), True)])
        mask = rng.integers(0, 4, (h, w)).astype(np.uint8)
        mask[:30, :40] = IGNORE
        if mask_suffix == ".png":
            picture = Image.fromarray(mask)
            if palette:
                picture = picture.convert("P")
                picture.putpalette([c for k in range(256) for c in (k, 255 - k, (7 * k) % 256)])
            picture.save(root / "labels" / f"{name}.png")
        else:
            tifffile.imwrite(root / "labels" / f"{name}{mask_suffix}", mask)
        np.save(root / "dem" / f"{name}.npy", rng.random((h, w)).astype(np.float32))
    return root


def convert(root: Path, *extra: str, out: str = "out") -> int:
    """Run preprocess_tiles on the scenes of ``root`` (masks and DEMs paired) into ``root / out``."""
    return main(["--data-dir", str(root / "scenes"), "--targets", f"masks={root / 'labels'}",
                 "--inputs", f"dem={root / 'dem'}", "--output-dir", str(root / out), *extra])


def read_mask(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path)) if path.suffix == ".png" else tifffile.imread(path)


def check_every_tile(root: Path, dataset_dir: Path, tile: int, fill: int | None = IGNORE) -> int:
    """Compare every sample of the dataset with the rasters it was cut from; return the sample count."""
    manifest = json.loads((dataset_dir / "manifest.json").read_text())
    scenes = manifest["scenes"]
    ds = fastload.ShardDataset(dataset_dir)
    seen = set()
    for i in range(len(ds)):
        s = ds[i]
        scene = scenes[int(s["scene"])]
        y, x, h, w = s["window"].tolist()
        assert (y, x) not in seen or True
        seen.add((int(s["scene"]), y, x))
        image = tifffile.imread(root / "scenes" / scene["path"])
        mask = read_mask(root / "labels" / scene["files"]["masks"])
        dem = np.load(root / "dem" / scene["files"]["dem"])
        assert (scene["height"], scene["width"]) == image.shape[:2]
        assert h == min(tile, scene["height"] - y) and w == min(tile, scene["width"] - x)
        np.testing.assert_array_equal(s["image"].numpy()[:, :h, :w].transpose(1, 2, 0), image[y:y + h, x:x + w])
        np.testing.assert_array_equal(s["masks"].numpy()[:h, :w], mask[y:y + h, x:x + w])
        np.testing.assert_array_equal(s["dem"].numpy()[0, :h, :w], dem[y:y + h, x:x + w])
        if fill is not None:
            assert (s["masks"].numpy()[h:, :] == fill).all() and (s["masks"].numpy()[:, w:] == fill).all()
        assert (s["image"].numpy()[:, h:, :] == 0).all() and (s["dem"].numpy()[:, :, w:] == 0).all()
        if "masks_class_pixels" in s:
            part = mask[y:y + h, x:x + w]
            np.testing.assert_array_equal(s["masks_class_pixels"].numpy(),
                                          np.bincount(part[part != IGNORE], minlength=4))
    assert len(seen) == len(ds)  # no tile twice
    return len(ds)


def test_scenes_masks_and_inputs_are_cut_on_one_grid(tmp_path):
    root = make_scenes(tmp_path)
    assert convert(root, "--tile-size", "64", "--stride", "48", "--edge", "pad", "--ignore-index", "255",
                   "--num-classes", "4", "--codec", "zstd") == 0
    out = root / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    schema = {f["name"]: f for f in manifest["schema"]}
    assert list(schema) == ["image", "dem", "masks", "scene", "window", "masks_class_pixels"]
    assert schema["masks"]["shape"] == [64, 64] and schema["masks"]["dtype"] == "uint8"
    assert schema["masks"]["codec"] == "zstd"  # a target is lossless by default
    assert schema["dem"]["shape"] == [1, 64, 64] and schema["dem"]["dtype"] == "float32"
    assert schema["masks_class_pixels"]["shape"] == [4] and schema["masks_class_pixels"]["dtype"] == "int32"
    n = check_every_tile(root, out, 64)
    grid = {(150, 170): 3 * 4, (96, 96): 2 * 2, (200, 130): 4 * 3}  # origins 0, 48, ... until a tile reaches the edge
    assert n == sum(grid.values())
    scenes = manifest["scenes"]
    assert [s["path"] for s in scenes] == ["s0.tif", "s1.tif", "sub/s2.tif"]
    assert [s["tiles"] for s in scenes] == [12, 4, 12]
    assert scenes[2]["files"] == {"dem": "sub/s2.npy", "masks": "sub/s2.png"}
    assert scenes[1]["georef"]["transform"] == [10.0, 0.0, 500001.0, 0.0, -10.0, 4600000.0]


def test_min_labelled_drops_tiles_mostly_ignored_and_a_val_split_keeps_scenes_whole(tmp_path):
    root = make_scenes(tmp_path)
    assert convert(root, "--tile-size", "64", "--stride", "48", "--edge", "pad", "--ignore-index", "255",
                   "--min-labelled", "0.6", "--val-fraction", "0.34") == 0
    total = 0
    for split in ("train", "val"):
        out = root / "out" / split
        total += check_every_tile(root, out, 64)
        ds = fastload.ShardDataset(out)
        for i in range(len(ds)):
            assert (ds[i]["masks"].numpy() != IGNORE).mean() >= 0.6
        manifest = json.loads((out / "manifest.json").read_text())
        assert sum(s["tiles"] for s in manifest["scenes"]) == len(ds)
    assert 0 < total < 32  # tiles over the ignored corner and the padded edges are gone


def test_palette_masks_are_read_as_class_indices_not_colours(tmp_path):
    root = make_scenes(tmp_path, palette=True)
    assert convert(root, "--tile-size", "48", "--num-classes", "4", "--ignore-index", "255") == 0
    assert check_every_tile(root, root / "out", 48, fill=None) > 0


def test_tiff_masks_of_another_dtype_and_source_order(tmp_path):
    root = make_scenes(tmp_path, mask_suffix=".tif")
    assert convert(root, "--tile-size", "50", "--order", "source") == 0
    assert check_every_tile(root, root / "out", 50, fill=None) == 3 * 3 + 1 + 4 * 2


def test_a_pair_of_other_size_is_refused_naming_both_files_and_sizes(tmp_path, capsys):
    root = make_scenes(tmp_path)
    np.save(root / "dem" / "s1.npy", np.zeros((95, 96), np.float32))
    assert convert(root, "--tile-size", "48") == 1
    err = capsys.readouterr().err
    assert "s1.npy is 95x96" in err and "s1.tif 96x96" in err
    assert not (root / "out" / "manifest.json").exists()
    assert convert(root, "--tile-size", "48", "--skip-bad", out="skipped") == 0
    manifest = json.loads((root / "skipped" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["scenes"]] == ["s0.tif", "sub/s2.tif"]
    assert [s["path"] for s in manifest["skipped"]] == ["s1.tif"]


def test_missing_partners_are_listed_together_or_skipped(tmp_path, capsys):
    root = make_scenes(tmp_path)
    (root / "labels" / "s0.png").unlink()
    (root / "dem" / "sub" / "s2.npy").unlink()
    assert convert(root, "--tile-size", "48") == 1
    err = capsys.readouterr().err
    assert "2 image(s) without their partner file(s)" in err
    assert "s0.tif: no partner file masks" in err and "sub/s2.tif: no partner file dem" in err
    assert convert(root, "--tile-size", "48", "--skip-bad") == 0
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["scenes"]] == ["s1.tif"]
    assert sorted(s["path"] for s in manifest["skipped"]) == ["s0.tif", "sub/s2.tif"]


def test_two_partner_files_of_one_stem_are_ambiguous(tmp_path, capsys):
    root = make_scenes(tmp_path)
    tifffile.imwrite(root / "labels" / "s1.tif", np.zeros((96, 96), np.uint8))
    assert convert(root, "--tile-size", "48") == 2
    assert "s1.png and s1.tif" in capsys.readouterr().err


def test_a_pairs_csv_pairs_files_of_other_names(tmp_path):
    root = make_scenes(tmp_path)
    for name in NAMES:
        (root / "labels" / f"{name}.png").rename(root / "labels" / f"{name}_mask.png")
    csv = root / "pairs.csv"
    csv.write_text("masks,image,dem\n" + "".join(f"{n}_mask.png,{n}.tif,{n}.npy\n" for n in NAMES))
    assert convert(root, "--tile-size", "64", "--pairs", str(csv)) == 0
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    assert manifest["scenes"][0]["files"]["masks"] == "s0_mask.png"
    ds = fastload.ShardDataset(root / "out")
    s = ds[0]
    scene = manifest["scenes"][int(s["scene"])]
    y, x, h, w = s["window"].tolist()
    mask = read_mask(root / "labels" / scene["files"]["masks"])
    np.testing.assert_array_equal(s["masks"].numpy(), mask[y:y + h, x:x + w])


@pytest.mark.parametrize("args, message", [
    (["--tile-size", "48", "--field-codec", "masks=jpeg"], "jpeg is lossy"),
    (["--tile-size", "48", "--edge", "pad"], "--edge pad pads targets too"),
    (["--tile-size", "48", "--ignore-index", "255", "--min-labelled", "0"], "--min-labelled must be a fraction"),
    (["--tile-size", "48", "--min-labelled", "0.5"], "--min-labelled counts the pixels that are not --ignore-index"),
    (["--tile-size", "48", "--num-classes", "dem=3"], "'dem' is not a --targets field"),
    (["--tile-size", "48", "--num-classes", "0"], "K must be 1 to"),
    (["--tile-size", "48", "--ignore-index", "300"], "not a value of target 'masks'"),
    (["--tile-size", "48", "--field-codec", "other=zstd"], "'other' is not an --inputs or --targets field"),
])
def test_options_that_cannot_hold_are_refused(tmp_path, capsys, args, message):
    root = make_scenes(tmp_path)
    assert convert(root, *args) == 2
    assert message in capsys.readouterr().err
    assert not (root / "out").exists() or not any((root / "out").iterdir())


def test_a_class_beyond_num_classes_is_an_error_naming_the_file_and_tile(tmp_path, capsys):
    root = make_scenes(tmp_path)
    mask = np.asarray(Image.open(root / "labels" / "s1.png")).copy()
    mask[70, 10] = 9
    Image.fromarray(mask).save(root / "labels" / "s1.png")
    assert convert(root, "--tile-size", "48", "--num-classes", "4", "--ignore-index", "255") == 1
    err = capsys.readouterr().err
    assert "s1.png" in err and "value 9" in err and "(y=48, x=0)" in err


def test_field_names_preprocess_writes_itself_are_refused(tmp_path, capsys):
    root = make_scenes(tmp_path)
    assert main(["--data-dir", str(root / "scenes"), "--targets", f"window={root / 'labels'}",
                 "--output-dir", str(root / "out"), "--tile-size", "48"]) == 2
    assert "'window' is a field name preprocess_tiles writes itself" in capsys.readouterr().err


def test_a_partner_folder_inside_the_data_dir_is_not_read_as_scenes(tmp_path):
    root = make_scenes(tmp_path)
    (root / "labels").rename(root / "scenes" / "masks")
    assert main(["--data-dir", str(root / "scenes"), "--targets", f"masks={root / 'scenes' / 'masks'}",
                 "--output-dir", str(root / "out"), "--tile-size", "64"]) == 0
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    assert len(manifest["scenes"]) == 3


def test_ome_tiff_scenes_record_their_pixel_size(tmp_path):
    (tmp_path / "slides").mkdir()
    (tmp_path / "cells").mkdir()
    image = np.arange(2 * 80 * 90, dtype=np.uint16).reshape(2, 80, 90)
    tifffile.imwrite(tmp_path / "slides" / "a.ome.tif", image, ome=True,
                     metadata={"axes": "CYX", "PhysicalSizeX": 0.65, "PhysicalSizeY": 0.5})
    tifffile.imwrite(tmp_path / "cells" / "a.ome.tif", (image[0] % 3).astype(np.int32))
    assert main(["--data-dir", str(tmp_path / "slides"), "--targets", f"cells={tmp_path / 'cells'}",
                 "--output-dir", str(tmp_path / "out"), "--tile-size", "40", "--num-classes", "3"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["scenes"][0]["georef"]["pixel_size"] == {"x": 0.65, "y": 0.5, "unit": "µm"}
    s = fastload.ShardDataset(tmp_path / "out")[0]
    y, x, h, w = s["window"].tolist()
    np.testing.assert_array_equal(s["image"].numpy(), image[:, y:y + h, x:x + w])
    assert s["cells"].dtype == fastload.ShardDataset(tmp_path / "out")[0]["cells"].dtype
    np.testing.assert_array_equal(s["cells_class_pixels"].numpy(),
                                  np.bincount((image[0] % 3)[y:y + h, x:x + w].ravel(), minlength=3))


def test_tiles_without_targets_still_carry_their_scene_and_window(tmp_path):
    root = make_scenes(tmp_path)
    assert main(["--data-dir", str(root / "scenes"), "--output-dir", str(root / "out"), "--tile-size", "64",
                 "--stride", "32"]) == 0
    ds = fastload.ShardDataset(root / "out")
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    assert [f["name"] for f in manifest["schema"]] == ["image", "scene", "window"]
    s = ds[len(ds) - 1]
    y, x, h, w = s["window"].tolist()
    image = tifffile.imread(root / "scenes" / manifest["scenes"][int(s["scene"])]["path"])
    np.testing.assert_array_equal(s["image"].numpy().transpose(1, 2, 0), image[y:y + h, x:x + w])


def test_a_multi_band_target_is_resampled_nearest_by_default(tmp_path):
    import fastload.transforms as T

    root = make_scenes(tmp_path)
    (root / "onehot").mkdir()
    for name in NAMES:
        mask = read_mask(root / "labels" / f"{name}.png")
        (root / "onehot" / name).parent.mkdir(parents=True, exist_ok=True)
        tifffile.imwrite(root / "onehot" / f"{name}.tif", np.stack([mask == 1, mask == 2]).astype(np.uint8) * 200,
                         photometric="minisblack", planarconfig="separate")
    assert main(["--data-dir", str(root / "scenes"), "--targets", f"onehot={root / 'onehot'}",
                 "--output-dir", str(root / "out"), "--tile-size", "64"]) == 0
    ds = fastload.ShardDataset(root / "out")
    assert ds.target_fields == ("onehot",)
    assert [f.shape for f in ds.fields if f.name == "onehot"] == [(2, 64, 64)]
    loader = fastload.ShardLoader(root / "out", batch_size=8, transforms=[T.RandomResizedCrop(40)], seed=3)
    values = set()
    for batch in loader:
        values |= set(np.unique(batch["onehot"].numpy()).tolist())
        assert not (set(np.unique(batch["image"].numpy()).tolist()) <= {0, 200})  # the image is interpolated
    assert values <= {0, 200}
    with pytest.raises(fastload.FastloadError, match="target field"):
        fastload.ShardLoader(root / "out", batch_size=8, transforms=[T.Resize(32, interpolation="bilinear")])


def test_verify_checks_the_scenes_and_every_window(tmp_path):
    from fastload.format._verify import find_problems

    root = make_scenes(tmp_path)
    assert convert(root, "--tile-size", "64") == 0
    out = root / "out"
    assert list(find_problems(out)) == []
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["scenes"][0]["height"] = 100  # the tiles at y=64 of s0 now run past it
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = list(find_problems(out))
    assert problems and all("is not inside scene 0 (100x170)" in p for p in problems)
    manifest["scenes"][0]["height"] = -1
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert any("scenes[0].height: -1 is out of range" in p for p in find_problems(out))


def test_one_bit_png_masks_are_classes_0_and_1_not_255(tmp_path):
    (tmp_path / "scenes").mkdir()
    (tmp_path / "labels").mkdir()
    tifffile.imwrite(tmp_path / "scenes" / "a.tif", np.zeros((16, 16, 3), np.uint8))
    mask = np.zeros((16, 16), bool)
    mask[:, 8:] = True
    Image.fromarray(mask).convert("1").save(tmp_path / "labels" / "a.png")
    with Image.open(tmp_path / "labels" / "a.png") as saved:
        assert saved.mode == "1"
    assert main(["--data-dir", str(tmp_path / "scenes"), "--targets", f"masks={tmp_path / 'labels'}",
                 "--output-dir", str(tmp_path / "out"), "--tile-size", "8", "--edge", "pad", "--ignore-index", "255",
                 "--num-classes", "2"]) == 0
    ds = fastload.ShardDataset(tmp_path / "out", fields=["masks", "window", "masks_class_pixels"])
    for i in range(len(ds)):
        s = ds[i]
        x = int(s["window"][1])
        assert (s["masks"].numpy() == (1 if x >= 8 else 0)).all()
        assert s["masks_class_pixels"].tolist() == ([0, 64] if x >= 8 else [64, 0])


def test_a_geotiff_with_utf8_gdal_metadata_converts_and_its_nodata_is_not_copied(tmp_path):
    (tmp_path / "scenes").mkdir()
    tags = [(33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 5e5, 4.6e6, 0), True),
            (42112, "B", 0, '<GDALMetadata><Item name="UNIT">Température °C</Item></GDALMetadata>'.encode(), True),
            (42113, "s", 0, "0", True)]
    tifffile.imwrite(tmp_path / "scenes" / "a.tif", np.ones((32, 32), np.uint8), extratags=tags)
    assert main(["--data-dir", str(tmp_path / "scenes"), "--output-dir", str(tmp_path / "out"),
                 "--tile-size", "16"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    georef = manifest["scenes"][0]["georef"]
    assert georef["transform"] == [10.0, 0.0, 5e5, 0.0, -10.0, 4.6e6]
    assert {t[0] for t in georef["tiff_tags"]} == {33550, 33922}  # GDAL's metadata and nodata are the source's


def test_a_mask_georeferenced_elsewhere_than_its_image_is_refused(tmp_path, capsys):
    root = make_scenes(tmp_path, mask_suffix=".tif")
    mask = tifffile.imread(root / "labels" / "s1.tif")
    tifffile.imwrite(root / "labels" / "s1.tif", mask, extratags=[
        (33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 500001.0 + 20, 4600000.0, 0), True)])
    assert convert(root, "--tile-size", "48") == 1
    err = capsys.readouterr().err
    assert "s1.tif is georeferenced elsewhere than its image s1.tif" in err and "500021.0" in err
    tifffile.imwrite(root / "labels" / "s1.tif", mask, extratags=[
        (33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 500001.0, 4600000.0, 0), True)])
    assert convert(root, "--tile-size", "48") == 0  # the same grid: paired


def test_a_jpeg_mask_is_refused(tmp_path, capsys):
    root = make_scenes(tmp_path)
    mask = read_mask(root / "labels" / "s1.png")
    (root / "labels" / "s1.png").unlink()
    Image.fromarray(mask).save(root / "labels" / "s1.jpg")
    assert convert(root, "--tile-size", "48") == 1
    assert "s1.jpg is a JPEG: its lossy compression has changed label values" in capsys.readouterr().err
