"""A remote dataset larger than its cache: read a window of shards at a time, within cache_limit, the same batches.

Against the moto S3 server of tests/test_remote.py. The promise: with ``cache_limit`` a fraction of the
dataset, ``shuffle_window=K`` (and ``shuffle=False``) give bitwise the local copy's batches, epoch after
epoch and from a resumed state, while the cache's bytes (downloads in flight included) never exceed the
limit, a shard is never evicted under a reader (another process's included), and orders whose working
set cannot fit are refused at construction naming the window that fits.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_remote import batches, s3, same, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.errors import ArgumentError, RemoteError
from fastload.storage._cache import boot_id

pytestmark = pytest.mark.slow  # tier: the moto S3 server and processes sharing a windowed cache


@pytest.fixture(scope="module")
def big(tmp_path_factory, s3):  # noqa: F811
    """16 shards of 50 samples (raw 3x32x32 images: about 160 KB a shard), local and uploaded."""
    local = tmp_path_factory.mktemp("window") / "ds"
    rng = np.random.default_rng(3)
    images = rng.integers(0, 255, (800, 3, 32, 32), dtype=np.uint8)
    fastload.write_arrays(local, {"image": images, "label": np.arange(800) % 10}, samples_per_shard=50)
    return local, upload(s3[1], local, "window")


# What a reading process (python -c, its ShardLoader named ``loader``) prints: two_epoch_digest of its batches.
TWO_EPOCH_DIGEST = (
    "import hashlib\n"
    "h = hashlib.sha256()\n"
    "for epoch in range(2):\n"
    "    loader.set_epoch(epoch)\n"
    "    for b in loader:\n"
    "        h.update(b['image'].numpy().tobytes()); h.update(b['label'].numpy().tobytes())\n"
    "print(h.hexdigest())\n")


def two_epoch_digest(loader) -> str:
    """Return the digest of the images and labels of two epochs of ``loader`` (as TWO_EPOCH_DIGEST prints it)."""
    h = hashlib.sha256()
    for epoch in range(2):
        loader.set_epoch(epoch)
        for b in loader:
            h.update(b["image"].numpy().tobytes())
            h.update(b["label"].numpy().tobytes())
    return h.hexdigest()


def shard_bytes(local: Path) -> tuple[int, int]:
    """Return (all shards' bytes, the largest shard's)."""
    sizes = [p.stat().st_size for p in local.glob("*.lmdb")]
    return sum(sizes), max(sizes)


class CacheWatch:
    """Sample the cache's bytes (every file, .part files at their reserved size) in a thread; keep the peak.

    ``peak_files`` is what made up the peak (name and size of each file): an assertion names them.
    """

    def __init__(self, cache: Path) -> None:
        self.cache, self.peak, self._stop = cache, 0, threading.Event()
        self.peak_files: list[tuple[str, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def size(self) -> tuple[int, list[tuple[str, int]]]:
        sizes, files = {}, []  # by inode: a file renamed while the directory is listed is seen under both names
        # os.walk, not Path.rglob: eviction deletes folders while they are listed, and rglob raises for a folder
        # gone between finding and listing it (CI: FileNotFoundError in this thread); os.walk skips it
        for folder, _, names in os.walk(self.cache):
            for name in names:
                p = Path(folder, name)
                try:
                    st = p.stat()
                except OSError:  # removed meanwhile
                    continue
                if stat.S_ISREG(st.st_mode):
                    sizes[(st.st_dev, st.st_ino)] = st.st_size
                    files.append((str(p.relative_to(self.cache)), st.st_size))
        return sum(sizes.values()), files

    def _sample(self) -> None:
        total, files = self.size()
        if total > self.peak:
            self.peak, self.peak_files = total, files

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak

    def over(self, limit: int) -> tuple:
        """Return what to show when the peak passed ``limit``: the figures and the files at the peak."""
        return self.peak, limit, [f for f in self.peak_files if f[1] > 0]


@pytest.mark.parametrize(("order", "reading"), [({"shuffle": True, "shuffle_window": 1}, {"num_threads": 1}),
                                                ({"shuffle": True, "shuffle_window": 2}, {"num_threads": 2}),
                                                ({"shuffle": False}, {"num_threads": 2}),
                                                ({"shuffle": True, "shuffle_window": 2},
                                                 {"backend": "torch", "num_workers": 2}),
                                                ({"shuffle": True, "shuffle_window": 1},
                                                 {"backend": "torch", "num_workers": 0})])
def test_a_dataset_larger_than_its_cache_gives_the_local_batches_within_the_limit(big, s3, tmp_path, order,  # noqa: F811
                                                                                     reading):
    local, url = big
    full, largest = shard_bytes(local)
    shards_in_room = 2 * order.get("shuffle_window", 1)
    limit = shards_in_room * largest + largest // 2 + 8192  # the shards the order needs, and a manifest
    assert limit < full / 2
    cache = tmp_path / "cache"
    loader = fastload.ShardLoader(url, batch_size=32, seed=5, storage_options=s3[2], cache_dir=cache,
                                  cache_limit=limit, **order, **reading)
    expected = fastload.ShardLoader(str(local), batch_size=32, seed=5, **order)
    assert loader.dataset._cached.window is not None  # windowed: it cannot be held whole
    watch = CacheWatch(cache)
    for epoch in range(2):
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        assert same(batches(loader), batches(expected)), epoch
    peak = watch.stop()
    assert peak <= limit, watch.over(limit)
    assert not list(cache.rglob("*.part-*"))


def test_shards_are_evicted_and_fetched_again_by_the_next_epoch(big, s3, tmp_path):  # noqa: F811
    local, url = big
    full, largest = shard_bytes(local)
    cache = tmp_path / "cache"
    loader = fastload.ShardLoader(url, batch_size=32, shuffle=True, shuffle_window=1, seed=1, storage_options=s3[2],
                                  cache_dir=cache, cache_limit=2 * largest + 8192)
    version = loader.dataset._cached.path
    seen: set[str] = set()
    for _ in loader:
        seen |= {p.name for p in version.glob("*.lmdb")}
        assert len(list(version.glob("*.lmdb"))) <= 2
    assert len(seen) == 16  # every shard was here at some point, never more than 2 at once


def test_a_resumed_windowed_run_gives_the_rest_of_the_epoch(big, s3, tmp_path):  # noqa: F811
    local, url = big
    _, largest = shard_bytes(local)
    kwargs = {"batch_size": 32, "shuffle": True, "shuffle_window": 2, "seed": 9}
    first = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "a",
                                 cache_limit=4 * largest + 8192, **kwargs)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.state_dict()
    del it
    resumed = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "b",  # another, empty cache
                                   cache_limit=5 * largest + 8192, **kwargs)
    resumed.load_state_dict(state)
    expected = fastload.ShardLoader(str(local), **kwargs)
    assert same(batches(resumed), batches(expected)[7:])


def test_orders_that_cannot_fit_are_refused_naming_the_window_that_fits(big, s3, tmp_path):  # noqa: F811
    local, url = big
    _, largest = shard_bytes(local)
    common = {"batch_size": 32, "storage_options": s3[2], "cache_dir": tmp_path, "cache_limit": 6 * largest + 8192}
    with pytest.raises(ArgumentError, match=r"shuffle=True reads every shard.*shuffle_window=3"):
        fastload.ShardLoader(url, shuffle=True, **common)
    with pytest.raises(ArgumentError, match=r"shuffle_window=5 needs room for 10 shards.*shuffle_window=3 fits"):
        fastload.ShardLoader(url, shuffle=True, shuffle_window=5, **common)
    with pytest.raises(ArgumentError, match=r"weights sampling reads every shard"):
        fastload.ShardLoader(url, sample_weights=np.ones(800), **common)
    loader = fastload.ShardLoader(url, shuffle=True, shuffle_window=3, **common)  # what the errors offer works
    assert sum(len(b["label"]) for b in loader) == 800


def test_two_processes_share_a_windowed_cache_and_never_evict_what_the_other_reads(big, s3, tmp_path):  # noqa: F811
    """Ranks 0 and 1 of 2 on one node, one cache smaller than the dataset: each gets its local batches.

    Nothing keeps the two in step (no collective between them), so the room is 2 shuffle windows' worth
    (2 K shards) for each of them: the documented need of processes that read at their own pace.
    """
    local, url = big
    _, largest = shard_bytes(local)
    cache = tmp_path / "cache"
    limit = 2 * 4 * largest + 16384
    script = (
        "import fastload, pickle, sys, hashlib\n"
        "options, rank = pickle.loads(bytes.fromhex(sys.argv[1])), int(sys.argv[2])\n"
        f"loader = fastload.ShardLoader({url!r}, batch_size=16, shuffle=True, shuffle_window=2, seed=4, rank=rank,\n"
        f"    world_size=2, storage_options=options, cache_dir={str(cache)!r}, cache_limit={limit})\n"
        + TWO_EPOCH_DIGEST)
    watch = CacheWatch(cache)
    procs = [subprocess.Popen([sys.executable, "-c", script, pickle.dumps(s3[2]).hex(), str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    peak = watch.stop()
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
    for rank, (out, _) in enumerate(outs):
        loader = fastload.ShardLoader(str(local), batch_size=16, shuffle=True, shuffle_window=2, seed=4, rank=rank,
                                      world_size=2)
        assert out.strip() == two_epoch_digest(loader), rank
    assert peak <= limit, watch.over(limit)


def test_a_windowed_dataset_in_forked_dataloader_workers_reads_every_sample_within_the_limit(big, s3, tmp_path):  # noqa: F811
    """A user's own DataLoader over a windowed ShardDataset: forked workers fetch through fresh interpreters,
    each holding one shard at a time, evicting by recent use; every sample is right and the bound holds."""
    local, url = big
    _, largest = shard_bytes(local)
    cache = tmp_path / "cache"
    limit = 4 * largest + 16384
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    assert dataset._cached.window is not None
    watch = CacheWatch(cache)
    loader = torch.utils.data.DataLoader(dataset, batch_size=50, num_workers=2,
                                         multiprocessing_context="fork")
    labels = torch.cat([b["label"] for b in loader])
    peak = watch.stop()
    assert labels.tolist() == list(np.arange(800) % 10)
    assert peak <= limit, watch.over(limit)


def test_a_windowed_dataset_in_a_concat_with_a_local_one_gives_the_local_batches(big, s3, tmp_path):  # noqa: F811
    local, url = big
    _, largest = shard_bytes(local)
    remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "cache",
                                   cache_limit=4 * largest + 8192)
    kwargs = {"batch_size": 40, "shuffle": True, "shuffle_window": 2, "seed": 6}
    for parts in ([remote, str(local)], [str(local), remote]):
        got = fastload.ShardLoader(fastload.concat(parts), **kwargs)
        expected = fastload.ShardLoader(fastload.concat([str(local), str(local)]), **kwargs)
        for epoch in range(2):
            got.set_epoch(epoch)
            expected.set_epoch(epoch)
            assert same(batches(got), batches(expected)), (parts, epoch)
    with pytest.raises(ArgumentError, match="shuffle=True reads every shard"):
        fastload.ShardLoader(fastload.concat([remote, str(local)]), batch_size=40, shuffle=True)


def test_loaders_made_one_after_another_leave_no_callbacks_behind(big, s3, tmp_path):  # noqa: F811
    """A script that builds a loader per epoch over one remote dataset: the fetcher keeps only live readers'."""
    import gc

    local, url = big
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path)
    for _ in range(5):
        loader = fastload.ShardLoader(dataset, batch_size=100)
        next(iter(loader))
        del loader
        gc.collect()
    fetcher = dataset._cached.fetcher
    live = fastload.ShardLoader(dataset, batch_size=100)
    next(iter(live))
    # Dead readers' callbacks are dropped when the next reader registers. One may outlive that by a moment
    # (a download thread still attaching a shard holds its reader until the attach returns), never more.
    for callbacks in (fetcher._listeners, fetcher._releasers):
        assert sum(owner() is not None for owner, _ in callbacks) == 1 and len(callbacks) <= 2, callbacks


