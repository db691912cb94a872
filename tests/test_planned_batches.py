"""Batches planned ahead into the native reader (issue 26): the reader submits them itself.

A local loader with plain buffers plans into the reader. Over an epoch order (shuffled or not) and
without per-sample transform parameters it hands the reader the rank's whole plan as six numbers
(``plan_positions``): the reader works out each batch's positions as its window reaches them, and
the workers map them through the epoch permutation. Otherwise (weighted sampling, a shuffle window,
transforms) it hands a stretch of batches' indices at a time. Whatever the path, the batches are
those of the one-by-one path (pinned-style single-use buffers, standing in for CUDA's), of the torch
backend, at any thread count, rank, resume point and prefetch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import batches_equal
from test_device import TrackingAllocator

import fastload
from fastload import ShardLoader
from fastload.errors import FastloadError
from fastload.loading import _native_backend

native = pytest.importorskip("fastload._native")


def one_by_one(path, **kwargs):
    """The batches of a loader whose reader takes them one by one (single-use buffers, as pinned ones)."""
    loader = ShardLoader(path, backend="native", **kwargs)
    loader._host_allocator = TrackingAllocator()
    return loader


def planned(path, **kwargs):
    return ShardLoader(path, backend="native", **kwargs)


@pytest.mark.parametrize("options", [
    dict(shuffle=True, seed=3),
    dict(shuffle=False),
    dict(shuffle=True, seed=5, drop_last=True),
    dict(shuffle=True, seed=7, world_size=2, rank=1),
    dict(shuffle=True, seed=7, world_size=3, rank=2, even_batches=False),
    dict(shuffle=True, seed=9, shuffle_window=2),
    dict(seed=9, sample_weights=np.linspace(0.1, 1.0, 103), num_samples=150),
])
@pytest.mark.parametrize("threads", [1, 3])
def test_planned_batches_equal_the_one_by_one_path(small_dataset, options, threads):
    for epoch in (0, 4):
        a, b = planned(small_dataset, batch_size=10, num_threads=threads, **options), \
            one_by_one(small_dataset, batch_size=10, num_threads=threads, **options)
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        got, expected = list(a), list(b)
        assert len(got) == len(a) and batches_equal(got, expected)
        assert batches_equal(got, _torch(small_dataset, epoch, options))


def _torch(path, epoch, options):
    loader = ShardLoader(path, batch_size=10, backend="torch", **options)
    loader.set_epoch(epoch)
    return list(loader)


def test_the_reader_holds_the_plan_not_the_consumer(small_dataset):
    loader = planned(small_dataset, batch_size=4, shuffle=True, seed=1, prefetch=2, num_threads=2)
    it = iter(loader)
    next(it)
    inner = it._inner
    assert isinstance(inner, _native_backend.NativeEpoch) and inner._planned
    # A stretch is queued in the reader beyond the window: the consumer submits nothing per batch.
    assert inner._reader.planned > 0
    assert inner._reader.pending <= 2
    assert len(list(it)) == 25
    pinned = one_by_one(small_dataset, batch_size=4, shuffle=True, seed=1, prefetch=2, num_threads=2)
    it = iter(pinned)
    next(it)
    assert not it._inner._planned and it._inner._reader.planned == 0
    it.close()


def test_resume_mid_epoch_through_the_planned_path(small_dataset):
    loader = planned(small_dataset, batch_size=6, shuffle=True, seed=2, num_threads=2, prefetch=3)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()
    it.close()
    resumed = planned(small_dataset, batch_size=6, shuffle=True, seed=2, num_threads=1, prefetch=5)
    resumed.load_state_dict(state)
    reference = one_by_one(small_dataset, batch_size=6, shuffle=True, seed=2, num_threads=2)
    reference.set_epoch(1)
    assert batches_equal(head + list(resumed), list(reference))


def test_a_consumer_holding_every_batch_gets_every_batch(small_dataset):
    # The reader lacks free buffers for its window while the consumer holds them: new ones are added
    # before each wait, as the one-by-one path adds one before each submit.
    loader = planned(small_dataset, batch_size=3, shuffle=True, seed=4, prefetch=4, num_threads=2)
    held = list(loader)
    labels = torch.cat([b["label"] for b in held])
    assert sorted(labels.tolist()) == [7 * i for i in range(103)]


def test_positions_mapped_by_the_workers_equal_the_permutation(small_dataset):
    dataset = fastload.ShardDataset(small_dataset)
    seed, epoch, n = 12, 3, len(dataset)
    positions = np.arange(n, dtype=np.uint64)
    indices = native.permutation_at(seed, epoch, n, positions)
    sizes = [16] * (n // 16) + ([n % 16] if n % 16 else [])

    def read(values, permutation):
        shards = _native_backend.open_shards(dataset)
        epoch_reader = _native_backend.NativeEpoch(shards, dataset, len(sizes), 16, lambda b: None,
                                                   _native_backend.NativeSettings(2, 3, False))
        reader = epoch_reader._reader
        reader.set_window(3, 2)
        reader.plan(values, sizes, None, permutation)
        labels = [reader.next()[1].copy() for _ in sizes]
        epoch_reader.close()
        return np.concatenate(labels)

    by_position = read(positions, (seed, epoch, n))
    by_index = read(indices, None)
    assert np.array_equal(by_position, by_index)
    assert np.array_equal(by_index, indices.astype(np.int64) * 7)


@pytest.mark.parametrize("values, sizes, permutation, match", [
    (np.arange(5, dtype=np.uint64), [2, 2], None, "do not add up"),
    (np.arange(4, dtype=np.uint64), [0, 4], None, "a batch of 0 samples"),
    (np.array([0, 103], dtype=np.uint64), [2], None, "sample index 103 out of range"),
    (np.array([0, 103], dtype=np.uint64), [2], (1, 0, 103), "epoch position 103 out of range"),
    (np.array([0], dtype=np.uint64), [1], (1, 0, 104), "epoch order over 104 samples"),
])
def test_bad_plans_are_refused_whole(small_dataset, values, sizes, permutation, match):
    assert_refused_whole(small_dataset, lambda reader: reader.plan(values, sizes, None, permutation), match)


def assert_refused_whole(path, plan, match):
    """``plan(reader)`` on a fresh reader (capacity 16) raises FastloadError matching ``match`` and queues nothing."""
    dataset = fastload.ShardDataset(path)
    shards = _native_backend.open_shards(dataset)
    settings = _native_backend.NativeSettings(1, 2, False)
    epoch = _native_backend.NativeEpoch(shards, dataset, 1, 16, lambda b: None, settings)
    try:
        with pytest.raises(FastloadError, match=match):
            plan(epoch._reader)
        assert epoch._reader.planned == 0 and epoch._reader.pending == 0
    finally:
        epoch.close()


@pytest.mark.parametrize("options, whole", [
    (dict(shuffle=True, seed=3), True),
    (dict(shuffle=False), True),
    (dict(shuffle=True, seed=7, world_size=3, rank=2, even_batches=False), True),
    (dict(shuffle=True, seed=9, shuffle_window=2), False),
    (dict(seed=9, sample_weights=np.linspace(0.1, 1.0, 103), num_samples=150), False),
])
def test_an_epoch_order_is_planned_whole_by_the_reader(small_dataset, options, whole):
    loader = planned(small_dataset, batch_size=2, prefetch=2, num_threads=2, **options)
    it = iter(loader)
    first = next(it)
    inner = it._inner
    # The whole epoch in the reader at once (its positions worked out there), or a stretch at a time.
    assert (inner._next_submit == len(it.plan)) == whole
    rest = list(it)
    reference = one_by_one(small_dataset, batch_size=2, prefetch=2, num_threads=2, **options)
    assert batches_equal([first, *rest], list(reference))


@pytest.mark.parametrize("rank_plan, first, stop, permutation, match", [
    ((0, 103, 1, 1, 103, 16), 0, 7, None, "rank 1 outside world_size 1"),
    ((0, 103, 0, 0, 103, 16), 0, 7, None, "world_size and batch_size must be at least 1"),
    ((0, 103, 0, 1, 103, 16), 0, 8, None, "batches 0 to 8 of a plan of 7"),
    ((0, 103, 0, 1, 103, 17), 0, 1, None, "batches of 17 samples"),
    ((1, 103, 0, 1, 103, 16), 0, 7, None, "sample index 103 out of range"),
    ((0, 103, 0, 1, 103, 16), 0, 7, (1, 0, 104), "epoch order over 104 samples"),
    ((0, 103, 0, 2**62, 103, 16), 0, 7, None, "overflow 64 bits"),
])
def test_bad_rank_plans_are_refused_whole(small_dataset, rank_plan, first, stop, permutation, match):
    assert_refused_whole(small_dataset, lambda reader: reader.plan_positions(rank_plan, first, stop, permutation),
                         match)


def test_transform_parameters_are_not_planned_by_position(small_dataset):
    from fastload.transforms import RandomFlip

    loader = planned(small_dataset, batch_size=2, shuffle=True, seed=1, num_threads=2, transforms=[RandomFlip()])
    it = iter(loader)
    next(it)
    assert it._inner._next_submit < len(it.plan)  # a stretch at a time, its parameters drawn here
    with pytest.raises(FastloadError, match="draw parameters per sample"):
        it._inner._reader.plan_positions((0, 103, 0, 1, 103, 2), 0, 1, None)
    it.close()


def test_batch_buffers_start_on_huge_page_boundaries(tmp_path):
    # The slots a wait adds come from one buffer; with 2 MiB or more of them they start on a 2 MiB boundary
    # (huge pages asked for: a fresh process faults its buffers in 2 MiB pieces where the system has them).
    # A numpy array of its own never starts there: malloc's header comes first.
    images = np.random.default_rng(0).integers(0, 255, size=(200, 3, 128, 128), dtype=np.uint8)
    path = tmp_path / "tiles"
    fastload.write_arrays(path, {"image": images, "label": np.arange(200, dtype=np.int64)}, samples_per_shard=64)
    loader = planned(path, batch_size=16, shuffle=True, seed=2, num_threads=2, prefetch=8)
    starts, labels = set(), []
    for batch in loader:
        starts.add(batch["image"].data_ptr())
        labels.append(batch["label"])
        assert torch.equal(batch["image"], torch.from_numpy(images[batch["label"].numpy()]))
    assert any(start % (2 << 20) == 0 for start in starts), sorted(start % (2 << 20) for start in starts)
    assert sorted(torch.cat(labels).tolist()) == list(range(200))
