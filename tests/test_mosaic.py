"""fastload.Mosaic: tiles cut here, written with write_arrays(scenes=...), read back by ShardLoader, stitched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch

import fastload
from fastload.errors import ArgumentError, DatasetError, FastloadError, FastloadWarning, ImageReadError

T, S, C = 64, 48, 3  # tile, stride (< tile: overlap), channels
SIZES = [(150, 170), (96, 96), (200, 130), (40, 50)]  # 29 tiles: odd, so two ranks' padding repeats one


def _starts(n: int) -> list[int]:
    out = [0]
    while out[-1] + T < n:
        out.append(out[-1] + S)
    return out  # the last tile may pass the edge: padded


def _tile(scenes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    images, index, windows = [], [], []
    for i, scene in enumerate(scenes):
        height, width = scene.shape[1:]
        for y in _starts(height):
            for x in _starts(width):
                h, w = min(T, height - y), min(T, width - x)
                tile = np.zeros((scene.shape[0], T, T), scene.dtype)
                tile[:, :h, :w] = scene[:, y:y + h, x:x + w]
                images.append(tile)
                index.append(i)
                windows.append((y, x, h, w))
    return np.stack(images), np.array(index, np.int64), np.array(windows, np.int64)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    rng = np.random.default_rng(43)
    scenes = [rng.integers(0, 256, (C, h, w), dtype=np.uint8) for h, w in SIZES]
    images, index, windows = _tile(scenes)
    path = tmp_path_factory.mktemp("mosaic") / "tiles"
    fastload.write_arrays(path, {"image": images, "scene": index, "window": windows},
                          scenes=[{"path": f"s{i}.tif", "height": h, "width": w} for i, (h, w) in enumerate(SIZES)])
    return path, scenes


def _run(path: Path, out: Path, blend: str, model, *, batch_size: int = 7, shuffle: bool = False,
         num_threads: int = 1, fmt: str = "npy", rank: int | None = None, world_size: int | None = None,
         **kwargs) -> fastload.Mosaic:
    loader = fastload.ShardLoader(path, batch_size=batch_size, shuffle=shuffle, num_threads=num_threads,
                                  rank=rank, world_size=world_size)
    mosaic = fastload.Mosaic(path, out, channels=C, blend=blend, format=fmt, rank=rank, world_size=world_size,
                             **kwargs)
    with mosaic:
        for batch in loader:
            mosaic.add(batch, model(batch))
    return mosaic


def identity_u8(batch):
    return batch["image"]


def identity_f32(batch):
    return batch["image"].float()


def disagreeing(batch):
    """Tiles that disagree where they overlap: each adds its own offset (from its window's origin)."""
    offset = (batch["window"][:, 0] * 3 + batch["window"][:, 1] * 7) % 50
    return batch["image"].float() + offset.float()[:, None, None, None] / 8


def disagreeing_u8(batch):
    return (batch["image"].int() + (batch["window"][:, 0] // 16 + batch["window"][:, 1] // 16)[:, None, None, None]
            ).remainder(256).to(torch.uint8)


def _reference(path: Path, blend: str, model) -> list[np.ndarray]:
    """The blend written out plainly, tile by tile, from every tile of the dataset (one batch)."""
    dataset = fastload.ShardDataset(path)
    batch = dataset.read_batch(list(range(len(dataset))))
    preds = model(batch).numpy().astype(np.float64)
    out = []
    for i, (height, width) in enumerate(SIZES):
        num, den = np.zeros((C, height, width)), np.zeros((height, width))
        key = np.full((height, width, 3), np.iinfo(np.int64).max)
        g = np.exp(-0.5 * ((np.arange(T) - (T - 1) / 2) / (0.125 * T)) ** 2)
        weights = np.maximum(np.outer(g, g) / np.outer(g, g).max(), 1e-3) if blend == "gaussian" else np.ones((T, T))
        for k in np.flatnonzero(batch["scene"].numpy() == i):
            y, x, h, w = (int(v) for v in batch["window"][k])
            if blend == "clip":
                rows, cols = np.mgrid[0:h, 0:w]
                d2 = (2 * rows + 1 - T) ** 2 + (2 * cols + 1 - T) ** 2
                cand = np.stack([d2, np.full_like(d2, y), np.full_like(d2, x)], -1)
                cur = key[y:y + h, x:x + w]
                better = ((cand[..., 0] < cur[..., 0]) | ((cand[..., 0] == cur[..., 0]) & (
                    (cand[..., 1] < cur[..., 1]) | ((cand[..., 1] == cur[..., 1]) & (cand[..., 2] < cur[..., 2])))))
                cur[better] = cand[better]
                num[:, y:y + h, x:x + w][:, better] = preds[k][:, :h, :w][:, better]
            else:
                num[:, y:y + h, x:x + w] += preds[k][:, :h, :w] * weights[:h, :w]
                den[y:y + h, x:x + w] += weights[:h, :w]
        out.append(num if blend == "clip" else num / den)
    return out


def _outputs(out: Path, fmt: str = "npy") -> list[np.ndarray]:
    if fmt == "npy":
        return [np.load(out / f"s{i}.npy") for i in range(len(SIZES))]
    return [tifffile.imread(out / f"s{i}.tif") for i in range(len(SIZES))]


@pytest.mark.parametrize("batch_size", [1, 7, 64])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_clip_rebuilds_every_scene_bit_for_bit(data, tmp_path, batch_size, shuffle, num_threads):
    path, scenes = data
    mosaic = _run(path, tmp_path, "clip", identity_u8, batch_size=batch_size, shuffle=shuffle,
                  num_threads=num_threads)
    assert sorted(p.name for p in mosaic.written) == sorted(f"s{i}.npy" for i in range(len(SIZES)))
    for got, scene in zip(_outputs(tmp_path), scenes):
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, scene)
    assert not (tmp_path / ".mosaic-parts").exists()


@pytest.mark.parametrize("blend", ["average", "gaussian"])
@pytest.mark.parametrize("batch_size,shuffle", [(1, False), (64, True)])
def test_blends_rebuild_every_scene(data, tmp_path, blend, batch_size, shuffle):
    path, scenes = data
    _run(path, tmp_path, blend, identity_f32, batch_size=batch_size, shuffle=shuffle, num_threads=2)
    for got, scene in zip(_outputs(tmp_path), scenes):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, scene, rtol=1e-6)


