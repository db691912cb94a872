"""Each of ShardLoader's parameter groups (loading/_specs.py) validates on its own; the loader composes them."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import fastload
from fastload.errors import ArgumentError
from fastload.loading._distributed import Topology
from fastload.loading._specs import (
    MAX_THREADS,
    DeviceSpec,
    DistributionSpec,
    OrderSpec,
    ReadSpec,
    SourceSpec,
    auto_prefetch,
    cgroup_cpu_quota,
    resolve_backend,
    running_threads,
    usable_cores,
)


def source(small_dataset, **kw):
    args = {"split": None, "fields": None, "verify_checksums": True, "allow_external_shards": False, "indices": None}
    return SourceSpec.build(small_dataset, **{**args, **kw})


def test_source_opens_a_path_a_dataset_a_concatenation_and_a_subset(small_dataset):
    spec = source(small_dataset)
    assert isinstance(spec.dataset, fastload.ShardDataset) and len(spec.dataset) == 103 and spec.indices is None
    assert spec.sample_bytes == 3 * 8 * 8 + 8
    assert [f.name for f in source(small_dataset, fields=["label"]).dataset.fields] == ["label"]
    ds = fastload.ShardDataset(small_dataset)
    assert source(ds).dataset is ds
    concat = fastload.concat([small_dataset, small_dataset])
    assert source(concat).dataset is concat
    subset = ds.subset([5, 3])
    spec = SourceSpec.build(subset, None, None, True, False, None)
    assert spec.dataset is ds and list(spec.indices) == [5, 3]
    with pytest.raises(ValueError, match="indices= or a ShardSubset, not both"):
        SourceSpec.build(subset, None, None, True, False, [1])
    with pytest.raises(ValueError, match="needs a dataset root path"):
        SourceSpec.build(ds, "train", None, True, False, None)
    with pytest.raises(TypeError, match="expected a dataset directory"):
        SourceSpec.build(42, None, None, True, False, None)


def test_order_checks_batch_size_and_seed_and_makes_the_sampling(small_dataset):
    spec = OrderSpec.build(source(small_dataset), 10, 1, 3, 0, None, None, True)
    assert (spec.batch_size, spec.shuffle, spec.seed, spec.drop_last) == (10, True, 3, False)
    assert spec.sampling is not None
    for bad in (0, -1, True, 2.5, "8"):
        with pytest.raises(ArgumentError, match="batch_size must be a positive integer"):
            OrderSpec.build(source(small_dataset), bad, False, 0, False, None, None, True)
    for bad in (1.5, "0", True, None):
        with pytest.raises(ValueError, match="seed must be an integer"):
            OrderSpec.build(source(small_dataset), 4, False, bad, False, None, None, True)
    weighted = OrderSpec.build(source(small_dataset), 4, False, 0, False, np.ones(103), 50, True)
    assert weighted.sampling is not spec.sampling


def test_distribution_checks_explicit_ranks_now():
    spec = DistributionSpec.build(1, 2, 0)
    assert spec.topology == Topology(1, 2) and spec.topology.resolve() == (1, 2) and spec.even_batches is False
    assert DistributionSpec.build(None, None, True).topology.explicit is False
    for rank, world in ((2, 2), (-1, 2), (0, 0), (0, -2)):
        with pytest.raises(ArgumentError):
            DistributionSpec.build(rank, world, True)


def test_device_resolves_pinning():
    spec = DeviceSpec.build(None, "auto")
    assert spec.device is None and spec.pin_memory is torch.cuda.is_available()
    assert DeviceSpec.build(None, False).pin_memory is False
    with pytest.raises(ValueError, match="pin_memory must be True, False or 'auto'"):
        DeviceSpec.build(None, "yes")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            DeviceSpec.build(None, True)


def test_read_checks_threads_prefetch_workers_and_resolves_auto():
    spec = ReadSpec.build("native", 2, "auto", "auto", None, True, None, batch_bytes=256 * 200, pin_memory=False)
    assert (spec.backend, spec.num_threads, spec.prefetch) == ("native", 2, auto_prefetch(2, 256 * 200, False))
    assert ReadSpec.build("torch", 1, 3, 0, 2, False, "spawn", 10, False).prefetch == 3
    bad = [({"num_threads": 0}, "num_threads"), ({"num_threads": MAX_THREADS + 1}, "num_threads must be at most"),
           ({"prefetch": 0}, "prefetch"), ({"num_workers": -1}, "num_workers"), ({"num_workers": True}, "num_workers"),
           ({"prefetch_factor": 0}, "prefetch_factor")]
    for change, message in bad:
        args = {"backend": "native", "num_threads": 2, "prefetch": 2, "num_workers": 0, "prefetch_factor": None,
                "persistent_workers": True, "multiprocessing_context": None, "batch_bytes": 100, "pin_memory": False}
        with pytest.raises(ArgumentError, match=message):
            ReadSpec.build(**{**args, **change})
    with pytest.raises(ValueError, match="backend must be"):
        resolve_backend("cuda")
    assert resolve_backend("torch") == "torch" and resolve_backend("auto") == "native"


def test_the_loader_exposes_what_its_specs_resolved(small_dataset):
    loader = fastload.ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=3, num_threads=2, prefetch=4,
                                  rank=1, world_size=2, even_batches=False, fields=["label"])
    assert (loader.batch_size, loader.shuffle, loader.seed, loader.num_threads, loader.prefetch) == (10, True, 3, 2, 4)
    assert (loader.rank, loader.world_size, loader.even_batches, loader.backend) == (1, 2, False, "native")
    assert [f.name for f in loader.dataset.fields] == ["label"]
    with pytest.raises(ArgumentError, match="batch_size"):  # checked before the dataset is opened
        fastload.ShardLoader("/nonexistent/dataset", batch_size=0)


def test_threads_beyond_the_cores_take_turns_where_the_reader_can_see_reads_from_disk():
    assert running_threads(16, cores=2, platform="linux") == 2  # in memory: CPU work, 2 decode at once
    assert running_threads(2, cores=2, platform="linux") == 2
    assert running_threads(3, cores=8, platform="linux") == 3  # fewer threads than cores: all of them
    assert running_threads(16, cores=2, platform="win32") == 16  # no per-thread major faults: all run
    assert running_threads(16, cores=2, platform="darwin") == 16


def test_a_cgroup_cpu_quota_bounds_the_usable_cores(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:memory:/x\n0::/job/step\n")
    group = tmp_path / "root" / "job" / "step"
    group.mkdir(parents=True)
    for text, cpus in (("200000 100000\n", 2), ("150000 100000", 2), ("50000 100000", 1), ("max 100000", None),
                       ("", None), ("-1 100000", None), ("garbage", None)):
        (group / "cpu.max").write_text(text)
        assert cgroup_cpu_quota(str(proc), str(tmp_path / "root")) == cpus, text
    assert cgroup_cpu_quota(str(tmp_path / "missing"), str(tmp_path / "root")) is None
    proc.write_text("4:memory:/x\n")  # cgroup v1 only: no quota read
    assert cgroup_cpu_quota(str(proc), str(tmp_path / "root")) is None
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)


def test_the_loader_runs_as_many_threads_at_once_as_cores_and_reads_the_same_batches(small_dataset):
    running = running_threads(8)
    loader = fastload.ShardLoader(small_dataset, batch_size=4, shuffle=True, seed=1, num_threads=8, backend="native")
    assert loader.num_threads == 8 and loader._native_settings(False).max_running == running
    # The batches in flight are those of the threads that run (auto_prefetch of the running count).
    assert loader.prefetch == auto_prefetch(running, 4 * (3 * 8 * 8 + 8), False)
    batches = [b["label"] for b in loader]
    stats = loader.stats()
    assert 1 <= stats["peak_running"] <= (running if stats["disk_chunks"] == 0 else 8), stats  # (disk: all 8)
    one = fastload.ShardLoader(small_dataset, batch_size=4, shuffle=True, seed=1, num_threads=1, backend="native")
    assert all(torch.equal(a, b["label"]) for a, b in zip(batches, one, strict=True))


@pytest.mark.skipif(usable_cores() >= 8, reason="8 threads do not exceed this machine's cores: nothing to gate")
def test_threads_waiting_for_the_disk_let_every_thread_run(small_dataset, monkeypatch):
    """A reader that sees its threads wait for the disk lets all 8 run; without such waits, the cores' worth."""
    from seams import slow_reader_class

    from fastload import _native

    cores = usable_cores()
    results = {}
    for disk in (False, True):
        monkeypatch.setattr(_native, "BatchReader", slow_reader_class(100, disk=disk))  # every chunk > 50 us
        loader = fastload.ShardLoader(small_dataset, batch_size=16, shuffle=True, seed=2, num_threads=8,
                                      prefetch=8, backend="native", warm_up=False)
        if sys.platform.startswith("linux"):
            assert loader._native_settings(False).max_running == cores
        results[disk] = (torch.cat([b["label"] for b in loader]), loader.stats())
    (plain, plain_stats), (disk, disk_stats) = results[False], results[True]
    assert torch.equal(plain, disk)  # the same batches however many run
    assert plain_stats["disk_chunks"] == 0 and plain_stats["peak_running"] <= cores, plain_stats
    if sys.platform.startswith("linux"):
        assert disk_stats["disk_chunks"] > 0, disk_stats
        assert disk_stats["peak_running"] > cores, disk_stats  # more threads than cores ran while "reading disk"
