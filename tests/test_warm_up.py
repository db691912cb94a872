"""A loader's warm-up before its first pass (``warm_up=True``, loading/_warm_up.py).

From construction until the first pass, a native thread faults in that pass's batch buffers and maps the
shard pages the page cache holds. What a user can rely on: the same batches with or without it, at any
thread count and whenever the pass starts; a first pass that no longer faults those pages; nothing left
running after ``del``, at interpreter exit or in a forked child; errors of a bad dataset where they always were.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import kernel_has_populate

import fastload
from fastload import ShardLoader
from fastload.errors import FastloadError
from fastload.loading import _warm_up

needs_populate = pytest.mark.skipif(not kernel_has_populate(), reason="needs Linux 5.14+ (madvise MADV_POPULATE_*)")


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> Path:
    """1,500 raw 3x64x64 tiles in 3 shards (18 MB): enough pages that faulting them is counted in thousands."""
    from conftest import smooth_images

    out = tmp_path_factory.mktemp("warm") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(1500, (3, 64, 64)), "label": np.arange(1500, dtype=np.int64)},
                          samples_per_shard=500)
    for shard in out.glob("*.lmdb"):
        shard.read_bytes()  # in the page cache, as the files of a dataset read before
    return out


def _labels(loader) -> list[list[int]]:
    return [b["label"].tolist() for b in loader]


def _images(loader) -> list:
    return [b["image"].clone() for b in loader]


def _wait_done(loader, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        warm = loader._warm_up.stats()
        if warm["done"]:
            return warm
        time.sleep(0.01)
    raise AssertionError(f"the warm-up did not finish in {timeout} s: {loader._warm_up.stats()}")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_batches_with_and_without_a_warm_up_whenever_the_pass_starts(tiles, threads):
    def loader(**kw):
        return ShardLoader(tiles, batch_size=64, shuffle=True, seed=3, num_threads=threads, **kw)

    cold = _images(loader(warm_up=False))
    at_once = _images(loader())  # the pass stops the warm-up almost before it began
    warm = loader()
    _wait_done(warm)
    finished = _images(warm)
    assert len(cold) == len(at_once) == len(finished) == 24
    assert all(a.equal(b) and a.equal(c) for a, b, c in zip(cold, at_once, finished))


def _resident_fraction(buffer: np.ndarray) -> float:
    """Return the fraction of ``buffer``'s whole pages that are in memory (mincore)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = buffer.ctypes.data
    first, last = (start + page - 1) // page * page, (start + buffer.nbytes) // page * page
    pages = (last - first) // page
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(last - first), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) / pages


