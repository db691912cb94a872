"""Writes the dataset that csrc/tests/shard_tests.cpp reads (natively, and as Windows .exe under Wine).

Usage: python scripts/cross_test_shards.py OUT_DIR. OUT_DIR/dataset is a fastload dataset of 300 samples in
3 shards (128, 128, 44) with two fields, in this order: "image", uint16 3x32x32, zstd-shuffle (overflow
pages), whose element j of sample i is (i * 2654435761 + j * 40503) mod 2**16, and "label", raw int64,
3 * i + 1. OUT_DIR/order.txt holds EpochOrder(seed=7, epoch=2, n=300): "seed epoch n" then the 300
sample indices, so the C++ Permutation is checked against the Python one on every platform.
shard_tests.cpp recomputes the same values: change both together.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

import fastload
from fastload._order import EpochOrder

N = 300
PER_SHARD = 128


def main(out: Path) -> None:
    """Write the dataset and the order file into ``out`` (replacing them)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    i = np.arange(N, dtype=np.uint64)[:, None]
    j = np.arange(3 * 32 * 32, dtype=np.uint64)[None, :]
    image = ((i * np.uint64(2654435761) + j * np.uint64(40503)) % np.uint64(1 << 16)).astype(np.uint16)
    label = 3 * np.arange(N, dtype=np.int64) + 1
    fastload.write_arrays(out / "dataset", {"image": image.reshape(N, 3, 32, 32), "label": label},
                          codec={"image": "zstd-shuffle", "label": "raw"}, samples_per_shard=PER_SHARD)
    order = EpochOrder(7, 2, N).positions(0, N)
    (out / "order.txt").write_text(f"7 2 {N}\n" + " ".join(str(int(x)) for x in order) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
