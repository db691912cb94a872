"""The device transfer's logic and the pinned-memory bound, with fake CUDA operations and a fake pinned allocator.

The same paths run for real on a GPU in tests/test_cuda.py.
"""

import gc
import weakref

import numpy as np
import pytest
import torch
from conftest import batches_equal

import fastload
from fastload import ShardLoader
from fastload.loading._device import DevicePrefetcher, resolve_device


class FakeEvent:
    def __init__(self, name):
        self.name, self.done = name, False


class FakeOps:
    """Records the order of operations; copies complete only when the test says so."""

    def __init__(self):
        self.log, self.events = [], []

    def copy(self, batch):
        event = FakeEvent(int(batch["x"][0]))
        self.events.append(event)
        self.log.append(("copy", event.name))
        return {k: v.clone() for k, v in batch.items()}, event

    def hand_over(self, batch, event):
        self.log.append(("hand_over", event.name))

    def finished(self, event):
        return event.done

    def wait(self, event):
        self.log.append(("wait", event.name))
        event.done = True

    def elapsed_s(self, event):
        return 0.001


def host_batches(n, refs):
    for i in range(n):
        t = torch.full((4,), i)
        refs.append(weakref.ref(t))
        yield {"x": t}


def test_next_copy_starts_before_a_batch_is_handed_over():
    ops, refs = FakeOps(), []
    out = list(DevicePrefetcher(host_batches(3, refs), ops))
    assert [int(b["x"][0]) for b in out] == [0, 1, 2]
    # the fake copies never finish by themselves: with two in flight, the third waits for the first
    assert ops.log[:5] == [("copy", 0), ("copy", 1), ("hand_over", 0), ("wait", 0), ("copy", 2)]


def test_host_batch_lives_until_its_copy_finished():
    ops, refs = FakeOps(), []
    it = DevicePrefetcher(host_batches(4, refs), ops)
    next(it)
    gc.collect()
    assert refs[0]() is not None  # copy 0 not finished: its pinned buffer must not be reused
    ops.events[0].done = True
    next(it)
    gc.collect()
    assert refs[0]() is None  # released once its event completed
    assert refs[1]() is not None


def test_closing_early_waits_for_copies_in_flight():
    ops, refs = FakeOps(), []
    it = DevicePrefetcher(host_batches(5, refs), ops)
    next(it)
    it.close()
    assert ("wait", 0) in ops.log and ("wait", 1) in ops.log


def test_empty_input():
    assert list(DevicePrefetcher(iter(()), FakeOps())) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA (tests/test_cuda.py)")
def test_device_cuda_without_cuda_is_refused(small_dataset):
    with pytest.raises(ValueError, match="needs CUDA"):
        ShardLoader(small_dataset, device="cuda")


def test_device_arguments(small_dataset):
    assert resolve_device(None) is None and resolve_device("cpu") is None
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("meta")
    batch = next(iter(ShardLoader(small_dataset, batch_size=4, device="cpu")))
    assert batch["image"].device.type == "cpu"


def test_copies_in_flight_are_capped_by_waiting_for_the_oldest():
    ops, refs = FakeOps(), []
    it = DevicePrefetcher(host_batches(6, refs), ops, max_copies_in_flight=2)
    for _ in range(4):
        next(it)
        assert it.copies_in_flight <= 2
    assert [e for e in ops.log if e[0] == "wait"] == [("wait", 0), ("wait", 1), ("wait", 2)]
    s = it.stats()
    assert s["h2d_s"] == pytest.approx(0.003) and s["h2d_bytes"] == 3 * 4 * 8 and s["copy_wait_s"] >= 0
    with pytest.raises(ValueError, match="at least 1"):
        DevicePrefetcher(iter(()), ops, max_copies_in_flight=0)


class TrackingAllocator:
    """Stands in for torch's pinned allocator: plain memory, every buffer's lifetime tracked."""

    def __init__(self):
        self.buffers = []  # weak references to the numpy memory behind each buffer
        self.sizes = []

    def __call__(self, nbytes):
        memory = np.empty(nbytes, dtype=np.uint8)
        memory.fill(0xAB)
        self.buffers.append(weakref.ref(memory))
        self.sizes.append(nbytes)
        return torch.from_numpy(memory)

    def live(self, collect=False):
        if collect:
            gc.collect()
        return sum(ref() is not None for ref in self.buffers)