@pytest.mark.parametrize("blend", ["clip", "average", "gaussian"])
def test_overlaps_follow_the_blend_rule(data, tmp_path, blend):
    path, _ = data
    model = disagreeing_u8 if blend == "clip" else disagreeing
    _run(path, tmp_path, blend, model, batch_size=5, shuffle=True)
    for got, want in zip(_outputs(tmp_path), _reference(path, blend, model)):
        if blend == "clip":
            np.testing.assert_array_equal(got, want.astype(np.uint8))
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6)
    if blend != "clip":  # the blends do mix disagreeing tiles (the test would pass on clip's output otherwise)
        clipped = _reference(path, "clip", model)[0]
        assert np.abs(_outputs(tmp_path)[0] - clipped).max() > 0.1


def test_clip_does_not_depend_on_order_batch_or_threads(data, tmp_path):
    path, _ = data
    runs = []
    for k, (batch_size, shuffle, threads) in enumerate([(1, False, 1), (7, True, 2), (64, True, 1)]):
        _run(path, tmp_path / str(k), "clip", disagreeing_u8, batch_size=batch_size, shuffle=shuffle,
             num_threads=threads, fmt="tif")
        runs.append([(tmp_path / str(k) / f"s{i}.tif").read_bytes() for i in range(len(SIZES))])
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("blend", ["clip", "average", "gaussian"])
def test_two_ranks_then_merge_equal_one_process(data, tmp_path, blend):
    path, _ = data
    model = disagreeing_u8 if blend == "clip" else disagreeing
    _run(path, tmp_path / "one", blend, model, fmt="tif")
    out = tmp_path / "two"
    by_ranks = []
    for rank in (0, 1):  # as two jobs without torch.distributed; ShardLoader pads rank 1 with a repeat
        mosaic = _run(path, out, blend, model, fmt="tif", rank=rank, world_size=2, shuffle=True)
        assert (out / ".mosaic-parts" / f"rank-{rank}" / "closed.json").exists()
        by_ranks += [p.name for p in mosaic.written]  # scenes a rank saw whole (the one-tile scene)
    assert by_ranks == ["s3.tif"] and [p.name for p in out.glob("*.tif")] == ["s3.tif"]
    written = fastload.Mosaic.merge(path, out)
    assert sorted(p.name for p in written) == ["s0.tif", "s1.tif", "s2.tif"]
    assert not (out / ".mosaic-parts").exists()
    for i in range(len(SIZES)):
        one, two = tmp_path / "one" / f"s{i}.tif", out / f"s{i}.tif"
        if blend == "clip":
            assert one.read_bytes() == two.read_bytes()
        else:
            np.testing.assert_allclose(tifffile.imread(two), tifffile.imread(one), rtol=1e-6)


