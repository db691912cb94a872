"""Writes the dataset that csrc/tests/shard_tests.cpp reads (natively, and as Windows .exe under Wine).

Usage: python scripts/cross_test_shards.py OUT_DIR. OUT_DIR/dataset is a fastload dataset of 300 samples in
3 shards (128, 128, 44) with two fields, in this order: "image", uint16 3x32x32, zstd-shuffle (overflow
pages), whose element j of sample i is (i * 2654435761 + j * 40503) mod 2**16, and "label", raw int64,
3 * i + 1. OUT_DIR/order.txt holds EpochOrder(seed=7, epoch=2, n=300): "seed epoch n" then the 300
sample indices, so the C++ Permutation is checked against the Python one on every platform.
OUT_DIR/codecs is a one-shard dataset of 40 samples with the codecs that decode through other
libraries, in this order: "rgb" uint8 3x16x16 png (chw), element j of sample i (7 * i + 13 * j)
mod 256; "depth" uint16 16x16 png, (i * 2654435761 + j * 40503) mod 2**16; "bands" uint16 5x8x8
lz4-shuffle, (31 * i + 977 * j) mod 4096; "photo" uint8 3x16x16 jpeg (chw, quality 90), whose
decode by the pure-Python reader (TurboJPEG through ctypes) is OUT_DIR/codecs-photo.bin, the 40
samples one after another. shard_tests.cpp recomputes the same values: change both together.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

import fastload
from fastload.sampling._order import EpochOrder

N = 300
PER_SHARD = 128


def write_codecs(out: Path, n: int = 40) -> None:
    """Write ``out/codecs`` (png, lz4-shuffle and jpeg fields) and the pure-Python decode of its jpeg field."""
    i = np.arange(n, dtype=np.uint64)[:, None]
    j = np.arange(768, dtype=np.uint64)[None, :]
    rgb = ((7 * i + 13 * j) % 256).astype(np.uint8).reshape(n, 3, 16, 16)
    depth = ((i * np.uint64(2654435761) + j[:, :256] * np.uint64(40503)) % np.uint64(1 << 16)).astype(np.uint16)
    bands = ((31 * i + 977 * j[:, :320]) % 4096).astype(np.uint16).reshape(n, 5, 8, 8)
    y, x = np.mgrid[0:16, 0:16]
    photo = np.stack([(4 * y + 3 * x + 20 * c + np.arange(n)[:, None, None]) % 256 for c in range(3)], axis=1)
    fastload.write_arrays(out / "codecs", {"rgb": rgb, "depth": depth.reshape(n, 16, 16), "bands": bands,
                                           "photo": photo.astype(np.uint8)},
                          codec={"rgb": "png", "depth": "png", "bands": "lz4-shuffle", "photo": "jpeg"},
                          samples_per_shard=n, layout="chw", quality=90)
    dataset = fastload.ShardDataset(out / "codecs")
    decoded = np.stack([np.asarray(dataset[k]["photo"]) for k in range(n)])
    (out / "codecs-photo.bin").write_bytes(decoded.astype(np.uint8).tobytes())


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
    write_codecs(out)
    order = EpochOrder(7, 2, N).positions(0, N)
    (out / "order.txt").write_text(f"7 2 {N}\n" + " ".join(str(int(x)) for x in order) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
