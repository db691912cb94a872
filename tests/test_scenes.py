"""The manifest's scenes: validators, GeoTIFF/OME georeferencing read with tifffile, write_arrays(scenes=...)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from ctrl_c_steps import files_of, interrupt_each_step

import fastload
from fastload.errors import ArgumentError, DatasetError, ImageReadError
from fastload.format._georef import GeorefProblem, check_georef, georef_extratags, read_georef, read_scene_info
from fastload.format._manifest import load_manifest
from fastload.format._scenes import Scene, check_scenes, scene_doc, scenes_of

UTM33N = [1, 1, 0, 3, 1024, 0, 1, 1, 1025, 0, 1, 1, 3072, 0, 1, 32633]


def _geotiff(path: Path, tags: list, shape: tuple[int, ...] = (1, 20, 30)) -> Path:
    tifffile.imwrite(path, np.zeros(shape, np.uint8), photometric="minisblack", extratags=tags)
    return path


def _north_up(path: Path, geokeys: list[int] = UTM33N, ascii_params: str = "WGS 84 / UTM zone 33N|") -> Path:
    return _geotiff(path, [(33550, "d", 3, (10.0, 10.0, 0.0), True),
                           (33922, "d", 6, (0, 0, 0, 500000.0, 4600000.0, 0), True),
                           (34735, "H", len(geokeys), geokeys, True), (34737, "s", 0, ascii_params, True)])


def test_read_georef_of_a_north_up_geotiff(tmp_path):
    with tifffile.TiffFile(_north_up(tmp_path / "g.tif")) as tif:
        georef = read_georef(tif)
    assert georef is not None
    assert georef["transform"] == [10.0, 0.0, 500000.0, 0.0, -10.0, 4600000.0]
    assert georef["crs"] == {"epsg": 32633}
    assert georef["tiff_tags"] == [[33550, "d", 3, [10.0, 10.0, 0.0]],
                                   [33922, "d", 6, [0.0, 0.0, 0.0, 500000.0, 4600000.0, 0.0]],
                                   [34735, "H", 16, UTM33N], [34737, "s", 23, "WGS 84 / UTM zone 33N|"]]
    assert check_georef(georef) is georef


def test_a_tiepoint_off_the_origin_and_pixel_is_point(tmp_path):
    keys = [1, 1, 0, 2, 1025, 0, 1, 2, 3072, 0, 1, 32633]  # RasterPixelIsPoint
    path = _geotiff(tmp_path / "p.tif", [(33550, "d", 3, (2.0, 4.0, 0.0), True),
                                         (33922, "d", 6, (5, 7, 0, 1000.0, 2000.0, 0), True),
                                         (34735, "H", len(keys), keys, True)])
    georef = read_scene_info(path)["georef"]
    # c = X - i*sx - sx/2, f = Y + j*sy + sy/2: the tiepoint names pixel (5, 7)'s centre
    assert georef["transform"] == [2.0, 0.0, 1000.0 - 10.0 - 1.0, 0.0, -4.0, 2000.0 + 28.0 + 2.0]


def test_model_transformation_and_a_user_defined_crs(tmp_path):
    matrix = (0.5, 0.1, 0, 300.0, 0.2, -0.5, 0, 700.0, 0, 0, 0, 0, 0, 0, 0, 1)
    keys = [1, 1, 0, 2, 1024, 0, 1, 1, 3072, 0, 1, 32767, ]
    keys = [1, 1, 0, 3, 1024, 0, 1, 1, 3072, 0, 1, 32767, 3073, 34737, 12, 0]
    path = _geotiff(tmp_path / "m.tif", [(34264, "d", 16, matrix, True), (34735, "H", len(keys), keys, True),
                                         (34737, "s", 0, "My local CRS|", True)])
    georef = read_scene_info(path)["georef"]
    assert georef["transform"] == [0.5, 0.1, 300.0, 0.2, -0.5, 700.0]
    assert georef["crs"] == {"citation": "My local CRS"}


def test_ome_pixel_size_and_a_plain_tiff(tmp_path):
    tifffile.imwrite(tmp_path / "c.ome.tif", np.zeros((2, 30, 40), np.uint16), ome=True,
                     metadata={"axes": "CYX", "PhysicalSizeX": 0.65, "PhysicalSizeY": 0.5})
    info = read_scene_info(tmp_path / "c.ome.tif")
    assert info == {"height": 30, "width": 40, "georef": {"pixel_size": {"x": 0.65, "y": 0.5, "unit": "µm"}}}
    tifffile.imwrite(tmp_path / "plain.tif", np.zeros((30, 40), np.uint8))
    assert read_scene_info(tmp_path / "plain.tif") == {"height": 30, "width": 40, "georef": None}


def test_a_malformed_geokey_directory_names_the_file(tmp_path):
    path = _north_up(tmp_path / "bad.tif", geokeys=[1, 1, 0, 3, 1024, 0, 1, 1])  # says 3 keys, holds 1
    with pytest.raises(ImageReadError, match=r"bad.tif: georeferencing: GeoKeyDirectory: 8 values"):
        read_scene_info(path)
    nan = _geotiff(tmp_path / "nan.tif", [(33550, "d", 3, (float("nan"), 1.0, 0.0), True)])
    with pytest.raises(ImageReadError, match=r"nan.tif: georeferencing: .*tiff_tags\[0\].value\[0\]: nan is not "
                                             r"finite"):
        read_scene_info(nan)


def test_extratags_round_trip(tmp_path):
    georef = read_scene_info(_north_up(tmp_path / "g.tif"))["georef"]
    _geotiff(tmp_path / "copy.tif", georef_extratags(georef), (2, 5, 5))
    assert read_scene_info(tmp_path / "copy.tif")["georef"] == georef
    assert georef_extratags(None) == []


@pytest.mark.parametrize("georef,message", [
    ({"transform": [1, 0, 0, 0, 1]}, r"transform: expected 6 numbers"),
    ({"transform": [1, 0, float("nan"), 0, 1, 0]}, r"transform\[2\]: nan is not finite"),
    ({"transform": [1, 0, True, 0, 1, 0]}, r"transform\[2\]: 'True' is not a number"),
    ({"transform": [0, 0, 0, 0, 0, 0]}, r"cannot be inverted"),
    ({"crs": {"epsg": 0}}, r"crs.epsg: '0' is not an EPSG code"),
    ({"crs": {"epsg": 1, "wkt": "x"}}, r"crs: expected one of"),
    ({"crs": {"wkt": "x" * 70000}}, r"crs.wkt: 70000 characters"),
    ({"tiff_tags": [[33550, "H", 1, [1]]]}, r"ModelPixelScale \(33550\) has dtype 'd', not 'H'"),
    ({"tiff_tags": [[34737, "s", 5, "abc"]]}, r"count 5 for 3 characters"),
    ({"tiff_tags": [[34737, "s", 4, "a\0c"]]}, r"contains a NUL"),
    ({"tiff_tags": [[34735, "H", 4, [1, 1, 0, 70000]]]}, r"value\[3\]: '70000' is not an unsigned 16-bit"),
    ({"tiff_tags": [[34735, "H", 4, [1, 1, 0, 2]]]}, r"GeoKeyDirectory: 4 values do not hold a header and 2 keys"),
    ({"tiff_tags": [[33550, "d", 1, [1.0]], [33550, "d", 1, [1.0]]]}, r"tiff_tags\[1\]: tag 33550 appears twice"),
    ({"tiff_tags": [[33550, "d", True, [1.0]]]}, r"count 'True' is not a positive integer"),
    ({"pixel_size": {"x": -1, "y": 1, "unit": "µm"}}, r"pixel_size.x: -1 is not positive"),
    ({"pixel_size": {"x": 1, "y": 1}}, r"pixel_size: expected an object with keys x, y and unit"),
    ({"elevation": 3}, r"unknown key 'elevation'"),
])
def test_check_georef_refuses(georef, message):
    with pytest.raises(GeorefProblem, match=message):
        check_georef(georef)


def _entry(**changes):
    return {"path": "a.tif", "height": 10, "width": 20, "tiles": 2, **changes}


@pytest.mark.parametrize("doc,message", [
    ({"not": "a list"}, r"m.json: scenes: expected a list, not dict"),
    ([_entry(), 5], r"m.json: scenes\[1\]: expected an object, not int"),
    ([_entry(width=0)], r"scenes\[0\].width: 0 is out of range \[1, 2147483647\]"),
    ([_entry(width=1.5)], r"scenes\[0\].width: '1.5' is not an integer"),
    ([_entry(tiles=-1)], r"scenes\[0\].tiles: -1 is out of range"),
    ([_entry(tiles=False)], r"scenes\[0\].tiles: 'False' is not an integer"),
    ([_entry(path="a\0b")], r"scenes\[0\].path: a path is 1 to 4096 characters without NUL"),
    ([_entry(path=7)], r"scenes\[0\].path: expected a non-empty string"),
    ([_entry(files={"mask": ""})], r"scenes\[0\].files\['mask'\]: expected a non-empty string"),
    ([_entry(files=["a"])], r"scenes\[0\].files: expected an object"),
    ([_entry(colour="red")], r"scenes\[0\]: unknown key 'colour'"),
    ([{"path": "a.tif", "height": 1, "width": 1}], r"scenes\[0\]: missing key 'tiles'"),
    ([_entry(georef={"crs": {"epsg": "4326"}})], r"scenes\[0\].georef.crs.epsg: '4326' is not an EPSG code"),
])
def test_check_scenes_refuses(doc, message):
    with pytest.raises(DatasetError, match=message):
        check_scenes(doc, "m.json")


def test_check_scenes_accepts_and_builds_scenes():
    georef = {"transform": [1, 0, 0, 0, -1, 10], "crs": {"epsg": 4326}}
    doc = [scene_doc("sub/a.tif", 10, 20, 2, {"mask": "sub/a.png"}, georef), scene_doc("b", 1, 1, 0)]
    assert doc[1] == {"path": "b", "height": 1, "width": 1, "tiles": 0}
    scenes = check_scenes(doc, "m.json")
    assert scenes == [Scene("sub/a.tif", 10, 20, 2, {"mask": "sub/a.png"}, georef), Scene("b", 1, 1, 0, {}, None)]
    assert [s.to_json() for s in scenes] == doc
    with pytest.raises(ArgumentError, match="where: scenes"):
        check_scenes(None, "where", ArgumentError)


def _arrays(n_tiles: list[int], windows: list[tuple[int, int, int, int]] | None = None) -> dict[str, np.ndarray]:
    index = np.repeat(np.arange(len(n_tiles)), n_tiles)
    arrays = {"image": np.zeros((len(index), 1, 4, 4), np.uint8), "scene": index.astype(np.int64)}
    if windows is not None:
        arrays["window"] = np.array(windows, np.int64)
    return arrays


def test_write_arrays_records_scenes(tmp_path):
    source = _north_up(tmp_path / "geo.tif")
    windows = [(0, 0, 4, 4), (16, 26, 4, 4), (0, 0, 3, 3)]
    manifest = fastload.write_arrays(tmp_path / "ds", _arrays([2, 1], windows),
                                     scenes=[source, {"path": "b.tif", "height": 3, "width": 3,
                                                      "files": {"mask": "b.png"}}])
    scenes = scenes_of(load_manifest(tmp_path / "ds"), tmp_path / "ds")
    assert scenes is not None and [s.to_json() for s in scenes] == manifest.extra["scenes"]
    assert (scenes[0].path, scenes[0].height, scenes[0].width, scenes[0].tiles) == ("geo.tif", 20, 30, 2)
    assert scenes[0].georef is not None and scenes[0].georef["crs"] == {"epsg": 32633}
    assert scenes[1] == Scene("b.tif", 3, 3, 1, {"mask": "b.png"}, None)
    assert scenes_of(load_manifest(tmp_path / "ds"), tmp_path / "ds") == scenes
    fastload.write_arrays(tmp_path / "plain", _arrays([1]))
    assert scenes_of(load_manifest(tmp_path / "plain"), tmp_path / "plain") is None


def test_write_arrays_without_a_scene_field_needs_tiles(tmp_path):
    arrays = {"image": np.zeros((2, 1, 4, 4), np.uint8)}
    manifest = fastload.write_arrays(tmp_path / "ds", arrays, scenes=[_entry(tiles=7)])
    assert manifest.extra["scenes"][0]["tiles"] == 7
    with pytest.raises(ArgumentError, match=r"write_arrays: scenes\[0\]: no 'tiles'"):
        fastload.write_arrays(tmp_path / "ds2", arrays, scenes=[{"path": "a.tif", "height": 4, "width": 4}])


@pytest.mark.parametrize("arrays,scenes,message", [
    (_arrays([2, 1]), [_entry(), _entry(tiles=2)], r"scenes\[1\].tiles: '2', but 1 samples have scene 1"),
    (_arrays([2, 1]), [_entry()], r"sample 2: scene 1 is out of range for 1 scenes"),
    (_arrays([1], [(8, 0, 4, 4)]), [_entry(tiles=1)],
     r"sample 0: window \(y, x, height, width\) = \(8, 0, 4, 4\) is not inside scene 0 \(a.tif, 10 x 20\)"),
    (_arrays([1], [(0, 0, 0, 4)]), [_entry(tiles=1)], r"sample 0: window .* \(0, 0, 0, 4\) is not inside"),
    (_arrays([1], [(-1, 0, 2, 2)]), [_entry(tiles=1)], r"sample 0: window .* \(-1, 0, 2, 2\) is not inside"),
    ({**_arrays([1]), "scene": np.array([0.0])}, [_entry()], r"'scene' field must hold integers"),
    (_arrays([1]), "a.tif", r"expected a list of scene dicts or TIFF paths"),
    (_arrays([1]), [_entry(height=0, tiles=1)], r"write_arrays: scenes\[0\].height: 0 is out of range"),
])
def test_write_arrays_refuses_scenes_that_do_not_fit(tmp_path, arrays, scenes, message):
    with pytest.raises(ArgumentError, match=message):
        fastload.write_arrays(tmp_path / "ds", arrays, scenes=scenes)
    assert not (tmp_path / "ds").exists()


def _samples(windows: list[tuple[int, int, int, int]], index: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"image": np.full((1, 4, 4), k, np.uint8), "scene": np.int64(s), "window": np.array(w, np.int64)}
            for k, (s, w) in enumerate(zip(index, windows))]


@pytest.mark.parametrize("iterable", [False, True])
def test_write_dataset_counts_and_records_scenes(tmp_path, iterable):
    samples = _samples([(0, 0, 4, 4), (0, 4, 4, 4), (0, 0, 3, 3)], [0, 0, 1])
    source = iter(samples) if iterable else samples
    manifest = fastload.write_dataset(source, tmp_path / "ds", samples_per_shard=2, progress=False,
                                      scenes=[{"path": "a.tif", "height": 4, "width": 8},
                                              _north_up(tmp_path / "geo.tif")])
    scenes = scenes_of(load_manifest(tmp_path / "ds"), tmp_path / "ds")
    assert scenes is not None and [s.to_json() for s in scenes] == manifest.extra["scenes"]
    assert [(s.path, s.height, s.width, s.tiles) for s in scenes] == [("a.tif", 4, 8, 2), ("geo.tif", 20, 30, 1)]
    assert scenes[1].georef is not None and scenes[1].georef["transform"][0] == 10.0


def test_write_dataset_writes_no_manifest_for_a_window_outside(tmp_path):
    samples = _samples([(0, 0, 4, 4), (2, 6, 4, 4)], [0, 0])
    for resume in (False, True):  # resumed: the same error, still no manifest
        with pytest.raises(ArgumentError, match=r"write_dataset: sample \d: window .* \(2, 6, 4, 4\) is not inside "
                                                r"scene 0 \(a.tif, 4 x 8\).*no manifest was written"):
            fastload.write_dataset(samples, tmp_path / "ds", progress=False, resume=resume,
                                   scenes=[{"path": "a.tif", "height": 4, "width": 8}])
        assert not (tmp_path / "ds" / "manifest.json").exists()
        with pytest.raises(DatasetError, match="incomplete dataset"):
            load_manifest(tmp_path / "ds")


def test_write_dataset_with_scenes_interrupted_at_any_step_is_finished_by_resume(tmp_path):
    # A Ctrl-C between the first manifest and the one with the scenes counted left a dataset that looked
    # complete without its scenes, which resume kept: the scenes are now in the one manifest written
    samples = _samples([(0, 0, 4, 4), (0, 4, 4, 4), (0, 0, 3, 3), (0, 2, 2, 2)], [0, 0, 1, 1])
    scenes = [{"path": "a.tif", "height": 4, "width": 8}, {"path": "b.tif", "height": 4, "width": 4}]

    def write(out: Path, resume: bool = False) -> None:
        fastload.write_dataset(samples, out, samples_per_shard=2, progress=False, scenes=scenes, resume=resume)

    write(tmp_path / "reference")
    steps = interrupt_each_step(write, lambda out: write(out, resume=True), tmp_path, files_of(tmp_path / "reference"))
    assert steps > 20
    for out in sorted(tmp_path.glob("out*")):
        assert load_manifest(out).extra["scenes"] == load_manifest(tmp_path / "reference").extra["scenes"], out


def test_write_dataset_without_a_scene_field(tmp_path):
    samples = [{"image": np.zeros((1, 4, 4), np.uint8)}] * 3
    manifest = fastload.write_dataset(samples, tmp_path / "ds", progress=False,
                                      scenes=[{"path": "a.tif", "height": 4, "width": 8, "tiles": 3}])
    assert manifest.extra["scenes"] == [{"path": "a.tif", "height": 4, "width": 8, "tiles": 3}]
    assert load_manifest(tmp_path / "ds").extra["scenes"] == manifest.extra["scenes"]
    with pytest.raises(ArgumentError, match=r"write_dataset: scenes\[0\]: no 'tiles'"):
        fastload.write_dataset(samples, tmp_path / "ds2", progress=False,
                               scenes=[{"path": "a.tif", "height": 4, "width": 8}])
    with pytest.raises(ArgumentError, match=r"write_dataset: scenes\[0\].width: -8"):
        fastload.write_dataset(samples, tmp_path / "ds3", progress=False,
                               scenes=[{"path": "a.tif", "height": 4, "width": -8}])
    assert not (tmp_path / "ds3").exists()  # refused before anything is written
