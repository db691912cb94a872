"""Threads, buffers and the GIL: every exit path joins the workers, nothing leaks or crashes."""

import _thread
import gc
import signal
import threading
import time

import psutil
import pytest
import torch
from conftest import thread_count, without_leftover_downloads

from fastload import ShardLoader
from fastload.loading._native_backend import NativeEpoch


@pytest.fixture
def baseline_threads(small_dataset):
    list(ShardLoader(small_dataset, batch_size=8, num_threads=4))  # warm up torch's own pools
    gc.collect()
    without_leftover_downloads()
    return thread_count()


def slow_loader(path, slow_reads, delay_us=2000, **kw):
    slow_reads(delay_us)  # the test seam (tests/seams.py): every native reader made from here on is slow
    return ShardLoader(path, batch_size=4, num_threads=2, **kw)


def test_threads_run_while_iterating_and_stop_at_the_end(small_dataset, baseline_threads):
    # No warm-up: its thread may still end a step as the pass begins (tests/test_warm_up.py counts it apart)
    loader = ShardLoader(small_dataset, batch_size=8, num_threads=4, warm_up=False)
    it = iter(loader)
    next(it)
    assert thread_count() == baseline_threads + 4
    for _ in it:
        pass
    assert thread_count() == baseline_threads


def test_break_joins_threads(small_dataset, baseline_threads, slow_reads):
    for i, _ in enumerate(slow_loader(small_dataset, slow_reads)):
        if i == 1:
            break
    assert thread_count() == baseline_threads


def test_del_joins_threads(small_dataset, baseline_threads, slow_reads):
    it = iter(slow_loader(small_dataset, slow_reads))
    next(it)
    assert thread_count() > baseline_threads
    del it
    assert thread_count() == baseline_threads


def test_exception_in_the_loop_joins_threads(small_dataset, baseline_threads, slow_reads):
    try:
        for _ in slow_loader(small_dataset, slow_reads):
            raise RuntimeError("user error")
    except RuntimeError:
        pass
    assert thread_count() == baseline_threads