def test_a_killed_reader_leaves_nothing_the_next_one_trusts_or_counts_for_long(big, s3, tmp_path):  # noqa: F811
    """kill -9 mid-epoch (downloads in flight, shards held): the next process reads every batch right, within the
    limit; the dead one's reserved .part files are cleaned when their room is needed."""
    import os
    import signal

    local, url = big
    _, largest = shard_bytes(local)
    cache = tmp_path / "cache"
    limit = 4 * largest + 8192
    script = (
        "import fastload, pickle, sys\n"
        "options = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        f"loader = fastload.ShardLoader({url!r}, batch_size=16, shuffle=True, shuffle_window=2, seed=2,\n"
        f"    storage_options=options, cache_dir={str(cache)!r}, cache_limit={limit})\n"
        "for i, b in enumerate(loader):\n"
        "    if i == 20:\n"
        "        print('reading', flush=True)\n"
        "        import time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, pickle.dumps(s3[2]).hex()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "reading", proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()  # reaped, its pipes closed
    version = next(cache.rglob("manifest.json")).parent
    stale = version / "shard-00003.lmdb.part-999999-1-1"  # and one a crashed download left at full size
    with open(stale, "wb") as f:
        f.truncate(largest)
    watch = CacheWatch(cache)
    loader = fastload.ShardLoader(url, batch_size=16, shuffle=True, shuffle_window=2, seed=2, storage_options=s3[2],
                                  cache_dir=cache, cache_limit=limit)
    expected = fastload.ShardLoader(str(local), batch_size=16, shuffle=True, shuffle_window=2, seed=2)
    assert same(batches(loader), batches(expected))
    # the .part made here without room for it may put the cache a shard over until its room is needed
    assert watch.stop() <= limit + largest, watch.over(limit + largest)
    assert not stale.exists()


def test_a_server_that_dies_mid_epoch_of_a_windowed_dataset_is_a_typed_error_soon(big, tmp_path):
    """Shards come and go in a windowed epoch, so a dead server meets a reader soon: a RemoteError naming the URL,
    within the retries' bound, never a hang or a short epoch."""
    from test_remote import mortal_server, short_retries

    local, _ = big
    _, largest = shard_bytes(local)
    server, endpoint, url = mortal_server(local, "window-dies")
    loader = fastload.ShardLoader(url, batch_size=16, shuffle=True, shuffle_window=1, seed=1,
                                  storage_options=short_retries(endpoint), cache_dir=tmp_path,
                                  cache_limit=2 * largest + 8192)
    delivered = 0
    with pytest.raises(RemoteError, match="s3://fastload-tests/window-dies/shard-"):
        for _ in loader:
            delivered += 1
            if delivered == 3:
                server.stop()
                started = time.monotonic()
    assert 3 <= delivered < 50  # 800 samples are 50 batches: the epoch did not end short and silently
    assert time.monotonic() - started < 60


def test_a_windowed_dataset_in_a_concat_of_other_layouts_reads_its_share_of_each_batch(big, s3, tmp_path):  # noqa: F811
    """A concat whose datasets store records differently reads a group per layout, in sub-batches of varying size:
    the windowed group's plan counts its own batches, so its room is made and the batches are the local ones."""
    local, url = big
    _, largest = shard_bytes(local)
    other = tmp_path / "zstd"
    source = fastload.ShardDataset(local)
    arrays = source.read_batch(range(len(source)))
    fastload.write_arrays(other, {k: v.numpy() for k, v in arrays.items()}, codec={"image": "zstd"},
                          samples_per_shard=50)
    remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "cache",
                                   cache_limit=4 * largest + 8192)
    assert not fastload.concat([str(other), remote]).same_layout
    kwargs = {"batch_size": 64, "shuffle": True, "shuffle_window": 2, "seed": 4}
    got = fastload.ShardLoader(fastload.concat([str(other), remote]), **kwargs)
    expected = fastload.ShardLoader(fastload.concat([str(other), str(local)]), **kwargs)
    watch = CacheWatch(tmp_path / "cache")
    started = time.monotonic()
    assert same(batches(got), batches(expected))
    assert time.monotonic() - started < 30  # no wait for room that never comes
    assert watch.stop() <= 4 * largest + 8192, watch.over(4 * largest + 8192)


def test_a_windowed_dataset_indexed_after_a_pass_makes_room_by_recent_use(big, s3, tmp_path):  # noqa: F811
    """After a loader's pass the fetcher still has that pass's plan: a direct read of a shard outside it is read now,
    not refused room for 60 s."""
    local, url = big
    _, largest = shard_bytes(local)
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path, cache_limit=2 * largest + 8192)
    loader = fastload.ShardLoader(dataset, batch_size=50, shuffle=True, shuffle_window=1, seed=0, rank=0,
                                  world_size=2)  # this rank's plan reads about half the shards
    for _ in loader:
        pass
    started = time.monotonic()
    assert [int(dataset[i]["label"]) for i in range(0, 800, 7)] == [i % 10 for i in range(0, 800, 7)]
    assert time.monotonic() - started < 30