def test_a_rank_that_saw_a_whole_scene_writes_it(data, tmp_path):
    path, scenes = data
    dataset = fastload.ShardDataset(path)
    batch = dataset.read_batch(list(range(len(dataset))))
    with fastload.Mosaic(path, tmp_path, channels=C, format="npy", rank=0, world_size=2) as mosaic:
        mosaic.add(batch, batch["image"])
    assert len(mosaic.written) == len(SIZES)
    with fastload.Mosaic(path, tmp_path, channels=C, format="npy", rank=1, world_size=2) as other:
        other.add({k: v[:3] for k, v in batch.items()}, batch["image"][:3])  # repeats of rank 0's tiles
    assert fastload.Mosaic.merge(path, tmp_path) == []
    for got, scene in zip(_outputs(tmp_path), scenes):
        np.testing.assert_array_equal(got, scene)


def test_merge_before_every_rank_closed_is_refused(data, tmp_path):
    path, _ = data
    _run(path, tmp_path, "clip", identity_u8, rank=0, world_size=2)
    with pytest.raises(FastloadError, match="rank 1 has not closed"):
        fastload.Mosaic.merge(path, tmp_path)


def test_scenes_past_the_memory_bound_are_spilled_and_read_back(data, tmp_path):
    path, scenes = data
    with pytest.warns(FastloadWarning, match="max_scenes_in_memory=1"):
        _run(path, tmp_path, "gaussian", identity_f32, shuffle=True, max_scenes_in_memory=1)
    for got, scene in zip(_outputs(tmp_path), scenes):
        np.testing.assert_allclose(got, scene, rtol=1e-6)
    assert not (tmp_path / ".mosaic-parts").exists()


def test_a_scene_is_written_as_soon_as_its_tiles_are_in(data, tmp_path):
    path, _ = data
    dataset = fastload.ShardDataset(path)
    batch = dataset.read_batch(list(range(len(dataset))))
    last = int(np.flatnonzero(batch["scene"].numpy() == 1)[-1])
    mosaic = fastload.Mosaic(path, tmp_path, channels=C, format="npy")
    mosaic.add({k: v[:last + 1] for k, v in batch.items()}, batch["image"][:last + 1])
    assert [p.name for p in mosaic.flush()] == ["s0.npy", "s1.npy"]  # handed to the writer thread by add
    assert sorted(p.name for p in tmp_path.glob("*.npy")) == ["s0.npy", "s1.npy"]
    assert "2 written, 0 in memory" in repr(mosaic)
    mosaic.add({k: v[last + 1:] for k, v in batch.items()}, batch["image"][last + 1:])
    mosaic.add(batch, batch["image"])  # repeats of written scenes: ignored
    mosaic.close()
    mosaic.close()  # twice: a no-op
    with pytest.raises(FastloadError, match="closed"):
        mosaic.add(batch, batch["image"])