def _mapped_bytes_of(directory: Path) -> int:
    """Return how much of this process's mappings of files under ``directory`` is mapped in (smaps ``Rss``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
            inside = len(head) >= 6 and head[5].startswith(str(directory))
        elif inside and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


@needs_populate
def test_a_finished_warm_up_leaves_the_first_pass_its_buffers_faulted_in_and_shards_mapped(tiles, tmp_path):
    import shutil

    copy = tmp_path / "copy"  # files no other loader of this process has open (shard sets are shared)
    shutil.copytree(tiles, copy)
    shard_bytes = sum(p.stat().st_size for p in copy.glob("*.lmdb"))
    assert _mapped_bytes_of(copy) == 0
    loader = ShardLoader(copy, batch_size=64, shuffle=True, seed=1, num_threads=2)
    done = _wait_done(loader)
    assert done["supported"]
    pool = loader._slots.get()
    assert pool.total_slots == loader.prefetch + 1  # the window and the batch the loop holds, added ahead
    buffer = loader._warm_up._buffer
    assert buffer.nbytes == done["prefaulted_bytes"] == (loader.prefetch + 1) * pool.slot_bytes
    assert _resident_fraction(buffer) == 1.0  # every page of the buffers faulted in
    assert done["mapped_bytes"] >= shard_bytes // 2  # the shards' cached pages (all of them, copied just now)
    assert _mapped_bytes_of(copy) >= shard_bytes // 2  # as this process's page tables say

    expected = _labels(ShardLoader(tiles, batch_size=64, shuffle=True, seed=1, num_threads=2, warm_up=False))
    assert _labels(loader) == expected
    assert loader._slots.get().total_slots == loader.prefetch + 1  # the pass added no buffer of its own
    s = loader.stats()
    assert s["warm_up_prefaulted_bytes"] == done["prefaulted_bytes"] and s["warm_up_mapped_bytes"] > 0
    assert s["warm_up_s"] > 0


@needs_populate
def test_a_loader_without_warm_up_maps_nothing_before_its_first_pass(tiles, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiles, copy)
    loader = ShardLoader(copy, batch_size=64, num_threads=2, warm_up=False)
    time.sleep(0.2)
    assert _mapped_bytes_of(copy) == 0 and loader._slots.get() is None and "warm_up_s" not in loader.stats()


@needs_populate
def test_what_the_warm_up_left_the_waiting_consumer_faults_in_where_a_core_is_idle(tiles, slow_reads, monkeypatch):
    from fastload.loading import _loader

    slow_reads(2000)  # the batches are never ready: the consumer has time to fault in what is left
    monkeypatch.setattr(_loader, "usable_cores", lambda: 4)  # 1 thread on 4 cores: the consumer's core is idle
    real = _warm_up._native

    def stopped_at_once(*args):  # as if the pass began at once: the thread does at most its first step
        warmer = real.Warmer(*args)
        warmer.stop(wait=False)
        return warmer

    monkeypatch.setattr(_warm_up, "_native", SimpleNamespace(Warmer=stopped_at_once))
    loader = ShardLoader(tiles, batch_size=256, num_threads=1)
    labels = _labels(loader)
    s = loader.stats()
    slot_bytes = loader._slots.get().slot_bytes
    # Between them the buffers reserved ahead (the pass added none: the pool had enough) but the slot the pool
    # hands out first, which the first batch's worker writes at once; each page once: the consumer starts where
    # the warm-up's last step ends (a step it skipped on seeing the stop is left out).
    handed_over = loader.prefetch * slot_bytes
    warmed, waited = s["warm_up_prefaulted_bytes"], s["prefaulted_bytes"]
    assert handed_over - (2 << 20) <= min(warmed, handed_over) + waited <= handed_over, s
    assert warmed <= 2 << 20 and waited >= handed_over - (4 << 20), s
    assert labels == [list(range(i, min(i + 256, 1500))) for i in range(0, 1500, 256)]


def test_a_dataset_that_cannot_be_opened_raises_where_it_always_did(tiles, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiles, bad)
    shard = sorted(bad.glob("*.lmdb"))[1]
    data = bytearray(shard.read_bytes())
    data[:8192] = bytes(8192)  # its meta pages zeroed: the size the manifest says, not a shard any more
    shard.write_bytes(bytes(data))
    loader = ShardLoader(bad, batch_size=64, num_threads=2)  # no warm-up, and no error yet
    assert loader._warm_up is None
    with pytest.raises(FastloadError) as raised:
        next(iter(loader))
    without = ShardLoader(bad, batch_size=64, num_threads=2, warm_up=False)
    with pytest.raises(FastloadError) as again:
        next(iter(without))
    assert type(raised.value) is type(again.value) and str(raised.value) == str(again.value)
    assert shard.name in str(raised.value)


def test_a_shard_replaced_after_construction_is_read_as_the_new_file(tiles, tmp_path):
    """The warm-up's open shards are the first pass's only while the files are unchanged."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiles, copy)
    loader = ShardLoader(copy, batch_size=100, num_threads=2)
    _wait_done(loader)
    shard = sorted(copy.glob("*.lmdb"))[0]
    data = bytearray(shard.read_bytes())
    shard.unlink()
    shard.write_bytes(bytes(data[:8192]))  # a new file (another inode) in its place, truncated
    with pytest.raises(FastloadError) as raised:
        list(loader)
    assert shard.name in str(raised.value)


def test_one_open_shard_set_per_process_while_the_files_are_unchanged(tiles, tmp_path):
    """Loaders over the same files share one native shard set; a file replaced since gets a new one."""
    import shutil

    from fastload.loading._native_backend import open_shards

    copy = tmp_path / "copy"
    shutil.copytree(tiles, copy)
    first = open_shards(fastload.ShardDataset(copy))
    assert open_shards(fastload.ShardDataset(copy)) is first
    shard = sorted(copy.glob("*.lmdb"))[0]
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data)  # the same bytes in a new file (another inode)
    assert open_shards(fastload.ShardDataset(copy)) is not first