class LaggingOps(FakeOps):
    """A GPU that never finishes a copy on its own: the loader must wait for the oldest."""

    def copy(self, batch):
        event = FakeEvent(len(self.events))
        self.events.append(event)
        return {k: v.clone() for k, v in batch.items()}, event


def test_pinned_batches_are_views_of_one_fresh_allocation_each(small_dataset):
    alloc = TrackingAllocator()
    loader = ShardLoader(small_dataset, batch_size=8, shuffle=True, seed=3, num_threads=2, prefetch=3)
    loader._host_allocator = alloc
    reference = list(ShardLoader(small_dataset, batch_size=8, shuffle=True, seed=3, num_threads=1))
    kept = []
    for i, batch in enumerate(loader):
        memory = alloc.buffers[i]()
        assert memory is not None
        # zero-copy views of the allocator's own storage, so torch's allocator tracks copies from them
        for tensor in batch.values():
            assert tensor.untyped_storage().data_ptr() == memory.ctypes.data
        kept.append(batch)
    assert len(alloc.buffers) == len(reference)  # one allocation per batch: fastload never recycles pinned memory
    assert batches_equal(kept, reference)  # batches kept across steps were never rewritten
    del kept, batch, tensor, memory
    assert alloc.live(collect=True) == 0


def test_pinned_memory_is_bounded_when_copies_lag(small_dataset):
    alloc, ops = TrackingAllocator(), LaggingOps()
    loader = ShardLoader(small_dataset, batch_size=4, num_threads=2, prefetch=3)
    loader._host_allocator, loader._transfer_ops = alloc, ops
    peak, batches = 0, 0
    for batch in loader:
        assert batch["image"].shape[1:] == (3, 8, 8)
        peak = max(peak, alloc.live())
        batches += 1
    assert batches == len(loader) and len(alloc.buffers) == batches
    assert peak == loader.prefetch + loader.max_copies_in_flight  # reached, never exceeded: the loader waited
    assert sum(1 for e in ops.log if e[0] == "wait") >= batches - loader.max_copies_in_flight
    s = loader.stats()
    for key in ("read_s", "copy_s", "decompress_s", "h2d_s", "copy_wait_s", "h2d_bytes"):
        assert key in s, key
    assert s["read_s"] > 0 and s["h2d_bytes"] == 103 * (3 * 8 * 8 + 8)
    assert alloc.live(collect=True) == 0


def test_a_batch_viewing_one_buffer_is_copied_as_one_span():
    from fastload.loading._device import rebase, shared_span
    from fastload.loading._pinned import FieldViews

    views = FieldViews(["image", "label"], [0, 192], [torch.uint8, torch.int64], [(3, 4, 4), ()])
    buffer = torch.arange(256, dtype=torch.uint8)
    buffer[192:].view(torch.int64)[:] = torch.arange(8) * 7
    batch = views([buffer, buffer], 4)  # 4 of a capacity of 8 samples: the span runs to the end of the labels used
    flat, start = shared_span(batch)
    assert start == 0 and flat.numel() == 192 + 4 * 8 and flat.data_ptr() == buffer.data_ptr()
    copy = rebase(batch, flat.clone(), start)
    assert copy.keys() == batch.keys()
    for name in batch:
        assert torch.equal(copy[name], batch[name]) and copy[name].data_ptr() != batch[name].data_ptr()
    labels_only = {"label": batch["label"]}
    flat, start = shared_span(labels_only)
    assert start == 192 and torch.equal(rebase(labels_only, flat.clone(), start)["label"], torch.arange(4) * 7)
    assert shared_span({"a": torch.zeros(3), "b": torch.zeros(3)}) is None  # two storages: copied one by one
    assert shared_span({"a": torch.zeros(4, 4).t()}) is None  # not contiguous