def test_geotiff_tags_and_pixel_size_are_copied(tmp_path):
    geokeys = [1, 1, 0, 3, 1024, 0, 1, 1, 1025, 0, 1, 1, 3072, 0, 1, 32633]
    source = tmp_path / "geo.tif"
    tifffile.imwrite(source, np.zeros((1, 100, 80), np.uint8), photometric="minisblack", extratags=[
        (33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 500000.0, 4600000.0, 0), True),
        (34735, "H", len(geokeys), geokeys, True), (34737, "s", 0, "WGS 84 / UTM zone 33N|", True)])
    ome = tmp_path / "cells.ome.tif"
    tifffile.imwrite(ome, np.zeros((2, 70, 60), np.uint16), ome=True,
                     metadata={"axes": "CYX", "PhysicalSizeX": 0.65, "PhysicalSizeY": 0.65})
    scenes = [np.arange(C * 100 * 80, dtype=np.float32).reshape(C, 100, 80), np.ones((C, 70, 60), np.float32)]
    images, index, windows = _tile(scenes)
    fastload.write_arrays(tmp_path / "ds", {"image": images, "scene": index, "window": windows},
                          scenes=[source, ome])
    _run(tmp_path / "ds", tmp_path / "out", "average", identity_f32, fmt="tif")
    with tifffile.TiffFile(source) as a, tifffile.TiffFile(tmp_path / "out" / "geo.tif") as b:
        for code in (33550, 33922, 34735, 34737):
            assert a.pages.first.tags[code].value == b.pages.first.tags[code].value
        assert b.geotiff_metadata["ProjectedCSTypeGeoKey"] == 32633
        np.testing.assert_array_equal(b.asarray(), scenes[0])
    with tifffile.TiffFile(tmp_path / "out" / "cells.ome.tif") as c:
        assert c.is_ome and 'PhysicalSizeX="0.65"' in c.ome_metadata
        assert c.asarray().shape == (C, 70, 60)


# ---- refusals ----

def _batch(path: Path, indices: list[int]) -> dict[str, torch.Tensor]:
    return fastload.ShardDataset(path).read_batch(indices)


def test_wrong_channels_batch_or_tile_size_is_refused(data, tmp_path):
    path, _ = data
    batch = _batch(path, [0, 1])
    with fastload.Mosaic(path, tmp_path, channels=C) as mosaic:
        with pytest.raises(ArgumentError, match=r"expected \(B, 3"):
            mosaic.add(batch, torch.zeros(2, C + 1, T, T, dtype=torch.uint8))
        with pytest.raises(ArgumentError, match="3 predictions for a batch of 2 scene indices and 2 windows"):
            mosaic.add(batch, torch.zeros(3, C, T, T, dtype=torch.uint8))
        with pytest.raises(ArgumentError, match=r"s0.tif window \(0, 0, 64, 64\): predictions of 63 x 64"):
            mosaic.add(batch, torch.zeros(2, C, T - 1, T, dtype=torch.uint8))
        with pytest.raises(ArgumentError, match="'scene' and 'window'"):
            mosaic.add({"image": batch["image"]}, batch["image"])
        mosaic.abort()


def test_windows_and_scene_indices_outside_are_refused(data, tmp_path):
    path, _ = data
    batch = _batch(path, [0, 1])
    with fastload.Mosaic(path, tmp_path, channels=C) as mosaic:
        bad = dict(batch, window=batch["window"].clone())
        bad["window"][1] = torch.tensor([140, 0, 64, 64])
        with pytest.raises(ArgumentError, match=r"sample 1: window .* = \(140, 0, 64, 64\) is not inside scene 0 "
                                                r"\(s0.tif, 150 x 170\)"):
            mosaic.add(bad, batch["image"])
        bad = dict(batch, scene=torch.tensor([0, 9]))
        with pytest.raises(ArgumentError, match="sample 1: scene 9 is out of range for 4 scenes"):
            mosaic.add(bad, batch["image"])
        mosaic.abort()


def test_dtypes_the_blend_cannot_keep_are_refused(data, tmp_path):
    path, _ = data
    batch = _batch(path, [0])
    with fastload.Mosaic(path, tmp_path, channels=C, blend="average") as mosaic:
        with pytest.raises(ArgumentError, match="only clip keeps integers"):
            mosaic.add(batch, batch["image"])
        mosaic.abort()
    with pytest.raises(ArgumentError, match="the blends write floats"):
        fastload.Mosaic(path, tmp_path, channels=C, blend="gaussian", dtype="uint8")
    with fastload.Mosaic(path, tmp_path, channels=C, dtype=np.uint8) as mosaic:
        with pytest.raises(ArgumentError, match="do not cast safely"):
            mosaic.add(batch, batch["image"].float())
        mosaic.abort()
    for bad in [dict(blend="max"), dict(format="png"), dict(channels=0), dict(channels=True),
                dict(max_scenes_in_memory=0)]:
        with pytest.raises(ArgumentError):
            fastload.Mosaic(path, tmp_path, **{"channels": C, **bad})