def test_del_and_a_finished_pass_join_the_warm_up_thread(tiles):
    from conftest import thread_count, without_leftover_downloads

    without_leftover_downloads()
    before = thread_count()
    for _ in range(5):
        loader = ShardLoader(tiles, batch_size=64, num_threads=2)
        del loader  # mid warm-up: the destructor stops and joins it
    assert thread_count() == before
    loader = ShardLoader(tiles, batch_size=64, num_threads=2)
    it = iter(loader)
    next(it)  # the pass asked it to stop without waiting: it ends after its step in flight
    assert loader._warm_up is not None
    for _ in it:
        pass
    assert loader._warm_up is None and "warm_up_s" in loader.stats() and thread_count() == before  # joined
    loader = ShardLoader(tiles, batch_size=64, num_threads=2)
    for i, _ in enumerate(loader):
        if i == 1:
            break  # an abandoned pass joins it too
    assert loader._warm_up is None and thread_count() == before


def test_the_torch_backend_and_a_warm_up_turned_off_start_none(tiles):
    assert ShardLoader(tiles, batch_size=64, backend="torch", num_workers=0)._warm_up is None
    assert ShardLoader(tiles, batch_size=64, warm_up=False)._warm_up is None


def _run(body: str, dataset: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    code = "import os, sys, time\nimport fastload\n" + f"PATH = {str(dataset)!r}\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_the_interpreter_exits_cleanly_with_a_warm_up_running(tiles):
    proc = _run("""
        loaders = [fastload.ShardLoader(PATH, batch_size=64, num_threads=2) for _ in range(4)]
        keep = loaders[0]  # module globals: finalized with the interpreter, after atexit joined their threads
        print("built", flush=True)
    """, tiles, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "built" in proc.stdout and "terminate called" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
def test_a_child_forked_during_the_warm_up_reads_the_same_batches(tiles):
    proc = _run("""
        loader = fastload.ShardLoader(PATH, batch_size=64, shuffle=True, seed=5, num_threads=2)
        pid = os.fork()
        if pid == 0:
            labels = [b["label"].tolist() for b in loader]  # the parent's warm-up thread does not exist here
            print("child", sum(labels, [])[:5], len(labels), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        labels = [b["label"].tolist() for b in loader]
        print("parent", sum(labels, [])[:5], len(labels), "child status", status, flush=True)
    """, tiles, timeout=60)
    assert proc.returncode == 0, proc.stderr
    child = [line for line in proc.stdout.splitlines() if line.startswith("child")]
    parent = [line for line in proc.stdout.splitlines() if line.startswith("parent")]
    assert child and parent and "child status 0" in parent[0], proc.stdout + proc.stderr
    assert child[0].split(" ", 1)[1] == parent[0].split(" ", 1)[1].rsplit(" child", 1)[0], proc.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
def test_a_forked_child_hands_its_consumer_nothing_of_the_parents_warm_up(tiles):
    proc = _run("""
        from fastload.loading import _loader
        _loader.usable_cores = lambda: 4  # 1 thread on 4 cores: a consumer that would take what is left
        loader = fastload.ShardLoader(PATH, batch_size=256, num_threads=1)
        loader._warm_up.stop(wait=False)
        pid = os.fork()
        if pid == 0:
            left = loader._warm_up.unfaulted()
            labels = [b["label"].tolist() for b in loader]
            s = loader.stats()
            own = (loader.prefetch + 1) * loader._slots.get().slot_bytes  # the most its own new pool holds
            print("child", len(left), s["prefaulted_bytes"] <= own, len(labels), "warm_up_s" in s, flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("parent", len(loader._warm_up.unfaulted()) > 0, "status", status, flush=True)
    """, tiles, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # The child gets no region of the parent's buffers (its pool is a new one), its consumer faults in only its
    # own, and its stats carry no warm-up; the parent still has its regions to hand over.
    assert "child 0 True 6 False" in proc.stdout and "parent True status 0" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0, reason="needs root, to become another user")
def test_mapping_is_left_alone_where_the_kernel_would_not_say_which_pages_are_cached(tmp_path):
    """Linux 5.0+: mincore says every page is cached for a file the caller neither owns nor may write."""
    owned = tmp_path / "owned.bin"
    owned.write_bytes(b"x" * 8192)
    owned.chmod(0o644)
    tmp_path.chmod(0o755)
    assert _warm_up.page_cache_visible(owned)  # root: the privilege to act as any owner
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)  # nobody: neither the owner nor allowed to write
            code = 0 if not _warm_up.page_cache_visible(owned) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not _warm_up.page_cache_visible(tmp_path / "missing.bin")
