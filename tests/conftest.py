"""Shared fixtures: small datasets written by fastload itself, and helpers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload

BACKENDS = ["native", "torch"]


def smooth_images(n: int, shape: tuple[int, ...], dtype: str = "uint8", seed: int = 0) -> np.ndarray:
    """Images that compress like real ones: smooth gradients plus a little noise."""
    rng = np.random.default_rng(seed)
    grid = np.indices(shape[-2:]).sum(axis=0).astype(np.float64)
    base = (grid[None] * rng.uniform(0.2, 1.0, size=(n, 1, 1)))[:, None]
    noise = rng.normal(0, 2, size=(n, *shape))
    top = np.iinfo(dtype).max if np.dtype(dtype).kind in "iu" else 1.0
    return np.clip(base + noise, 0, top).astype(dtype)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """103 samples of 3x8x8 uint8 images and int64 labels, zstd, 4 shards of up to 30."""
    out = tmp_path_factory.mktemp("small") / "ds"
    images = smooth_images(103, (3, 8, 8))
    labels = np.arange(103, dtype=np.int64) * 7
    fastload.write_arrays(out, {"image": images, "label": labels}, codec={"image": "zstd"}, samples_per_shard=30)
    return out


@pytest.fixture(scope="session")
def empty_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("empty") / "ds"
    fastload.write_arrays(out, {"image": np.zeros((0, 3, 4, 4), np.uint8)})
    return out


def batches_equal(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b)
    )


def without_leftover_downloads(timeout: float = 10.0) -> None:
    """Wait up to ``timeout`` s for the download threads of remote datasets that earlier tests left to end.

    A fetcher's idle threads end 5 s after its last download: in a pytest-xdist worker, a file run after a
    remote one would see them end under its thread counts.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(t.name.startswith("fastload-fetch-") for t in threading.enumerate()):
        time.sleep(0.05)


def thread_count() -> int:
    """The threads of this process that have not begun to exit.

    ``pthread_join`` returns once the kernel has released the thread's memory map, a moment before the thread
    leaves ``/proc/self/task``: a loaded machine can list a joined thread for a while. A task whose ``statm`` reads
    all zeros has no memory map, so it is past the point where its join returned, and is not counted. The count is
    taken again for up to 0.2 s while it still changes, to cover the instant between the join and the map's release.
    """
    def live() -> int:
        count = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/statm") as statm:
                    count += statm.read().split()[0] != "0"
            except (FileNotFoundError, ProcessLookupError):
                pass  # gone between the listing and the read
        return count

    count, deadline = live(), time.monotonic() + 0.2
    while time.monotonic() < deadline:
        time.sleep(0.01)
        again = live()
        if again == count:
            return count
        count = again
    return count


def run_cli(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a console entry point in a subprocess of this interpreter."""
    module = {"preprocess_tiles": "fastload.preprocess", "fastload": "fastload.cli"}[args[0]]
    proc = subprocess.run([sys.executable, "-m", module, *args[1:]], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def slow_reads(monkeypatch):
    """Call ``slow_reads(delay_us)``: native readers made afterwards in this test sleep before every record read."""
    from seams import slow_reader_class

    from fastload import _native

    def install(delay_us: int) -> None:
        monkeypatch.setattr(_native, "BatchReader", slow_reader_class(delay_us))

    return install


@pytest.fixture(scope="session")
def two_class_pngs(tmp_path_factory) -> Path:
    """Ten 70x90 PNG images in two class folders (``cats``, ``dogs``), for preprocess_tiles runs."""
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    for c, name in enumerate(("cats", "dogs")):
        (d / name).mkdir()
        for i, image in enumerate(smooth_images(5, (3, 70, 90), seed=c)):
            Image.fromarray(image.transpose(1, 2, 0)).save(d / name / f"{i}.png")
    return d


def preprocess_two_classes(data: Path, out: str | Path, *extra: str, env: dict | None = None):
    """Run preprocess_tiles over ``two_class_pngs``-like data into ``out`` (a directory or a URL): 32-pixel tiles,
    zstd, 20 KB shards, a 0.3 validation split."""
    return run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(out), "--tile-size", "32",
                   "--stride", "24", "--labels-from-dirs", "--codec", "zstd", "--shard-size", "20KB",
                   "--val-fraction", "0.3", "--no-progress", *extra, env=env)


def kernel_has_populate() -> bool:
    """Return whether this is Linux 5.14 or later (madvise MADV_POPULATE_READ and MADV_POPULATE_WRITE)."""
    if sys.platform != "linux":
        return False
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)