@pytest.fixture
def sigint_handled():
    """Give the test Python's Ctrl-C handler: interrupt_main() does nothing where SIGINT is ignored (background job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_waiting_interrupts_promptly(small_dataset, baseline_threads, slow_reads, sigint_handled):
    loader = slow_loader(small_dataset, slow_reads, delay_us=200_000)  # 0.8 s per batch of 4 on 2 threads
    timer = threading.Timer(0.2, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    assert time.monotonic() - start < 1.5
    timer.join()
    assert thread_count() == baseline_threads


def test_close_is_idempotent_and_a_closed_epoch_stops(small_dataset, baseline_threads):
    it = iter(ShardLoader(small_dataset, batch_size=8))
    next(it)
    it.close()
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert thread_count() == baseline_threads


@pytest.mark.no_asan  # ASan's allocator quarantine holds freed memory, so RSS says nothing there
def test_many_short_lived_loaders_leak_neither_threads_nor_memory(small_dataset, baseline_threads):
    process = psutil.Process()

    def churn(n):
        for i in range(n):
            loader = ShardLoader(small_dataset, batch_size=16, shuffle=True, seed=i, num_threads=2)
            for j, _ in enumerate(loader):
                if j == i % 4:
                    break

    churn(50)
    gc.collect()
    before = process.memory_info().rss
    churn(200)
    gc.collect()
    grown = process.memory_info().rss - before
    assert thread_count() == baseline_threads
    assert grown < 8 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 200 loaders"


def test_steady_loop_recycles_buffers(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=4, prefetch=2, num_threads=2)
    it = iter(loader)
    for _batch in it:
        assert isinstance(it._inner, NativeEpoch)  # built by the first next()
    assert it._inner.pool_slots == 0  # closed at the end
    _batch = None  # no batch of the first pass stays alive
    for _ in range(2):  # the next passes take their buffers from the same pool
        it = iter(loader)
        slots = []
        for _batch in it:
            slots.append(it._inner.pool_slots)
        _batch = None
        assert max(slots) <= 2 + 2  # prefetch + the batch being used + the one the loop variable still holds
        assert len(slots) == 26


def test_held_batches_keep_their_buffers(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, prefetch=2)
    held = list(loader)
    loader.set_epoch(0)
    again = list(loader)
    for a, b in zip(held, again):
        assert a["image"].data_ptr() != b["image"].data_ptr()
        assert (a["label"] == b["label"]).all()


def test_a_new_pass_reuses_the_last_pass_buffers_and_spares_those_still_viewed(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=4, prefetch=3, num_threads=2, pin_memory=False)
    first = iter(loader)
    kept = []
    for i, batch in enumerate(first):
        if i % 2 == 0:  # every other batch of the first pass stays alive, viewing its buffer
            kept.append((batch, batch["image"].clone(), batch["label"].clone()))
    pool_after_first = first._inner  # closed: its buffers went back to the loader's pool
    assert pool_after_first.pool_slots == 0
    second = iter(loader)
    next(second)
    inherited = second._inner.pool_slots
    assert inherited >= len(kept) + 1  # the first pass's buffers, held ones included, not new ones
    for _ in second:
        pass
    loader.set_epoch(0)
    for _ in loader:  # a third pass over the same buffers
        pass
    for batch, image, label in kept:  # nothing written into a buffer a batch still views
        assert torch.equal(batch["image"], image) and torch.equal(batch["label"], label)
    del kept
    gc.collect()


def test_the_kept_buffers_are_bounded_after_a_consumer_held_a_whole_epoch(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=4, prefetch=2, num_threads=2, pin_memory=False)
    held = list(loader)  # 26 batches, each viewing its own buffer
    assert len(held) == 26
    labels = [b["label"].clone() for b in held]
    del held
    gc.collect()
    it = iter(loader)
    batch = next(it)
    assert it._inner.pool_slots <= 2 + 2  # not the 26 buffers the first pass made
    again = [batch] + list(it)
    assert len(again) == 26
    assert sorted(torch.cat([b["label"] for b in again]).tolist()) == sorted(torch.cat(labels).tolist())


def test_two_live_passes_of_one_loader_never_share_buffers(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=4, prefetch=2, num_threads=2, pin_memory=False)
    list(loader)  # the loader keeps this pass's buffers
    kept = loader._slots.get()
    first = iter(loader)
    a = [next(first)]
    assert first._inner._pool is kept and loader._slots.get() is None  # lent to the running pass
    second = iter(loader)  # a new pass while the first still runs: buffers of its own
    b = [next(second)]
    assert second._inner._pool is not kept
    for x, y in zip(first, second):  # interleaved to the end: no "no free batch buffer", no overwrite
        a.append(x)
        b.append(y)
    a += list(first)
    b += list(second)
    for labels in ([x["label"] for x in a], [y["label"] for y in b]):
        assert torch.equal(torch.cat(labels), torch.arange(103) * 7)
    assert loader._slots.get() is not None  # given back when the passes closed


def test_the_first_batch_does_not_wait_for_the_whole_window(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=4, prefetch=8, num_threads=2, pin_memory=False, warm_up=False)
    it = iter(loader)
    next(it)
    assert it._inner.pool_slots <= 2  # two buffers made before the first batch, not eight
    next(it)
    assert it._inner.pool_slots >= 8  # then the window fills
    it.close()
    warm = ShardLoader(small_dataset, batch_size=4, prefetch=8, num_threads=2, pin_memory=False)
    assert warm._slots.get().total_slots == 9  # a warm-up made them all at construction: the pass makes none
    it = iter(warm)
    next(it)
    assert it._inner.pool_slots == 9
    it.close()


def test_batches_outlive_their_loader(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10)
    batch = next(iter(loader))
    expected = batch["label"].clone()
    del loader
    gc.collect()
    assert (batch["label"] == expected).all()


def test_gil_is_released_while_loading(small_dataset, slow_reads):
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1

    loader = slow_loader(small_dataset, slow_reads, delay_us=5000)
    thread = threading.Thread(target=count)
    thread.start()
    try:
        start = time.monotonic()
        before = counter[0]
        batches = sum(1 for _ in loader)
        elapsed = time.monotonic() - start
        progressed = counter[0] - before
    finally:
        stop.set()
        thread.join()
    assert batches == 26 and elapsed > 0.2
    # A thread blocked out by the GIL would count only during brief switches.
    assert progressed > 10_000, progressed
