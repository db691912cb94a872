"""The windowed cache's policy pieces, checked against plain readings: NeedPlan and the room accounting."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from fastload.format._manifest import ShardInfo
from fastload.storage._window import NeedPlan, _held


@pytest.mark.parametrize("seed", range(5))
def test_next_need_is_the_first_batch_from_the_position_that_reads_the_shard(seed):
    rng = np.random.default_rng(seed)
    shards, batch = int(rng.integers(1, 12)), int(rng.integers(1, 9))
    reads = rng.integers(-1, shards, int(rng.integers(0, 200)))  # -1: another dataset's sample
    plan = NeedPlan(reads, np.arange(len(reads)) // batch, shards)
    sizes = rng.integers(1, 100, shards)
    for shard in range(shards):
        for position in range(0, len(reads) // batch + 2):
            later = [k // batch for k, s in enumerate(reads) if s == shard and k // batch >= position]
            assert plan.next_need(shard, position) == (min(later) if later else math.inf)
    for position in range(0, len(reads) // batch + 1):
        horizon = position + int(rng.integers(0, 4))
        read = {s for k, s in enumerate(reads) if s >= 0 and position <= k // batch <= horizon}
        assert plan.bytes_needed_by(position, horizon, sizes) == sum(int(sizes[s]) for s in read)


def test_room_counts_whole_shards_and_reservations_at_full_size(tmp_path):
    shards = [ShardInfo(file=f"shard-{i:05d}.lmdb", count=1, bytes=100 * (i + 1), hash="") for i in range(4)]
    (tmp_path / "manifest.json").write_bytes(b"x" * 7)
    (tmp_path / shards[0].file).write_bytes(b"a" * 100)
    with open(tmp_path / (shards[2].file + f".part-{os.getpid()}-1-2"), "wb") as f:
        f.truncate(300)
    (tmp_path / "notes.txt").write_bytes(b"y" * 1000)  # not fastload's: not counted
    used, present, parts = _held(tmp_path, shards, {s.file: i for i, s in enumerate(shards)})
    assert (used, present, parts) == (7 + 100 + 300, {0}, {2})
