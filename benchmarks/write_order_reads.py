"""The cost of the shuffled write order on tiled scenes: ``--order source`` against ``--order shuffled``.

Run alone: ``python benchmarks/write_order_reads.py [SCENES [SIZE [TILE [RUNS]]]]`` (default 8 scenes
of 2048x2048 RGB PNG cut into 64-pixel tiles, 3 runs, one worker). Prints, per order, the median
seconds of ``preprocess_tiles`` and how many times the scene files were decoded (counted on the
encoder's reader), as Markdown.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from fastload.conversion import _encode
from fastload.conversion.preprocess import main as preprocess_main


def make_scenes(root: Path, scenes: int, size: int) -> Path:
    """Write ``scenes`` smooth RGB PNG scenes of ``size`` x ``size`` pixels under ``root`` and return it."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(scenes):
        phase = rng.uniform(0, 6.28, 3)
        image = np.stack([127 + 120 * np.sin(6 * x + 4 * y + p) for p in phase], axis=-1).astype(np.uint8)
        Image.fromarray(image).save(root / f"scene{i}.png", compress_level=1)
    return root


def timed_run(data: Path, out: Path, tile: int, order: str) -> tuple[float, int]:
    """Convert ``data`` in ``order`` with one worker; return (seconds, decodes of source files)."""
    reads = [0]
    real = _encode.read_image

    def counting(*args, **kwargs):
        reads[0] += 1
        return real(*args, **kwargs)

    _encode.read_image = counting
    try:
        start = time.perf_counter()
        code = preprocess_main(["--data-dir", str(data), "--output-dir", str(out), "--no-progress", "--overwrite",
                                "--tile-size", str(tile), "--workers", "1", "--order", order])
        seconds = time.perf_counter() - start
    finally:
        _encode.read_image = real
    if code != 0:
        raise SystemExit(f"preprocess_tiles exited {code}")
    return seconds, reads[0]


def main() -> None:
    """Print the median time and the reads of each order (arguments: scenes, size, tile, runs)."""
    args = [int(a) for a in sys.argv[1:]]
    scenes, size, tile, runs = (args + [8, 2048, 64, 3][len(args):])[:4]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        make_scenes(data, scenes, size)
        print(f"{scenes} scenes of {size}x{size} RGB PNG, {tile}-pixel tiles, 1 worker, median of {runs} runs\n")
        print("| order | seconds (median) | runs | scene decodes |")
        print("|---|---|---|---|")
        for order in ("source", "shuffled"):
            results = [timed_run(data, Path(tmp) / f"out-{order}", tile, order) for _ in range(runs)]
            times = [f"{s:.2f}" for s, _ in results]
            print(f"| {order} | {statistics.median(s for s, _ in results):.2f} | {', '.join(times)} | "
                  f"{results[0][1]} |")


if __name__ == "__main__":
    main()
