"""``python -m fastload.demo``: the whole pipeline on built-in sample data.

Writes sample photographs (scikit-image's, when installed) and synthetic
13-band uint16 rasters, turns both into shard datasets with preprocess_tiles,
verifies them, and reads batches through ``torch.utils.data.DataLoader`` over
``ShardDataset`` and through ``ShardLoader``, checking both give the same data. Then a
segmentation job (``_demo_segmentation``): the photographs as georeferenced scenes with masks,
tiled together, a few training steps, predictions stitched back into whole scenes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image

from .. import ShardDataset, ShardLoader
from ..conversion.preprocess import main as preprocess_main
from ..format._verify import find_problems
from ._demo_segmentation import run as run_segmentation


def write_sample_images(root: Path) -> tuple[Path, Path]:
    """Write sample photographs and multi-band rasters under ``root``; return their folders."""
    photos, rasters = root / "photos", root / "rasters"
    rng = np.random.default_rng(0)
    try:
        import skimage.data as samples

        pictures = {"animals": {"chelsea": samples.chelsea(), "cat": samples.cat()},
                    "objects": {"coffee": samples.coffee(), "rocket": samples.rocket(),
                                "astronaut": samples.astronaut()}}
    except ImportError:  # synthetic stand-ins when scikit-image is absent
        pictures = {c: {f"synthetic{i}": rng.integers(0, 255, (300, 400, 3), dtype=np.uint8) for i in range(3)}
                    for c in ("animals", "objects")}
    for label, images in pictures.items():
        (photos / label).mkdir(parents=True, exist_ok=True)
        for name, image in images.items():
            Image.fromarray(image).save(photos / label / f"{name}.png")
    rasters.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:384, 0:384]
    for i in range(6):
        bands = np.stack([1000 + 800 * np.sin((xx * (b + 1) + yy * (i + 1)) / 60.0) for b in range(13)])
        bands = (bands + rng.normal(0, 20, bands.shape)).clip(0, 65535).astype(np.uint16)
        tifffile.imwrite(rasters / f"scene{i:02d}.tif", bands, photometric="minisblack", planarconfig="separate")
    return photos, rasters


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the demo."""
    parser = argparse.ArgumentParser(prog="python -m fastload.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=Path("demo-output"),
                        help="where the sample images and the datasets are written (replaced if it exists; "
                             "default: demo-output)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit status."""
    args = build_parser().parse_args(argv)
    out: Path = args.output_dir
    if out.exists():
        shutil.rmtree(out)
    photos, rasters = write_sample_images(out / "images")
    print(f"sample images written to {out / 'images'}")

    steps = [
        ["--data-dir", str(photos), "--output-dir", str(out / "photo-shards"), "--tile-size", "128", "--stride", "96",
         "--edge", "pad", "--labels-from-dirs", "--val-fraction", "0.4", "--seed", "0", "--codec", "zstd",
         "--samples-per-shard", "64", "--workers", "2", "--no-progress"],
        ["--data-dir", str(rasters), "--output-dir", str(out / "raster-shards"), "--tile-size", "64",
         "--codec", "zstd-shuffle", "--shard-size", "2MB", "--workers", "2", "--no-progress"],
    ]
    for step in steps:
        print("preprocess_tiles " + " ".join(step))
        if preprocess_main(step) != 0:
            return 1

    for dataset in (out / "photo-shards" / "train", out / "photo-shards" / "val", out / "raster-shards"):
        problems = list(find_problems(dataset))
        print(f"verify {dataset}: {'OK' if not problems else problems}")
        if problems:
            return 1

    train = out / "photo-shards" / "train"
    reference = torch.utils.data.DataLoader(ShardDataset(train), batch_size=32, num_workers=0)
    start = time.perf_counter()
    first = [{k: v.clone() for k, v in b.items()} for _, b in zip(range(3), reference)]
    print(f"DataLoader(ShardDataset): 3 batches in {time.perf_counter() - start:.3f} s; image "
          f"{tuple(first[0]['image'].shape)} {first[0]['image'].dtype}, label {first[0]['label'][:8].tolist()}")
    loader = ShardLoader(train, batch_size=32, shuffle=False)
    start = time.perf_counter()
    fast = [b for _, b in zip(range(3), loader)]
    print(f"ShardLoader(backend={loader.backend!r}, threads={loader.num_threads}): 3 batches in "
          f"{time.perf_counter() - start:.3f} s")
    same = all(torch.equal(a[k], b[k]) for a, b in zip(first, fast) for k in a)
    print(f"same batches from both: {same}")

    rasters_loader = ShardLoader(out / "raster-shards", batch_size=64, shuffle=True, seed=0)
    start = time.perf_counter()
    samples = sum(len(b["image"]) for b in rasters_loader)
    elapsed = time.perf_counter() - start
    print(f"raster tiles: one shuffled epoch of {samples} samples of 13x64x64 uint16 in {elapsed:.3f} s "
          f"({samples / elapsed:,.0f} samples/s)")
    segmented = run_segmentation(photos, out)
    return 0 if same and segmented else 1


if __name__ == "__main__":
    sys.exit(main())
