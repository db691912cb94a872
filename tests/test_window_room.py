"""reserve_room's accounting (storage/_window.py), without a server: what an eviction frees is what leaves the disk."""

from __future__ import annotations

import math

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
