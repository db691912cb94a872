"""Benchmark datasets: generated once, cached on disk under benchmarks/.cache, keyed by their parameters.

The data compresses like real imagery (smooth structure plus noise), not
like uniform random bytes. ``FASTLOAD_BENCH_QUICK=1`` shrinks every dataset
and keeps one codec per kind, so CI runs the whole suite in seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import fastload

QUICK = os.environ.get("FASTLOAD_BENCH_QUICK", "") not in ("", "0")
CACHE = Path(__file__).parent / ".cache"


@dataclass(frozen=True)
class BenchDataset:
    """One benchmark dataset: a kind of sample, a count and a codec."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    count: int
    codec: str

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.codec}"

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize + 8  # image + int64 label

    @property
    def path(self) -> Path:
        key = f"{self.kind}-{'x'.join(map(str, self.shape))}-{self.dtype}-{self.count}-{self.codec}-v1"
        return CACHE / key


KINDS = {"small": ((3, 32, 32), "uint8", 50_000, 4_000), "tiles": ((3, 128, 128), "uint8", 10_000, 600),
         "multispectral": ((13, 64, 64), "uint16", 10_000, 400)}
CODECS = {"small": ["raw", "zstd"], "tiles": ["raw", "zstd"], "multispectral": ["raw", "zstd", "zstd-shuffle"]}
QUICK_SET = {"small-raw", "tiles-zstd", "multispectral-zstd-shuffle"}


def all_datasets() -> list[BenchDataset]:
    """Return the datasets of this mode (full, or quick)."""
    out = []
    for kind, (shape, dtype, full, quick) in KINDS.items():
        for codec in CODECS[kind]:
            ds = BenchDataset(kind, shape, dtype, quick if QUICK else full, codec)
            if not QUICK or ds.name in QUICK_SET:
                out.append(ds)
    return out


def smooth_noisy(rng: np.random.Generator, n: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Images of smooth gradients and waves with a little noise, like photographs or rasters."""
    c, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    top = float(np.iinfo(dtype).max)
    out = np.empty((n, c, h, w), dtype=dtype)
    for i in range(n):
        fx, fy, phase = rng.uniform(0.02, 0.2, size=3)
        wave = np.sin(xx * fx + yy * fy + phase * 10)[None] * rng.uniform(0.2, 0.4, size=(c, 1, 1))
        level = rng.uniform(0.3, 0.6, size=(c, 1, 1))
        noise = rng.normal(0, 0.01, size=(c, h, w)).astype(np.float32)
        out[i] = np.clip((level + wave + noise) * top, 0, top).astype(dtype)
    return out


def ensure(ds: BenchDataset) -> Path:
    """Write the dataset unless a complete copy is already cached; return its path."""
    if (ds.path / "manifest.json").exists():
        return ds.path
    rng = np.random.default_rng(0)
    images = smooth_noisy(rng, ds.count, ds.shape, ds.dtype)
    labels = rng.integers(0, 1000, size=ds.count).astype(np.int64)
    fastload.write_arrays(ds.path, {"image": images, "label": labels}, codec={"image": ds.codec},
                          samples_per_shard=4096, overwrite=True)
    return ds.path