def test_incomplete_scenes_are_listed_at_close(data, tmp_path):
    path, _ = data
    mosaic = fastload.Mosaic(path, tmp_path, channels=C, format="npy")
    batch = _batch(path, [0, 1, 2])
    mosaic.add(batch, batch["image"])
    with pytest.raises(FastloadError, match=r"4 scene\(s\) incomplete(.|\n)*s0.tif \(scene 0\): 9 of 12 tiles "
                                            r"missing(.|\n)*s3.tif \(scene 3\): 1 of 1 tiles"):
        mosaic.close()
    assert list(tmp_path.iterdir()) == []


def test_an_exception_leaves_nothing_incomplete(data, tmp_path):
    path, _ = data
    batch = _batch(path, [*range(11), 12, 16, 11])  # scene 0 but one tile, scenes 1 and 2, scene 0's last
    with pytest.raises(RuntimeError, match="model failed"):
        with fastload.Mosaic(path, tmp_path, channels=C, format="npy", max_scenes_in_memory=1) as mosaic:
            with pytest.warns(FastloadWarning):
                mosaic.add(batch, batch["image"])  # scene 0 spilled, read back, written; scenes 1 and 2 spilled
            assert sorted(p.name for p in (tmp_path / ".mosaic-parts" / "rank-0").iterdir()) == [
                "scene-00000001.npz", "scene-00000002.npz"]
            raise RuntimeError("model failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.npy"]


def _scene_dataset(tmp_path: Path, scenes: list) -> Path:
    path = tmp_path / "ds"
    fastload.write_arrays(path, {"image": np.zeros((1, 1, 8, 8), np.uint8), "scene": np.array([0]),
                                 "window": np.array([[0, 0, 8, 8]])},
                          scenes=[{"path": "a.tif", "height": 8, "width": 8}], overwrite=True)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["scenes"] = scenes
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize("entry,message", [
    ({"height": -8}, r"scenes\[0\].height: -8 is out of range"),
    ({"height": True}, r"scenes\[0\].height: 'True' is not an integer"),
    ({"height": 2**31, "width": 2**31 - 1}, r"scenes\[0\].height: 2147483648 is out of range"),
    ({"height": 2**21, "width": 2**21}, r"scenes\[0\]: 2097152 x 2097152 pixels"),
    ({"tiles": 2}, r"scenes: the tile counts add up to 2, the dataset holds 1"),
    ({"path": ""}, r"scenes\[0\].path: expected a non-empty string"),
    ({"georef": {"transform": [1, 2, 0, 2, 4, 0]}}, r"scenes\[0\].georef.transform: .* cannot be inverted"),
    ({"georef": {"tiff_tags": [[270, "s", 2, "a"]]}}, r"tiff_tags\[0\]: tag code '270' is not one of the GeoTIFF"),
    ({"georef": {"tiff_tags": [[33550, "d", 2, [1.0]]]}}, r"tiff_tags\[0\]: count 2 for 1 values"),
    ({"georef": {"crs": {"epsg": False}}}, r"crs.epsg: 'False' is not an EPSG code"),
])
def test_crafted_manifest_scenes_are_refused(tmp_path, entry, message):
    path = _scene_dataset(tmp_path, [{"path": "a.tif", "height": 8, "width": 8, "tiles": 1, **entry}])
    with pytest.raises(DatasetError, match=message):
        fastload.Mosaic(path, tmp_path / "out", channels=1)


