"""One shuffled epoch (batch 256, seed 0) of each dataset through fastload and through DataLoader.

Run: ``pytest benchmarks/ --benchmark-only`` (``FASTLOAD_BENCH_QUICK=1`` for the small CI sizes);
``make bench`` also writes benchmarks/results/ (table and chart).

Compared, per dataset, in one pytest-benchmark group so ratios come from one run:
``ShardLoader`` native with 1 and 2 threads (and 2 threads without the per-record XXH3
check, to show its cost); ``ShardLoader(backend="torch")`` (DataLoader with 2
forked persistent workers, same order; with and without the checksum); a user's plain
``DataLoader(ShardDataset)`` with 0 workers, 2 forked workers and 2 spawned workers (spawn
stands in for Windows); and the fallback's yardstick, a minimal hand-written py-lmdb dataset with
no checksum (``plain_lmdb.py``) in a DataLoader with 2 forked workers.

Why the numbers come out as they do: the native path does an LMDB lookup, a header parse, one copy
or one zstd decompression straight into the batch buffer and an XXH3 check per sample, with no
Python per sample; DataLoader pays for a Python ``__getitem__``, a tensor per sample and a
``torch.stack`` per batch, and, with workers, pickling every batch through shared memory. The
torch backend asks its DataLoader for whole batches (``__getitems__``): each record is decoded
straight into its row of one shared-memory array per field, with no tensor per sample and no
collation, so it beats the hand-written baseline even while it verifies checksums. Spawned
workers re-import torch, which dominates the time to the first batch.
"""

from __future__ import annotations

import platform

import pytest
import torch
from conftest import BATCH, DATASETS, SEED, rounds
from datasets import ensure
from measure import EpochResult, MemorySampler, extra_info, run_epoch
from plain_lmdb import PlainLmdbDataset

from fastload import ShardDataset, ShardLoader


def native(path, threads, verify=True):
    return ShardLoader(path, batch_size=BATCH, shuffle=True, seed=SEED, num_threads=threads, backend="native",
                       verify_checksums=verify)


def plain_dataloader(path, workers, context=None, dataset=ShardDataset, persistent=False):
    generator = torch.Generator()
    generator.manual_seed(SEED)
    kwargs = {"multiprocessing_context": context, "persistent_workers": persistent} if workers else {}
    return torch.utils.data.DataLoader(dataset(path), batch_size=BATCH, shuffle=True, num_workers=workers,
                                       generator=generator, **kwargs)


CONFIGS = {
    "fastload-native-1t": lambda p: native(p, 1),
    "fastload-native-2t": lambda p: native(p, 2),
    "fastload-native-2t-noverify": lambda p: native(p, 2, verify=False),
    "fastload-torch-backend-2w": lambda p: ShardLoader(p, batch_size=BATCH, shuffle=True, seed=SEED,
                                                        backend="torch", num_workers=2),
    "fastload-torch-backend-2w-noverify": lambda p: ShardLoader(p, batch_size=BATCH, shuffle=True, seed=SEED,
                                                                 backend="torch", num_workers=2,
                                                                 verify_checksums=False),
    "dataloader-plain-lmdb-2w-fork": lambda p: plain_dataloader(p, 2, "fork", PlainLmdbDataset, persistent=True),
    "dataloader-0w": lambda p: plain_dataloader(p, 0),
    "dataloader-2w-fork": lambda p: plain_dataloader(p, 2, "fork"),
    "dataloader-2w-spawn": lambda p: plain_dataloader(p, 2, "spawn"),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("ds", DATASETS, ids=lambda d: d.name)
def test_epoch(benchmark, floors, ds, config):
    if "fork" in config and platform.system() != "Linux":
        pytest.skip("fork workers exist on Linux only")
    path = ensure(ds)
    floor = floors(ds)
    loader = CONFIGS[config](path)
    result = EpochResult()

    def one_epoch():
        if isinstance(loader, ShardLoader):
            loader.set_epoch(0)
        run_epoch(lambda: loader, result)

    benchmark.group = ds.name
    with MemorySampler() as memory:
        benchmark.pedantic(one_epoch, **rounds("spawn" if "spawn" in config else "other"))
    benchmark.extra_info.update(extra_info(result, ds.sample_bytes, floor.for_codec(ds.codec), memory))
    benchmark.extra_info["floor"] = "memcpy" if ds.codec == "raw" else "decode-1t"
    # Correctness after timing: every sample once (labels add up the same for any order).
    assert result.samples == ds.count
    assert result.checksum == int(ShardDataset(path).manifest.total and _label_sum(path))


_sums: dict = {}


def _label_sum(path) -> int:
    if path not in _sums:
        loader = ShardLoader(path, batch_size=4096, fields=["label"])
        _sums[path] = sum(int(b["label"].sum()) for b in loader)
    return _sums[path]
