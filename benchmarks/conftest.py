"""Fixtures of the benchmark suite: the cached datasets and the floors measured in the same run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from datasets import QUICK, BenchDataset, all_datasets, ensure  # noqa: E402

import fastload  # noqa: E402
from fastload import _native  # noqa: E402
from fastload.format._blocks import iter_block_records  # noqa: E402
from fastload.sampling._order import EpochOrder  # noqa: E402

BATCH = 256
SEED = 0
DATASETS = all_datasets()


def best_of(fn, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class Floors:
    """The floors of one dataset, in samples/s, measured once per session (best of 3).

    Each ``make_*`` returns a closure doing one floor's work once, so the floor
    benchmarks time exactly what the rates here were measured on.
    """

    def __init__(self, ds: BenchDataset, path: Path) -> None:
        self.ds, self.path = ds, path
        self.memcpy = ds.count / best_of(self.make_memcpy())
        self.decode = ds.count / best_of(self.make_decode())
        self.lookup = ds.count / best_of(self.make_lookup())

    def make_memcpy(self):
        """Copy the bytes one epoch decodes with numpy, one thread."""
        src = np.full(self.ds.count * self.ds.sample_bytes, 7, dtype=np.uint8)
        dst = np.ones_like(src)
        return lambda: np.copyto(dst, src)

    def make_decode(self):
        """Decode the epoch's records laid end to end with the extension's decoder, one thread."""
        import lmdb

        dataset = fastload.ShardDataset(self.path)
        fields = dataset.manifest.fields
        outs = [np.ones(self.ds.count * f.nbytes, np.uint8) for f in fields]
        spec = [f.native_spec for f in fields]
        version = dataset.manifest.format_version
        parts = []  # per shard: its records end to end, its offsets, its rows of outs and its fingerprint
        start = 0
        for shard, fingerprint in zip(dataset.manifest.shards, dataset.manifest.record_fingerprints()):
            env = lmdb.open(str(self.path / shard.file), subdir=False, readonly=True, lock=False)
            with env.begin() as txn:
                if dataset.manifest.packed:  # format 4: LMDB values are blocks of records
                    records = list(iter_block_records([bytes(v) for _, v in txn.cursor()], records=shard.count))
                else:
                    records = [txn.get(k.to_bytes(8, "big")) for k in range(shard.count)]
            env.close()
            offsets = np.cumsum([0] + [len(r) for r in records], dtype=np.uint64)
            blob = np.frombuffer(b"".join(records), dtype=np.uint8)
            rows = [o[start * f.nbytes:(start + shard.count) * f.nbytes] for o, f in zip(outs, fields)]
            parts.append((blob, offsets, rows, fingerprint))
            start += shard.count

        def decode() -> None:
            for blob, offsets, rows, fingerprint in parts:  # v3: each shard's records carry its own binding
                _native.decode_records(blob, offsets, spec, rows, version=version, fingerprint=fingerprint)

        return decode

    def make_lookup(self):
        """Look up every sample in LMDB in the epoch's shuffled order, no decoding."""
        manifest = fastload.ShardDataset(self.path).manifest
        paths = [str(self.path / s.file) for s in manifest.shards]
        shards = _native.ShardSet(paths, [s.count for s in manifest.shards], [manifest.packed] * len(paths))
        order = EpochOrder(SEED, 0, self.ds.count).positions(0, self.ds.count)
        return lambda: _native.lookup_records(shards, order)

    def for_codec(self, codec: str) -> float:
        """Return the floor a loader is compared with: memcpy for raw data, one-thread decoding otherwise."""
        return self.memcpy if codec == "raw" else self.decode


@pytest.fixture(scope="session")
def floors():
    cache: dict[str, Floors] = {}

    def get(ds: BenchDataset) -> Floors:
        if ds.name not in cache:
            cache[ds.name] = Floors(ds, ensure(ds))
        return cache[ds.name]

    return get


def rounds(kind: str) -> dict:
    if QUICK:
        return {"rounds": 1, "warmup_rounds": 0}
    return {"rounds": 2, "warmup_rounds": 0} if kind == "spawn" else {"rounds": 5, "warmup_rounds": 1}


# The figures every benchmark records (measure.extra_info), so that any two rows of a report compare.
COMMON_FIGURES = ("samples_per_s", "mb_per_s", "first_batch_s", "peak_rss_mb", "cpu_s")


@pytest.fixture(autouse=True)
def records_common_figures(request):
    """Fail a benchmark that ran without recording every one of COMMON_FIGURES in its extra_info."""
    if "benchmark" not in request.fixturenames:
        yield
        return
    bench = request.getfixturevalue("benchmark")
    yield
    if bench.stats is None:  # it did not run (skipped, or benchmarks disabled)
        return
    missing = [name for name in COMMON_FIGURES if name not in bench.extra_info]
    assert not missing, f"{request.node.name} records no {', '.join(missing)} (measure.extra_info)"
