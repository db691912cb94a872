"""The device transfer's logic, with fake CUDA operations (this machine has no GPU)."""

import gc
import weakref

import pytest
import torch

from fastload import ShardLoader
from fastload._device import prefetch_to_device, resolve_device


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


def host_batches(n, refs):
    for i in range(n):
        t = torch.full((4,), i)
        refs.append(weakref.ref(t))
        yield {"x": t}


def test_next_copy_starts_before_a_batch_is_handed_over():
    ops, refs = FakeOps(), []
    out = list(prefetch_to_device(host_batches(3, refs), ops))
    assert [int(b["x"][0]) for b in out] == [0, 1, 2]
    assert ops.log[:4] == [("copy", 0), ("copy", 1), ("hand_over", 0), ("copy", 2)]


def test_host_batch_lives_until_its_copy_finished():
    ops, refs = FakeOps(), []
    it = prefetch_to_device(host_batches(4, refs), ops)
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
    it = prefetch_to_device(host_batches(5, refs), ops)
    next(it)
    it.close()
    assert ("wait", 0) in ops.log and ("wait", 1) in ops.log


def test_empty_input():
    assert list(prefetch_to_device(iter(()), FakeOps())) == []


def test_device_arguments_without_cuda(small_dataset):
    assert resolve_device(None) is None and resolve_device("cpu") is None
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            ShardLoader(small_dataset, device="cuda")
    batch = next(iter(ShardLoader(small_dataset, batch_size=4, device="cpu")))
    assert batch["image"].device.type == "cpu"