def test_a_nan_in_the_manifest_is_refused(tmp_path):
    path = _scene_dataset(tmp_path, [])
    text = (path / "manifest.json").read_text().replace('"scenes": []', '"scenes": [{"path": "a.tif", "height": 8, '
                                                        '"width": 8, "tiles": 1, "georef": {"transform": [NaN, 0, 0, '
                                                        '0, 1, 0]}}]')
    (path / "manifest.json").write_text(text)
    with pytest.raises(DatasetError, match="NaN"):
        fastload.Mosaic(path, tmp_path / "out", channels=1)


@pytest.mark.parametrize("second", ["a/x.png", "A/X.tif"])
def test_two_scenes_of_one_name_are_refused(tmp_path, second):
    """One output name (the suffix dropped; letter case, which Windows and macOS ignore) for two scenes."""
    path = tmp_path / "ds"
    fastload.write_arrays(path, {"image": np.zeros((2, 1, 8, 8), np.uint8), "scene": np.array([0, 1]),
                                 "window": np.array([[0, 0, 8, 8]] * 2)},
                          scenes=[{"path": "a/x.tif", "height": 8, "width": 8}, {"path": second, "height": 8,
                                                                                 "width": 8}])
    with pytest.raises(ArgumentError, match=rf"scenes 0 \(a/x.tif\) and 1 \({second}\) would both be written as"):
        fastload.Mosaic(path, tmp_path / "out", channels=1)


@pytest.mark.parametrize("name", ["../x.tif", "/abs/x.tif", "a/../x.tif", "c:x.tif", "a\\..\\x.tif", "a\nb.tif",
                                  "x" * 201 + ".tif"])
def test_scene_paths_that_could_leave_the_output_folder_are_refused(tmp_path, name):
    path = tmp_path / "ds"
    fastload.write_arrays(path, {"image": np.zeros((1, 1, 8, 8), np.uint8), "scene": np.array([0]),
                                 "window": np.array([[0, 0, 8, 8]])},
                          scenes=[{"path": name, "height": 8, "width": 8}])
    with pytest.raises(DatasetError, match="no usable output name"):
        fastload.Mosaic(path, tmp_path / "out", channels=1)


def test_a_dataset_without_scenes_is_refused(tmp_path):
    fastload.write_arrays(tmp_path / "ds", {"image": np.zeros((1, 1, 8, 8), np.uint8)})
    with pytest.raises(DatasetError, match="records no scenes"):
        fastload.Mosaic(tmp_path / "ds", tmp_path / "out", channels=1)


def test_an_unreadable_tiff_scene_is_refused(tmp_path):
    (tmp_path / "x.tif").write_bytes(b"not a tiff")
    with pytest.raises(ImageReadError, match="x.tif: not a readable TIFF"):
        fastload.write_arrays(tmp_path / "ds", {"image": np.zeros((1, 1, 8, 8), np.uint8), "scene": np.array([0])},
                              scenes=[tmp_path / "x.tif"])


