"""Throughput of ``fastload.write_dataset`` for a map-style torch Dataset of 3x128x128 uint8 tiles.

Run: ``.venv/bin/python benchmarks/write_dataset_throughput.py [N]`` (prints a Markdown table).
The dataset builds each tile from its index (smooth gradient plus noise, as photographs
compress), so ``__getitem__`` costs about what a cheap decode would. Workers read, check
and encode chunks of about 8 MB; the parent writes LMDB and hashes shards on its writer
thread. Runs alternate 1 and 2 workers (twice each) so machine load hits both alike.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import fastload


class Tiles(torch.utils.data.Dataset):
    """``n`` tiles of 3x128x128 uint8 and an int64 label, a pure function of the index."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.base = (np.indices((128, 128)).sum(axis=0) % 256).astype(np.int16)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        noise = rng.integers(-3, 4, size=(3, 128, 128), dtype=np.int16)
        tile = np.clip(self.base[None] + (i % 50) + noise, 0, 255).astype(np.uint8)
        return torch.from_numpy(tile), i % 10


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    root = Path(tempfile.mkdtemp(prefix="fastload-wd-"))
    sample_mb = (3 * 128 * 128 + 8) / 1e6
    try:
        print("| codec | workers | samples | seconds | samples/s | MB/s (decoded) |")
        print("|---|---:|---:|---:|---:|---:|")
        for codec in ("raw", "zstd"):
            for workers in (1, 2, 1, 2):
                out = root / "out"
                start = time.perf_counter()
                m = fastload.write_dataset(Tiles(n), out, codec=codec, workers=workers, names=("image", "label"),
                                           progress=False)
                seconds = time.perf_counter() - start
                assert m.total == n
                print(f"| {codec} | {workers} | {n} | {seconds:.2f} | {n / seconds:,.0f} | "
                      f"{n * sample_mb / seconds:.1f} |")
                shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