@pytest.mark.skipif(boot_id() is None, reason="no boot id on this platform: downloads are fsynced instead")
def test_after_a_restart_a_windowed_versions_shards_are_dropped_not_trusted(big, s3, tmp_path):  # noqa: F811
    """A windowed version's shards come and go: after a restart (another boot id) they are deleted, then fetched."""
    local, url = big
    _, largest = shard_bytes(local)
    kwargs = {"batch_size": 32, "shuffle": True, "shuffle_window": 1, "seed": 4}
    cache = tmp_path / "cache"
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, cache_limit=2 * largest + 8192,
                                  **kwargs)
    expected = batches(fastload.ShardLoader(str(local), **kwargs))
    assert same(batches(loader), expected)
    version = loader.dataset._cached.path
    kept = sorted(version.glob("*.lmdb"))
    assert kept  # the last window stays after the pass
    for path in kept:  # torn by a power loss: same size, zeroed
        path.write_bytes(bytes(path.stat().st_size))
    del loader
    gc.collect()
    (cache / ".fastload-boot").write_text("an-earlier-boot")
    again = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, cache_limit=2 * largest + 8192,
                                 **kwargs)
    assert not list(version.glob("*.lmdb")) and not list(version.glob(".*.unverified"))
    assert same(batches(again), expected)