_DDP_WORKER = """
import sys
import torch
import torch.distributed as dist
import fastload

path, out, blend = sys.argv[1:4]
dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the test
try:
    loader = fastload.ShardLoader(path, batch_size=5, shuffle=True, num_threads=1)
    with fastload.Mosaic(path, out, channels=3, blend=blend, format="tif") as mosaic:
        for batch in loader:
            offset = (batch["window"][:, 0] * 3 + batch["window"][:, 1] * 7) % 50
            mosaic.add(batch, batch["image"].float() + offset.float()[:, None, None, None] / 8)
finally:
    dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes importing torch: about 3 to 5 s
def test_torch_distributed_ranks_merge_at_close(data, tmp_path):
    import os
    import socket
    import subprocess
    import sys

    path, _ = data
    _run(path, tmp_path / "one", "gaussian", disagreeing, fmt="tif")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, "-c", _DDP_WORKER, str(path), str(tmp_path / "two"),
                                       "gaussian"], env=env))
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [f"s{i}.tif" for i in range(len(SIZES))]
    for i in range(len(SIZES)):
        np.testing.assert_allclose(tifffile.imread(tmp_path / "two" / f"s{i}.tif"),
                                   tifffile.imread(tmp_path / "one" / f"s{i}.tif"), rtol=1e-6)


def test_pixels_no_tile_covers_are_an_error_or_fill_never_a_silent_zero(tmp_path):
    """A dataset converted with --min-labelled lacks tiles over unlabelled areas: those pixels are no class 0."""
    import numpy as np
    import tifffile

    import fastload

    image = np.arange(3 * 64 * 96, dtype=np.uint8).reshape(3, 64, 96)
    tiles, windows = [], []
    for x in (0, 64):  # the tile at x=32..63 is "dropped": columns 32..63 are covered by no tile
        if x == 64:
            part = np.zeros((3, 32, 32), np.uint8)
            part[:, :, :] = image[:, :32, 64:96]
            windows.append([0, 64, 32, 32])
        else:
            part = image[:, :32, :32]
            windows.append([0, 0, 32, 32])
        tiles.append(part)
    fastload.write_arrays(tmp_path / "ds", {"image": np.stack(tiles), "scene": np.zeros(2, np.int64),
                                            "window": np.array(windows, np.int64)},
                          scenes=[{"path": "a.tif", "height": 64, "width": 96}])
    batch = {"scene": np.zeros(2, np.int64), "window": np.array(windows, np.int64)}
    with pytest.raises(fastload.FastloadError, match="4096 of 6144 pixel.* no tile covers.*--edge pad"):
        with fastload.Mosaic(tmp_path / "ds", tmp_path / "f", channels=3, blend="average") as mosaic:
            mosaic.add(batch, np.stack(tiles).astype(np.float32))
    assert not (tmp_path / "f" / "a.tif").exists()
    with fastload.Mosaic(tmp_path / "ds", tmp_path / "f", channels=3, blend="average", fill=float("nan")) as mosaic:
        mosaic.add(batch, np.stack(tiles).astype(np.float32))
    out = tifffile.imread(tmp_path / "f" / "a.tif")
    assert np.isnan(out[:, :, 32:64]).all() and np.isnan(out[:, 32:, :]).all()
    np.testing.assert_array_equal(out[:, :32, :32], image[:, :32, :32])
    with pytest.raises(fastload.FastloadError, match="no tile covers"):
        with fastload.Mosaic(tmp_path / "ds", tmp_path / "c", channels=3, blend="clip") as mosaic:
            mosaic.add(batch, np.stack(tiles))
    with fastload.Mosaic(tmp_path / "ds", tmp_path / "c", channels=3, blend="clip", fill=255) as mosaic:
        mosaic.add(batch, np.stack(tiles))
    out = tifffile.imread(tmp_path / "c" / "a.tif")
    assert (out[:, :, 32:64] == 255).all() and (out[:, :32, 64:] == image[:, :32, 64:]).all()
    with pytest.raises(fastload.FastloadError, match="fill"):
        fastload.Mosaic(tmp_path / "ds", tmp_path / "x", channels=3, blend="clip", dtype="uint8", fill=float("nan"))
    with pytest.raises(fastload.FastloadError, match="fill"):
        fastload.Mosaic(tmp_path / "ds", tmp_path / "x", channels=3, blend="average", fill=float("inf"))


def test_one_channel_tifs_and_scenes_of_one_name_in_two_folders(tmp_path):
    """A class map (C=1) writes as a plain (1, H, W) TIFF; outputs keep the sources' sub-folders (a/x, b/x)."""
    import numpy as np
    import tifffile

    import fastload

    tiles = np.arange(2 * 1 * 8 * 8, dtype=np.uint8).reshape(2, 1, 8, 8)
    windows = np.array([[0, 0, 8, 8], [0, 0, 8, 8]], np.int64)
    fastload.write_arrays(tmp_path / "ds", {"image": tiles, "scene": np.array([0, 1], np.int64), "window": windows},
                          scenes=[{"path": "a/x.tif", "height": 8, "width": 8}, {"path": "b/x.tif", "height": 8,
                                                                                  "width": 8}])
    with fastload.Mosaic(tmp_path / "ds", tmp_path / "out", channels=1) as mosaic:
        mosaic.add({"scene": np.array([0, 1]), "window": windows}, tiles)
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "out" / "a" / "x.tif").reshape(1, 8, 8), tiles[0])
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "out" / "b" / "x.tif").reshape(1, 8, 8), tiles[1])
