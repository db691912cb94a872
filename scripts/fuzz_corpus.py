"""Writes the seed corpus of the shard fuzzer (csrc/tests/fuzz_shard.cpp): real shards, one file each.

Usage: python scripts/fuzz_corpus.py OUT_DIR. Every shard holds records of an "image" field (uint16,
3x8x8 or 3x32x32) in one codec and a raw int64 "label", as the fuzz target decodes them: a few small
records, enough small records for a branch page, and noisy large records on overflow pages.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import fastload


def main(out: Path) -> None:
    """Write the seeds into ``out`` (replacing what is there)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    # name: (records, image side, value range); noisy 3x32x32 records do not compress below a page.
    kinds = {"few": (5, 8, 8), "branch": (150, 8, 8), "overflow": (4, 32, 2**16)}
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("raw", "zstd", "zstd-shuffle", "lz4", "lz4-shuffle", "png", "jpeg"):
            for kind, (n, side, top) in kinds.items():
                images = rng.integers(0, top, (n, 3, side, side), dtype=np.uint16)
                if codec == "jpeg":  # uint8 only
                    images = (images >> 8 if top > 256 else images).astype(np.uint8)
                ds = Path(tmp) / f"{kind}-{codec}"
                fastload.write_arrays(ds, {"image": images, "label": np.arange(n, dtype=np.int64)},
                                      codec={"image": codec}, samples_per_shard=1000)
                shutil.copyfile(ds / "shard-00000.lmdb", out / f"{kind}-{codec}.lmdb")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
