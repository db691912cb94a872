"""Throughput of ``preprocess_tiles``: MB/s of decoded input for 1 and 2 workers, raw and zstd.

Run: ``.venv/bin/python benchmarks/preprocess_throughput.py`` (prints a Markdown table).
Inputs: 48 RGB PNG photographs of 1024x1024 (mosaics of scikit-image's sample photos)
and 24 13-band uint16 TIFF rasters of 512x512 (smooth waves plus noise), cut into 128x128 tiles.
Encoding is per source image in worker processes; the parent writes LMDB and hashes, so two
workers do not double the rate when the parent's share is large.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import skimage.data
import tifffile
from PIL import Image

from fastload.preprocess import main as preprocess


def make_inputs(root: Path) -> dict[str, Path]:
    photos, rasters = root / "photos", root / "rasters"
    photos.mkdir(parents=True)
    rasters.mkdir(parents=True)
    pics = [skimage.data.astronaut(), skimage.data.coffee()[:400, :400], skimage.data.chelsea()[:300, :300],
            skimage.data.rocket()[:400, :400]]
    rng = np.random.default_rng(0)
    for i in range(48):
        canvas = np.zeros((1024, 1024, 3), np.uint8)
        for y in range(0, 1024, 256):
            for x in range(0, 1024, 256):
                pic = pics[rng.integers(len(pics))]
                oy, ox = rng.integers(0, pic.shape[0] - 256), rng.integers(0, pic.shape[1] - 256)
                canvas[y:y + 256, x:x + 256] = pic[oy:oy + 256, ox:ox + 256]
        Image.fromarray(canvas).save(photos / f"photo{i:03d}.png")
    yy, xx = np.mgrid[0:512, 0:512]
    for i in range(24):
        bands = np.stack([1000 + 800 * np.sin((xx * (b + 1) + yy * (i + 1)) / 60.0) for b in range(13)])
        bands = (bands + rng.normal(0, 20, bands.shape)).clip(0, 65535).astype(np.uint16)
        tifffile.imwrite(rasters / f"scene{i:03d}.tif", bands, photometric="minisblack", planarconfig="separate")
    return {"photos (PNG, 3x128x128 uint8)": photos, "rasters (TIFF, 13x128x128 uint16)": rasters}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="fastload-pp-"))
    try:
        inputs = make_inputs(root / "in")
        print("| input | codec | workers | decoded MB | seconds | MB/s (decoded input) | shard MB | ratio |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for label, src in inputs.items():
            codecs = ["raw", "zstd"] + (["zstd-shuffle"] if "uint16" in label else [])
            for codec in codecs:
                for workers in (1, 2):
                    out = root / "out"
                    start = time.perf_counter()
                    preprocess(["--data-dir", str(src), "--output-dir", str(out), "--tile-size", "128",
                                "--codec", codec, "--workers", str(workers), "--shard-size", "32MB", "--no-progress",
                                "--overwrite"])
                    elapsed = time.perf_counter() - start
                    import json

                    m = json.loads((out / "manifest.json").read_text())
                    per = sum(int(np.prod(f["shape"])) * np.dtype(f["dtype"]).itemsize for f in m["schema"])
                    decoded = m["total"] * per / 1e6
                    stored = sum(s["bytes"] for s in m["shards"]) / 1e6
                    print(f"| {label} | {codec} | {workers} | {decoded:.0f} | {elapsed:.2f} | "
                          f"{decoded / elapsed:.0f} | {stored:.0f} | {decoded / stored:.2f} |", flush=True)
                    shutil.rmtree(out)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
