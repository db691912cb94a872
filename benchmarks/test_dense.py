"""Dense tiles (issue 43): converting scene+mask pairs, loading them with joint augmentation, stitching predictions.

Run: ``pytest benchmarks/test_dense.py --benchmark-only`` (``FASTLOAD_BENCH_QUICK=1``: 2 scenes of 480 x 480,
one round, a few seconds in all). Full mode: 8 scenes of 1152 x 1152 (25 tiles of 256 x 256 each, stride
224), 4 bands uint16 with uint8 masks of 6 classes (``dense_data.py``; generated once per session in a
temporary folder). Each benchmark runs its configurations interleaved, one round of each in turn (the
first one rotating), so that a loaded machine slows all of them alike; per configuration it records the
median, min and max over rounds, and per peer the ratio of the two in each round (median and spread).

- ``dense-conversion``: ``preprocess_tiles`` (zstd, ``--edge pad``) of the scenes alone against the same
  scenes with their masks (``--targets masks=labels/ --ignore-index 255 --num-classes 6``), 1 and 2
  workers (2 in full mode only). tiles/s, and MB/s of source pixels read. Goal: pairs at least 0.8 of
  image-only in tiles/s (the pairs read and write 1.125x the bytes: a mask band beside 4 uint16 bands).
- ``dense-loading``: one shuffled epoch of image+mask batches (batch 16), ``RandomCrop(224)`` +
  ``RandomDihedral`` on both, ``Normalize`` to float32: ``ShardLoader`` (2 threads) over the converted
  dataset against a ``DataLoader`` (0 and 2 forked workers) whose Dataset reads each tile's window of the
  GeoTIFF and the mask with ``tifffile.memmap`` (the files are uncompressed and contiguous: the cheapest
  windowed read there is; rasterio, not installed here, would go through GDAL's block cache) and
  augments with albumentations (``RandomCrop`` + ``D4``), then normalises by hand. Goal: 5x the best
  DataLoader. ``fastload-native-2t-raw`` reads the same pairs converted uncompressed: the GeoTIFFs are
  uncompressed too, so it shows what zstd's decoding costs in the headline ratio.
- ``dense-stitching``: fixed random float32 predictions of 6 channels for every tile, fed scene by scene
  in batches of 16: ``fastload.Mosaic`` (``format="npy"``, written to disk as each scene completes)
  against MONAI's ``sliding_window_inference`` (the predictor returns the precomputed batch for the
  windows it is asked; the scenes are ``256 + k * 224`` pixels so its windows are the tiles), against
  pytorch-toolbelt's ``TileMerger`` when installed, and a numpy floor (float32 sums by slicing, the
  arithmetic alone); ``fastload-accumulator`` is Mosaic's own accumulator without its files (a diagnostic
  of where Mosaic's time goes). Same blend each (gaussian: sigma 0.125 of the tile; average); torch with
  one thread (MONAI's best on the loaded 2-core machine, see ``test_dense_stitching``). scenes/s, MPixel/s,
  and peak memory per configuration (an untimed pass each: the rise of the process's peak RSS). Goal:
  3x MONAI with memory bounded by the scenes in flight. The outputs are checked to agree (allclose).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import io
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import torch
from conftest import SEED
from datasets import QUICK
from dense_data import BANDS, CLASSES, IGNORE, STRIDE, TILE, Scenes, make_scenes
from measure import EpochResult, MemorySampler, cpu_seconds, extra_info

import fastload
import fastload.transforms as T
from fastload.conversion.preprocess import main as preprocess_main
from fastload.loading._mosaic_accum import importance_map

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations would check PyPI for updates

SCENES, SIDE = (2, 480) if QUICK else (8, 1152)
BATCH = 4 if QUICK else 16
CROP = 224
ROUNDS = 1 if QUICK else 5
CHANNELS = 6  # the predictions' (logits of the mask's classes)
MEAN, STD = [1700.0] * BANDS, [700.0] * BANDS
TOOLBELT_SKIPPED = "pytorch-toolbelt is not installed (0.8.0 requires torchvision, which fastload does not install)"


# ---- shared: data, rounds, figures ----


@pytest.fixture(scope="session")
def dense_scenes(tmp_path_factory) -> Scenes:
    return make_scenes(tmp_path_factory.mktemp("dense-scenes"), SCENES, SIDE)


def convert(scenes: Scenes, out: Path, workers: int, pairs: bool, codec: str = "zstd") -> None:
    """Run ``preprocess_tiles`` on the scenes (with the masks as a target when ``pairs``), output silenced."""
    argv = ["--data-dir", str(scenes.images), "--output-dir", str(out), "--tile-size", str(TILE),
            "--stride", str(STRIDE), "--edge", "pad", "--codec", codec, "--workers", str(workers),
            "--no-progress", "--overwrite"]
    if pairs:
        argv += ["--targets", f"masks={scenes.labels}", "--ignore-index", str(IGNORE), "--num-classes", str(CLASSES)]
    with contextlib.redirect_stdout(io.StringIO()):
        status = preprocess_main(argv)
    assert status == 0, f"preprocess_tiles {' '.join(argv)} exited with {status}"


@pytest.fixture(scope="session")
def pairs_dataset(dense_scenes, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dense-pairs") / "tiles"
    convert(dense_scenes, out, 1, pairs=True)
    return out


@pytest.fixture(scope="session")
def raw_pairs_dataset(dense_scenes, tmp_path_factory) -> Path:
    """Convert the pairs uncompressed: loading without zstd, as the DataLoader reads uncompressed GeoTIFFs."""
    out = tmp_path_factory.mktemp("dense-pairs-raw") / "tiles"
    convert(dense_scenes, out, 1, pairs=True, codec="raw")
    return out


@dataclass
class Timings:
    """Seconds per round of each configuration, and the whole interleaved run's figures."""

    configs: list[str]
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def interleave(self, rounds: int, run: Callable[[str], float]) -> None:
        """Run ``rounds`` rounds of every configuration, the first one rotating; ``run`` returns seconds."""
        for r in range(rounds):
            k = r % len(self.configs)
            for c in self.configs[k:] + self.configs[:k]:
                self.seconds.setdefault(c, []).append(run(c))

    def median(self, config: str) -> float:
        return statistics.median(self.seconds[config])

    def ratios(self, slow: str, fast: str) -> list[float]:
        """Per round, the time of ``slow`` over the time of ``fast`` (how many times faster ``fast`` ran)."""
        return sorted(s / f for s, f in zip(self.seconds[slow], self.seconds[fast]))

    def record(self, info: dict, per_round: float, unit: str) -> None:
        """Record, per configuration, the median rate (``per_round`` units in a round) and its min and max."""
        for c in self.configs:
            times = self.seconds[c]
            info[f"{c}_{unit}"] = per_round / self.median(c)
            info[f"{c}_{unit}_min"] = per_round / max(times)
            info[f"{c}_{unit}_max"] = per_round / min(times)

    def record_ratio(self, info: dict, name: str, slow: str, fast: str) -> str:
        """Record the median and spread of ``slow / fast`` per round under ``name``; return it as text."""
        ratios = self.ratios(slow, fast)
        info[name], info[f"{name}_min"], info[f"{name}_max"] = statistics.median(ratios), ratios[0], ratios[-1]
        return f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"


