"""Write tests/data/golden/: one tiny dataset per format version (v1, v2, v3, v4), read by tests/test_golden.py.

Run when a format version is introduced (``PYTHONPATH=python python scripts/make_golden.py --version 5``), never
by the tests: the committed files pin what readers must keep reading, and tests/test_golden.py checks that
today's writer still writes the v4 dataset byte for byte (``write_golden``, imported by the test). Each dataset:
two shards (5 and 3 samples) of three fields: ``image`` raw uint8 [3, 4, 4], ``vec`` zstd-shuffle uint16
[2, 3] and ``label`` int64, sample *i* given by :func:`sample`; a fixed provenance (no creation date), and
for v3 and v4 one fixed dataset id (so upgrading the v3 dataset gives the v4 one exactly).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import xxhash

from fastload.conversion._shard_writer import write_shard
from fastload.format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from fastload.format._record import Field, RecordEncoder

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden"
VERSIONS = (1, 2, 3, 4)
FIELDS = [
    Field("image", "uint8", (3, 4, 4)),
    Field("vec", "uint16", (2, 3), "zstd-shuffle"),
    Field("label", "int64", ()),
]
COUNTS = (5, 3)  # samples per shard
PROVENANCE = {"tool": "fastload scripts/make_golden.py"}
DATASET_ID = xxhash.xxh3_128_hexdigest(b"fastload golden dataset")  # v3 and v4


def sample(i: int) -> dict[str, np.ndarray]:
    """Return sample ``i`` of every golden dataset.

    image[c, y, x] = (37i + 16c + 4y + 3x) mod 256; vec[j, k] = (4099i + 257j + 31k) mod 65536, but all
    zeros for i mod 5 = 3 (its zstd frame is shorter: the first shard's block has a record length
    index, the second's records are all of one length); label = (-1)^i (2^33 i + 7).
    """
    c, y, x = np.indices((3, 4, 4))
    j, k = np.indices((2, 3))
    return {"image": ((37 * i + 16 * c + 4 * y + 3 * x) % 256).astype(np.uint8),
            "vec": ((4099 * i + 257 * j + 31 * k) % 65536 * (i % 5 != 3)).astype(np.uint16),
            "label": np.int64((-1) ** i * (2**33 * i + 7))}


def write_golden(out: Path, version: int) -> Manifest:
    """Write the golden dataset of format ``version`` into ``out`` (a new directory); return its manifest."""
    out.mkdir(parents=True)
    encoder = RecordEncoder(FIELDS, version=version)
    dataset_id = DATASET_ID if version >= 3 else None
    shards, start = [], 0
    for index, count in enumerate(COUNTS):
        records = [encoder.encode(sample(i)) for i in range(start, start + count)]
        shards.append(write_shard(out, index, records, binding=(FIELDS, dataset_id) if dataset_id else None))
        start += count
    manifest = Manifest(FIELDS, shards, dict(PROVENANCE), {}, format_version=version, dataset_id=dataset_id)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return manifest


LIBRARIES_FILE = "libraries.json"  # the libraries under the writer when the golden files were written


def writer_libraries() -> dict[str, str]:
    """Return the versions of the libraries whose output is in the golden bytes: LMDB's and zstd's."""
    import lmdb
    import zstandard

    return {"lmdb": ".".join(map(str, lmdb.version())), "zstd": ".".join(map(str, zstandard.ZSTD_VERSION))}


def main(argv: list[str] | None = None) -> int:
    """Write the golden datasets of the versions asked (all by default), replacing those there."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, nargs="+", choices=VERSIONS, default=list(VERSIONS))
    args = parser.parse_args(argv)
    (OUT / LIBRARIES_FILE).write_text(json.dumps(writer_libraries(), indent=1) + "\n")
    for version in args.version:
        out = OUT / f"v{version}"
        shutil.rmtree(out, ignore_errors=True)
        write_golden(out, version)
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"{out}: format {version}, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
