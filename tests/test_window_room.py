"""The cache's room, without a server: reserve_room's accounting (storage/_window.py), what an eviction frees is
what leaves the disk; make_room's measure of the cache (storage/_room.py) while downloads are renamed."""

from __future__ import annotations

import math
import threading

from fastload.format._manifest import ShardInfo
from fastload.storage._locks import FileLock
from fastload.storage._window import reserve_room


def disk_bytes(version) -> int:
    return sum(p.stat().st_size for p in version.iterdir() if p.is_file() and not p.name.startswith("."))


def test_evicting_a_shard_whose_part_is_still_there_frees_nothing(tmp_path):
    """Shard 0 is whole and a download of it (its lock held) still has a reserved .part: evicting the whole
    copy leaves the .part's bytes, so the room for shard 2 must come from evicting shard 1 as well."""
    version = tmp_path / "cache" / "ds" / "v1"
    version.mkdir(parents=True)
    shards = [ShardInfo(f"shard-{i}.lmdb", 1, 100, "xxh3-128:0") for i in range(4)]
    (version / ".window").write_text("250")  # room for two shards
    for i in (0, 1):
        (version / shards[i].file).write_bytes(b"\0" * 100)
    (version / "shard-0.lmdb.part-1-2-3").write_bytes(b"\0" * 100)
    needs = {0: 10.0, 1: 5.0, 2: 1.0, 3: math.inf}
    with FileLock(version / ".shard-0.lmdb.lock", exclusive=True):  # that download is running: not stale
        part = version / "shard-2.lmdb.part-9-9-9"
        evicted = reserve_room(version, shards, 2, part, needs.__getitem__, lambda j: True, set())
    assert evicted == [0, 1]
    assert part.stat().st_size == 100
    assert disk_bytes(version) <= 250


def test_a_shard_fits_beside_what_the_window_holds(tmp_path):
    version = tmp_path / "cache" / "ds" / "v1"
    version.mkdir(parents=True)
    shards = [ShardInfo(f"shard-{i}.lmdb", 1, 100, "xxh3-128:0") for i in range(3)]
    (version / ".window").write_text("250")
    (version / shards[0].file).write_bytes(b"\0" * 100)
    part = version / "shard-1.lmdb.part-9-9-9"
    assert reserve_room(version, shards, 1, part, {0: 5.0, 1: 1.0, 2: 2.0}.__getitem__, lambda j: True, set()) == []
    assert disk_bytes(version) == 200
    no_room = version / "shard-2.lmdb.part-9-9-8"  # shard 0 and 1 are needed sooner than shard 2: nothing may go
    assert reserve_room(version, shards, 2, no_room, {0: 1.0, 1: 1.0, 2: 2.0}.__getitem__, lambda j: True,
                        {1}) is None
    assert not no_room.exists()


def test_a_download_renamed_while_the_cache_is_measured_never_widens_a_window(tmp_path, monkeypatch):
    """make_room measures the cache while other processes' downloads are renamed from their .part names
    (no lock is held for a rename). Wherever the rename falls among the file lookups of the measurement
    (each run renames just before its k-th ``os.stat``, for every k the measurement reaches), the room comes
    out right: a name listed before the rename and looked up after it is missed by the one walk, and a
    version's own bytes count at least at its window anyway. Two walks, one of the whole cache and one of
    the version, subtracted from each other, gave a window one shard larger than cache_limit (a cache over
    its limit) or one shard smaller."""
    import json
    import os

    from fastload.storage import _cache, _room

    real_stat = os.lstat
    at_stat = 0
    while True:
        at_stat += 1
        cache = tmp_path / f"cache-{at_stat}"
        version = cache / ("ds-" + "0" * 16) / ("1" * 16)
        version.mkdir(parents=True)
        shards = [{"file": f"shard-{i}.lmdb", "bytes": 100} for i in range(10)]
        (version / "manifest.json").write_text(json.dumps({"shards": shards}))
        (version / _cache.READERS_LOCK_NAME).touch()
        for i in range(3):
            (version / f"shard-{i}.lmdb").write_bytes(b"\0" * 100)
        part = version / "shard-3.lmdb.part-7-7-7"
        part.write_bytes(b"\0" * 100)  # another process's download, reserved at full size
        meta = (version / "manifest.json").stat().st_size + 32
        limit = 5 * 100 + meta + 40  # room for five shards: the dataset of ten is windowed
        calls = []
        me = threading.get_ident()

        def stat_after_rename(path, *args, _part=part, _calls=calls, _k=at_stat, _me=me, **kwargs):
            if threading.get_ident() == _me:  # os.lstat is patched for every thread: count the measurement's only
                _calls.append(path)
                if len(_calls) == _k and _part.exists():  # the download ends just before this lookup
                    os.rename(_part, _part.parent / "shard-3.lmdb")
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(_room.os, "lstat", stat_after_rename)
        outside = _room.committed_bytes(cache, leaving_out=version)  # what make_room leaves the version
        monkeypatch.undo()
        if at_stat > len(calls):  # every lookup of the measurement has had a rename just before it
            assert at_stat > 2
            break
        assert not part.exists()
        assert outside == 0, at_stat  # nothing lies outside the version: the whole limit is its, not a byte more
        assert _room.make_room(cache, version, limit) == limit  # windowed, with all the room until a reader claims