def headline(result: EpochResult, samples: int, sample_bytes: int, memory: MemorySampler) -> dict:
    """Return the figures every benchmark records (conftest.COMMON_FIGURES), of the fastload configuration."""
    result.samples = samples
    return extra_info(result, sample_bytes, None, memory)


# ---- 1. conversion: scene+mask pairs against the scenes alone ----


@pytest.mark.parametrize("workers", [1] if QUICK else [1, 2], ids=lambda w: f"{w}w")
def test_dense_conversion(benchmark, dense_scenes, tmp_path, workers):
    configs = ["image-only", "pairs"]
    outputs = {c: tmp_path / c for c in configs}
    timings = Timings(configs)
    fastload_round = EpochResult()

    def run(config: str) -> float:
        cpu0 = cpu_seconds()
        start = time.perf_counter()
        convert(dense_scenes, outputs[config], workers, pairs=config == "pairs")
        seconds = time.perf_counter() - start
        if config == "pairs":
            fastload_round.seconds.append(seconds)
            fastload_round.first_batch.append(seconds)  # nothing is usable before the conversion ends
            fastload_round.cpu.append(cpu_seconds() - cpu0)
        return seconds

    for c in configs:  # warm-up: the scenes into the page cache, imports, the worker pool's first start
        convert(dense_scenes, outputs[c], workers, pairs=c == "pairs")

    benchmark.group = "dense-conversion"
    with MemorySampler() as memory:
        benchmark.pedantic(lambda: timings.interleave(1 if QUICK else 3, run), rounds=1, warmup_rounds=0)

    tiles = dense_scenes.tiles
    source = {"image-only": dense_scenes.image_bytes, "pairs": dense_scenes.image_bytes + dense_scenes.mask_bytes}
    info = benchmark.extra_info
    info.update(headline(fastload_round, tiles, source["pairs"] // tiles, memory))
    timings.record(info, tiles, "tiles_per_s")
    for c in configs:
        info[f"{c}_mb_per_s"] = source[c] / 1e6 / timings.median(c)
    # pairs / image-only in tiles/s per round = image-only seconds / pairs seconds
    tiles_ratio = timings.record_ratio(info, "pairs_vs_image_tiles_per_s", "image-only", "pairs")
    info["pairs_vs_image_mb_per_s"] = info["pairs_mb_per_s"] / info["image-only_mb_per_s"]
    print(f"\nconversion {workers}w: image-only {info['image-only_tiles_per_s']:.0f} tiles/s "
          f"{info['image-only_mb_per_s']:.0f} MB/s; pairs {info['pairs_tiles_per_s']:.0f} tiles/s "
          f"{info['pairs_mb_per_s']:.0f} MB/s; pairs/image-only tiles/s {tiles_ratio}, MB/s "
          f"{info['pairs_vs_image_mb_per_s']:.2f}")
    # Correctness after timing: both datasets hold every tile; the pairs one with its mask field.
    for c in configs:
        dataset = fastload.ShardDataset(outputs[c])
        assert len(dataset) == tiles
        assert ("masks" in {f.name for f in dataset.manifest.fields}) == (c == "pairs")


# ---- 2. loading image+mask batches with joint augmentation ----


class WindowDataset(torch.utils.data.Dataset):
    """The user's pipeline: each tile's window read from the GeoTIFF and the mask, albumentations on both."""

    def __init__(self, scenes: Scenes) -> None:
        import albumentations as A

        self.scenes, self.windows = scenes, scenes.windows()
        self.pipeline = A.Compose([A.RandomCrop(CROP, CROP), A.D4(p=1.0)])
        self.mean, self.std = np.array(MEAN, np.float32), np.array(STD, np.float32)
        self._open: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.windows)

    def _arrays(self, scene: int) -> tuple[np.ndarray, np.ndarray]:
        if scene not in self._open:
            stem = self.scenes.stems()[scene]
            self._open[scene] = (tifffile.memmap(self.scenes.images / f"{stem}.tif", mode="r"),
                                 tifffile.memmap(self.scenes.labels / f"{stem}.tif", mode="r"))
        return self._open[scene]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        scene, y, x = self.windows[i]
        image, mask = self._arrays(scene)
        out = self.pipeline(image=image[y:y + TILE, x:x + TILE], mask=mask[y:y + TILE, x:x + TILE])
        normalised = (out["image"].astype(np.float32) - self.mean) / self.std
        return {"image": torch.from_numpy(np.ascontiguousarray(normalised.transpose(2, 0, 1))),
                "masks": torch.from_numpy(np.ascontiguousarray(out["mask"]))}


def window_loader(scenes: Scenes, workers: int) -> torch.utils.data.DataLoader:
    generator = torch.Generator()
    generator.manual_seed(SEED)
    kwargs: dict[str, Any] = {"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}
    return torch.utils.data.DataLoader(WindowDataset(scenes), batch_size=BATCH, shuffle=True, num_workers=workers,
                                       generator=generator, **kwargs)


def fastload_loader(path: Path, threads: int) -> fastload.ShardLoader:
    transforms = [T.RandomCrop(CROP), T.RandomDihedral(), T.Normalize(MEAN, STD, dtype=torch.float32)]
    return fastload.ShardLoader(path, batch_size=BATCH, shuffle=True, seed=SEED, num_threads=threads,
                                fields=["image", "masks"], transforms=transforms)


@pytest.mark.parametrize("batch", [BATCH], ids=lambda b: f"batch{b}")  # named in brackets, as report.py reads
def test_dense_loading(benchmark, dense_scenes, pairs_dataset, raw_pairs_dataset, batch):
    if platform.system() != "Linux":
        pytest.skip("the DataLoader baseline forks its workers (Linux only)")
    loaders = {"fastload-native-2t": fastload_loader(pairs_dataset, 2),
               "fastload-native-2t-raw": fastload_loader(raw_pairs_dataset, 2),
               "dataloader-tifffile-albumentations-0w": window_loader(dense_scenes, 0),
               "dataloader-tifffile-albumentations-2w-fork": window_loader(dense_scenes, 2)}
    timings = Timings(list(loaders))
    fastload_rounds = EpochResult()
    last: dict[str, dict[str, torch.Tensor]] = {}
    epoch = [0]

    def run(config: str) -> float:
        loader = loaders[config]
        if isinstance(loader, fastload.ShardLoader):
            epoch[0] += 1
            loader.set_epoch(epoch[0])
        cpu0 = cpu_seconds()
        start = time.perf_counter()
        samples, first = 0, None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            samples += len(batch["masks"])
            last[config] = batch
        seconds = time.perf_counter() - start
        assert samples == dense_scenes.tiles, f"{config}: {samples} samples in an epoch of {dense_scenes.tiles}"
        if config == "fastload-native-2t":
            fastload_rounds.seconds.append(seconds)
            fastload_rounds.first_batch.append(first or 0.0)
            fastload_rounds.cpu.append(cpu_seconds() - cpu0)
        return seconds

    for c in loaders:  # warm-up: page cache, threads and workers started
        run(c)
    del fastload_rounds.seconds[:], fastload_rounds.first_batch[:], fastload_rounds.cpu[:]

    benchmark.group = "dense-loading"
    with MemorySampler() as memory:
        benchmark.pedantic(lambda: timings.interleave(ROUNDS, run), rounds=1, warmup_rounds=0)

    tiles = dense_scenes.tiles
    sample_bytes = BANDS * TILE * TILE * 2 + TILE * TILE  # decoded image (uint16) and mask (uint8)
    info = benchmark.extra_info
    info.update(headline(fastload_rounds, tiles, sample_bytes, memory))
    timings.record(info, tiles, "samples_per_s")
    best = min((c for c in loaders if c.startswith("dataloader")), key=timings.median)
    lines = [f"{c}: {info[f'{c}_samples_per_s']:.0f} samples/s [{info[f'{c}_samples_per_s_min']:.0f}-"
             f"{info[f'{c}_samples_per_s_max']:.0f}]" for c in loaders]
    ratio = timings.record_ratio(info, "fastload_vs_best_dataloader", best, "fastload-native-2t")
    raw = timings.record_ratio(info, "fastload_raw_vs_best_dataloader", best, "fastload-native-2t-raw")
    info["best_dataloader"] = best
    print("\nloading: " + "; ".join(lines) + f"; fastload (zstd) / {best}: {ratio}; fastload (raw) / {best}: {raw}")
    # Correctness after timing: augmented image+mask batches of the same shapes and dtypes from both.
    for c, batch in last.items():
        assert batch["image"].dtype == torch.float32 and batch["image"].shape[1:] == (BANDS, CROP, CROP), c
        assert batch["masks"].dtype == torch.uint8 and batch["masks"].shape[1:] == (CROP, CROP), c
        assert int(batch["masks"].max()) < CLASSES, c


# ---- 3. stitching predictions back into scenes ----


@dataclass
class Predicted:
    """Fixed predictions of every tile, per scene: ``(tiles, C, TILE, TILE)`` float32, windows in row order."""

    scenes: Scenes
    dataset: Path
    index: dict[str, int]  # scene stem -> its index in the dataset's manifest
    preds: list[np.ndarray]
    origins: list[tuple[int, int]]  # (y, x) of each tile of a scene, the rows of preds

    @property
    def per_row(self) -> int:
        return (self.scenes.side - TILE) // STRIDE + 1

    def batches(self, scene: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        """Yield a scene's ``(batch, predictions)`` pairs, ``BATCH`` tiles each, as a loader in scene order would."""
        preds = self.preds[scene]
        index = self.index[self.scenes.stems()[scene]]
        for i in range(0, len(preds), BATCH):
            rows = self.origins[i:i + BATCH]
            window = np.array([(y, x, TILE, TILE) for y, x in rows], np.int64)
            yield {"scene": np.full(len(rows), index, np.int64), "window": window}, preds[i:i + BATCH]


@pytest.fixture(scope="session")
def predicted(dense_scenes, pairs_dataset) -> Predicted:
    rng = np.random.default_rng(SEED)
    manifest = fastload.ShardDataset(pairs_dataset).manifest
    index = {Path(s["path"]).stem: i for i, s in enumerate(manifest.extra["scenes"])}
    origins = [(y, x) for _, y, x in dense_scenes.windows()[:dense_scenes.tiles_per_scene]]
    preds = [rng.standard_normal((len(origins), CHANNELS, TILE, TILE), np.float32) for _ in range(SCENES)]
    return Predicted(dense_scenes, pairs_dataset, index, preds, origins)


def run_mosaic(p: Predicted, blend: str, out: Path) -> None:
    with fastload.Mosaic(p.dataset, out, channels=CHANNELS, blend=blend, format="npy") as mosaic:
        for s in range(SCENES):
            for batch, preds in p.batches(s):
                mosaic.add(batch, preds)


def monai_scene(p: Predicted, s: int, blend: str, spent: list[float] | None = None) -> torch.Tensor:
    """One scene through MONAI's sliding window: the predictor hands back the precomputed tiles it is asked.

    MONAI multiplies the predictor's output by the importance map in place, so the predictor returns a
    copy, as a model returns a new tensor; the time of that copy is added to ``spent`` (not MONAI's work).
    """
    from monai.inferers import sliding_window_inference

    preds = torch.from_numpy(p.preds[s])

    def predictor(window_data: torch.Tensor, slices: list) -> torch.Tensor:
        start = time.perf_counter()
        rows = [(sl[2].start // STRIDE) * p.per_row + sl[3].start // STRIDE for sl in slices]
        assert rows == list(range(rows[0], rows[0] + len(rows))), rows  # MONAI visits the tiles in row order
        out = preds[rows[0]:rows[0] + len(rows)].clone()
        if spent is not None:
            spent[0] += time.perf_counter() - start
        return out

    dummy = torch.zeros((1, 1, p.scenes.side, p.scenes.side))  # MONAI slices it; the predictor ignores it
    out = sliding_window_inference(dummy, (TILE, TILE), BATCH, predictor, overlap=(TILE - STRIDE) / TILE,
                                   mode="gaussian" if blend == "gaussian" else "constant", sigma_scale=0.125,
                                   with_coord=True)
    assert isinstance(out, torch.Tensor)
    return out[0]


def toolbelt_scene(p: Predicted, s: int, blend: str) -> torch.Tensor:
    """One scene through pytorch-toolbelt's TileMerger (0.8's API: crop coordinates ``(x, y, w, h)``)."""
    from pytorch_toolbelt.inference.tiles import TileMerger

    weight = importance_map(TILE, TILE, blend).astype(np.float32)
    merger = TileMerger((p.scenes.side, p.scenes.side), CHANNELS, weight, device="cpu", dtype=torch.float32)
    for batch, preds in p.batches(s):
        coords = [(int(x), int(y), TILE, TILE) for y, x, _, _ in batch["window"]]
        merger.integrate_batch(torch.from_numpy(preds), coords)
    return merger.merge()


def numpy_scene(p: Predicted, s: int, weight: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """Stitch one scene at the floor: float32 weighted sums by slicing, one pass per tile, and one division."""
    side = p.scenes.side
    num = np.zeros((CHANNELS, side, side), np.float32)
    den = np.zeros((side, side), np.float32)
    for batch, preds in p.batches(s):
        for (y, x, h, w), pred in zip(batch["window"], preds):
            np.multiply(pred, weight, out=scratch)
            num[:, y:y + h, x:x + w] += scratch
            den[y:y + h, x:x + w] += weight
    num /= den
    return num


def accumulator_scene(p: Predicted, s: int, blend: str) -> np.ndarray:
    """Stitch one scene with Mosaic's accumulator alone (a diagnostic: Mosaic's arithmetic without its files)."""
    from fastload.loading._mosaic_accum import SceneAccumulator

    side = p.scenes.side
    acc = SceneAccumulator(s, side, side, CHANNELS, blend, (TILE, TILE), importance_map(TILE, TILE, blend))
    for batch, preds in p.batches(s):
        for (y, x, h, w), pred in zip(batch["window"], preds):
            acc.add((int(y), int(x), int(h), int(w)), pred)
    return acc.result(None)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Let torch use ``n`` threads (the torch-based peers' best), restoring the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def peak_rise_mb(fn: Callable[[], object]) -> tuple[float, str]:
    """Return how far ``fn`` raises this process's peak memory above what it held before, in MB, and how measured.

    Linux: the peak RSS (VmHWM), reset first through /proc/self/clear_refs, which sees numpy's and
    torch's allocations alike. Elsewhere: tracemalloc's peak, which sees numpy's only.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc: hand free heap memory back, so "before" is tight
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        tracemalloc.start()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak / 2**20, "tracemalloc"
    fn()
    return (_status_kb("VmHWM") - before) / 1024, "rss"


def stitching_configs(p: Predicted, blend: str, out: Path) -> dict[str, Callable[[], float]]:
    """Return the configurations of one blend: each stitches every scene once (fastload writes them; peers drop them).

    Each returns the seconds of its run that are not stitching (MONAI's predictor copying its output).
    """
    weight = importance_map(TILE, TILE, blend).astype(np.float32)
    scratch = np.empty((CHANNELS, TILE, TILE), np.float32)

    def mosaic() -> float:
        run_mosaic(p, blend, out)
        return 0.0

    def monai() -> float:
        spent = [0.0]
        for s in range(SCENES):
            monai_scene(p, s, blend, spent)
        return spent[0]

    def floor() -> float:
        for s in range(SCENES):
            numpy_scene(p, s, weight, scratch)
        return 0.0

    def accumulate() -> float:
        for s in range(SCENES):
            accumulator_scene(p, s, blend)
        return 0.0

    def toolbelt() -> float:
        for s in range(SCENES):
            toolbelt_scene(p, s, blend)
        return 0.0

    configs = {f"fastload-mosaic-{blend}": mosaic, f"fastload-accumulator-{blend}": accumulate,
               f"monai-{blend}": monai, f"numpy-floor-{blend}": floor}
    if importlib.util.find_spec("pytorch_toolbelt") is not None:
        configs[f"toolbelt-{blend}"] = toolbelt
    return configs


@pytest.mark.parametrize("blend", ["gaussian", "average"])
def test_dense_stitching(benchmark, predicted, tmp_path, blend):
    if importlib.util.find_spec("monai") is None:
        pytest.skip("MONAI is not installed (pip install monai: the stitching peer)")
    if not hasattr(fastload, "Mosaic"):
        pytest.skip("fastload.Mosaic is not there yet")
    out = tmp_path / "mosaic"
    configs = stitching_configs(predicted, blend, out)
    mine = f"fastload-mosaic-{blend}"
    timings = Timings(list(configs))
    fastload_rounds = EpochResult()

    def run(config: str) -> float:
        cpu0 = cpu_seconds()
        start = time.perf_counter()
        outside = configs[config]()
        seconds = time.perf_counter() - start - outside
        if config == mine:
            fastload_rounds.seconds.append(seconds)
            fastload_rounds.first_batch.append(seconds / SCENES)  # a scene is out after its last tile
            fastload_rounds.cpu.append(cpu_seconds() - cpu0)
        return seconds

    # One torch thread: on this loaded 2-core machine MONAI's median scene took 16-23 ms with 1 thread and
    # 37-316 ms (spikes to 700) with 2, intra-op threads spinning against the other load; its best is 1.
    with torch_threads(1):
        for c in configs:  # warm-up: imports, MONAI's importance map, first touch of the output files
            configs[c]()
        memory_rise = {c: peak_rise_mb(configs[c]) for c in configs}  # untimed, one pass each
        benchmark.group = "dense-stitching"
        with MemorySampler() as memory:
            benchmark.pedantic(lambda: timings.interleave(ROUNDS, run), rounds=1, warmup_rounds=0)

        side = predicted.scenes.side
        info = benchmark.extra_info
        info.update(headline(fastload_rounds, SCENES, CHANNELS * side * side * 4, memory))
        timings.record(info, SCENES, "scenes_per_s")
        lines = []
        for c in configs:
            info[f"{c}_mpixel_per_s"] = SCENES * side * side / 1e6 / timings.median(c)
            rise, how = memory_rise[c]
            info[f"{c}_peak_rise_mb"] = rise
            lines.append(f"{c}: {info[f'{c}_scenes_per_s']:.2f} scenes/s [{info[f'{c}_scenes_per_s_min']:.2f}-"
                         f"{info[f'{c}_scenes_per_s_max']:.2f}] {info[f'{c}_mpixel_per_s']:.1f} MPixel/s, "
                         f"peak +{rise:.0f} MB ({how})")
        if f"toolbelt-{blend}" not in configs:
            info["toolbelt_skipped"] = TOOLBELT_SKIPPED
            lines.append(f"toolbelt skipped: {TOOLBELT_SKIPPED}")
        info["one_scene_accumulators_mb"] = 4 * (CHANNELS + 1) * side * side / 2**20
        info["all_predictions_mb"] = sum(a.nbytes for a in predicted.preds) / 2**20
        ratios = [f"fastload / {c}: {timings.record_ratio(info, f'fastload_vs_{c}', c, mine)}"
                  for c in configs if c != mine]
        print(f"\nstitching {blend}: " + "; ".join(lines) + "; " + "; ".join(ratios)
              + f"; one scene's float32 sums {info['one_scene_accumulators_mb']:.0f} MB, "
              f"all predictions {info['all_predictions_mb']:.0f} MB")

        # Correctness (not timing): the scenes Mosaic wrote agree with MONAI's, the floor's (and toolbelt's).
        weight = importance_map(TILE, TILE, blend).astype(np.float32)
        scratch = np.empty((CHANNELS, TILE, TILE), np.float32)
        worst: dict[str, float] = {}
        for s, stem in enumerate(predicted.scenes.stems()):
            written = np.load(out / f"{stem}.npy")
            assert written.shape == (CHANNELS, side, side) and written.dtype == np.float32
            peers = {"monai": monai_scene(predicted, s, blend).numpy(),
                     "numpy-floor": numpy_scene(predicted, s, weight, scratch)}
            if f"toolbelt-{blend}" in configs:
                peers["toolbelt"] = toolbelt_scene(predicted, s, blend).numpy()
            for name, peer in peers.items():
                # MONAI floors its gaussian at 1e-3 without first scaling its peak (0.99976 for an even tile)
                # to 1, as Mosaic does: where two tiles' weights are both near that floor the means differ
                # by up to about 1e-4 of the predictions' spread. Otherwise float64 against float32 sums.
                tolerance = 1e-3 if name == "monai" and blend == "gaussian" else 1e-5
                np.testing.assert_allclose(written, peer, rtol=0, atol=tolerance, err_msg=f"{name}, scene {stem}")
                worst[name] = max(worst.get(name, 0.0), float(np.abs(written - peer).max()))
    for name, diff in worst.items():
        info[f"max_abs_diff_vs_{name}"] = diff
