"""Writes the seed corpus of the shard fuzzer (csrc/tests/fuzz_shard.cpp): real shards, one file each.

Usage: python scripts/fuzz_corpus.py OUT_DIR. Every shard holds records of an "image" field (uint16,
3x8x8 or 3x32x32) in one codec and a raw int64 "label", as the fuzz target decodes them: a few small
records, enough small records for a branch page, and noisy large records on overflow pages. Each comes
as the writer writes it now (format v4: ``KIND-CODEC.lmdb``, one block of records), in format v3
(``KIND-CODEC-v3.lmdb``: a record per key), and, for the branch and overflow kinds, as a v4 shard of
many small blocks (``KIND-CODEC-blocks.lmdb``: blocks inline on leaf pages under a branch page, or
several blocks each on its own overflow run). The fuzz target reads every input both ways.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import lmdb
import numpy as np

import fastload
from fastload.conversion._shard_writer import write_shard, write_values
from fastload.format._blocks import iter_block_records, pack_blocks
from fastload.format._manifest import load_manifest
from fastload.format._record import RecordEncoder

# Blocks of the "-blocks" seeds: one or two small records each, or one or two 6 KB records.
SMALL_BLOCKS = {"branch": 400, "overflow": 8192}


def _values(shard: Path) -> list[bytes]:
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        values = [bytes(v) for _, v in txn.cursor()]
    env.close()
    return values


def _write_values(path: Path, values: list[bytes]) -> None:
    """Write ``values`` under keys 0..n-1 as the shard writer does (8-byte big-endian keys, compacting copy)."""
    path.unlink(missing_ok=True)
    write_values(path, values)


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
                labels = np.arange(n, dtype=np.int64)
                ds = Path(tmp) / f"{kind}-{codec}"
                fastload.write_arrays(ds, {"image": images, "label": labels}, codec={"image": codec},
                                      samples_per_shard=1000)
                shutil.copyfile(ds / "shard-00000.lmdb", out / f"{kind}-{codec}.lmdb")
                if kind in SMALL_BLOCKS:  # the same v4 records in many blocks
                    records = list(iter_block_records(_values(ds / "shard-00000.lmdb")))
                    _write_values(out / f"{kind}-{codec}-blocks.lmdb", pack_blocks(records, target=SMALL_BLOCKS[kind]))
                # Format v3: the same samples, a record per key (RecordEncoder writes old versions for tests).
                manifest = load_manifest(ds)
                encoder = RecordEncoder(manifest.fields, version=3)
                records = [encoder.encode({"image": images[i], "label": labels[i]}, key=i) for i in range(n)]
                v3 = Path(tmp) / f"{kind}-{codec}-v3"
                v3.mkdir()
                info = write_shard(v3, 0, records, binding=(manifest.fields, manifest.dataset_id), durable=False)
                shutil.copyfile(v3 / info.file, out / f"{kind}-{codec}-v3.lmdb")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