def test_auto_prefetch_holds_about_32_mib_of_pinned_batches():
    from fastload.loading._specs import auto_prefetch, usable_cores

    tiles = 256 * (3 * 128 * 128 + 8)
    small = 256 * (3 * 32 * 32 + 8)
    # Plain memory, threads within the cores: one batch per thread, at least 4, and about 8 MiB of
    # small batches (at most 16).
    assert auto_prefetch(8, tiles, pin_memory=False, cores=8) == 8
    assert auto_prefetch(2, tiles, pin_memory=False, cores=2) == 4
    assert auto_prefetch(2, small, pin_memory=False, cores=2) == 11  # 8 MiB / 788,480 bytes, rounded up
    assert auto_prefetch(2, 16, pin_memory=False, cores=2) == 16
    assert auto_prefetch(16, small, pin_memory=False, cores=16) == 16
    assert auto_prefetch(32, small, pin_memory=False, cores=32) == 32
    # More threads than cores: at least 64 MiB of batches (up to 64), never fewer than one per thread.
    assert auto_prefetch(16, small, pin_memory=False, cores=2) == 64
    assert auto_prefetch(3, 4 * small, pin_memory=False, cores=2) == 22
    assert auto_prefetch(3, 16, pin_memory=False, cores=2) == 64
    assert auto_prefetch(100, 16, pin_memory=False, cores=2) == 100
    assert auto_prefetch(8, tiles, pin_memory=False, cores=1) == 8
    assert auto_prefetch(2, small, pin_memory=False) == (11 if usable_cores() >= 2 else 64)  # this machine's cores
    assert auto_prefetch(8, tiles, pin_memory=True) == 3
    assert auto_prefetch(8, 256 * (3 * 32 * 32 + 8), pin_memory=True) == 8
    assert auto_prefetch(1, 10 * 2**30, pin_memory=True) == 2  # never below two


def test_a_power_of_two_field_gets_its_own_pinned_buffer(tmp_path):
    from fastload.loading._pinned import pinned_block_bytes, split_layout

    assert split_layout([8 * 2**20, 2048], 8 * 2**20 + 2048) and not split_layout([12 * 2**20, 2048], 12 * 2**20 + 2048)
    assert pinned_block_bytes(12_584_960) == 16 * 2**20 and pinned_block_bytes(4096) == 4096
    out = tmp_path / "ds"
    fastload.write_arrays(out, {"image": np.arange(30 * 64, dtype=np.uint8).reshape(30, 4, 4, 4),
                                "label": np.arange(30, dtype=np.int64)}, codec={"image": "zstd"})
    alloc = TrackingAllocator()
    loader = ShardLoader(out, batch_size=8, shuffle=True, seed=2, num_threads=2)
    loader._host_allocator = alloc
    got = [dict(b) for b in loader]
    assert alloc.sizes == [512, 64] * 4  # 8 x 64-byte images in 512 bytes, not one 576-byte (1 KiB) buffer
    for i, batch in enumerate(got):
        assert batch["image"].untyped_storage().data_ptr() == alloc.buffers[2 * i]().ctypes.data
        assert batch["label"].untyped_storage().data_ptr() == alloc.buffers[2 * i + 1]().ctypes.data
    assert batches_equal(got, list(ShardLoader(out, batch_size=8, shuffle=True, seed=2, num_threads=1)))
    only_labels = ShardLoader(out, batch_size=8, fields=["label"], num_threads=2)
    only_labels._host_allocator = TrackingAllocator()
    assert [b["label"].tolist() for b in only_labels][0] == list(range(8))


@pytest.mark.parametrize("device", [False, True])
def test_break_and_del_release_every_pinned_buffer(small_dataset, device):
    alloc = TrackingAllocator()
    loader = ShardLoader(small_dataset, batch_size=4, num_threads=2, prefetch=3)
    loader._host_allocator = alloc
    if device:
        loader._transfer_ops = LaggingOps()
    for i, _batch in enumerate(loader):
        if i == 2:
            break
    del _batch
    assert alloc.live(collect=True) == 0  # break closed the epoch: buffers of batches not delivered are released
    it = iter(loader)
    first = next(it)
    del it
    # only the batch the caller holds; with a device the caller holds a device copy, no host memory
    assert alloc.live(collect=True) == (0 if device else 1)
    del first
    assert alloc.live(collect=True) == 0
