"""Ranks that read one windowed remote dataset in step (a collective per step) never starve each other of room.

The failure this guards against (a rare failure of test_lightning_remote.py, seen with its evidence):
shuffle_window=1 over 2 ranks, so each rank's batch of 10 reads the 2 shards of the current windows,
and the version's window is the two ranks' claims, 4 shards. A rank's batches in flight pin their
shards until its consumer takes them, and a rank also holds the shards already here of the next batch
it cannot submit yet. Rank 0, having got batches 0 and 1 (Lightning's fetcher takes batch ``s + 1``
before step ``s``), held batch 2 and a shard of batch 3, 3 shards, more than the 2 it claimed; it had
evicted a shard of batch 1 once it had read it. Rank 1, which held the other shard of batch 1, found no
room for the evicted one: rank 0 held the rest, and would let go only once its consumer moved on, which
waited for rank 1 in the step's collective. After ``ROOM_WAIT_S`` plus the retry budget rank 1's reader
raised "no room in the cache for this shard" and rank 0 saw gloo's "Connection closed by peer".

Here the two ranks are two loaders in one process (file locks are per open file, so they exclude each
other as two processes' do), asked for their batches in an order a collective per step allows. Whether
rank 0 holds too much depends on which downloads end between two calls, so the start is tried
``STARTS`` times: without the cap on what a rank holds, about 1 start in 5 ran out of room. Against the
moto S3 server of tests/test_remote.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_remote import s3, same, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.storage import _fetcher

pytestmark = pytest.mark.slow  # tier: the moto S3 server

SHARDS, PER_SHARD, BATCH = 20, 10, 10
STARTS = 30


@pytest.fixture(scope="module")
def in_step(tmp_path_factory, s3):  # noqa: F811
    """20 shards of 10 samples (3x8x8 images, about 16 KB a shard), local and uploaded: (local path, URL)."""
    local = tmp_path_factory.mktemp("in-step") / "ds"
    rng = np.random.default_rng(5)
    images = rng.integers(0, 255, (SHARDS * PER_SHARD, 3, 8, 8), dtype=np.uint8)
    fastload.write_arrays(local, {"image": images, "label": np.arange(SHARDS * PER_SHARD)},
                          samples_per_shard=PER_SHARD)
    return local, upload(s3[1], local, "in-step")


def test_ranks_in_step_over_a_windowed_dataset_never_starve_each_other_of_room(in_step, s3, tmp_path,  # noqa: F811
                                                                                monkeypatch):
    local, url = in_step
    largest = max(p.stat().st_size for p in local.glob("*.lmdb"))
    limit = 2 * 2 * largest + 16384  # 2 ranks' claims of 2 shards (shuffle_window=1), the manifest and claims
    assert limit < SHARDS * largest  # windowed
    monkeypatch.setattr(_fetcher, "ROOM_WAIT_S", 1.0)  # a starved rank fails within seconds, not a minute
    common = {"batch_size": BATCH, "shuffle": True, "shuffle_window": 1, "seed": 7, "world_size": 2,
              "num_threads": 2}
    expected = [[dict(b) for b in fastload.ShardLoader(str(local), rank=r, **common)] for r in range(2)]
    for start in range(STARTS):
        loaders = [fastload.ShardLoader(url, rank=r, storage_options=s3[2], cache_dir=tmp_path / f"cache{start}",
                                        cache_limit=limit, **common) for r in range(2)]
        its = [iter(loader) for loader in loaders]
        got: list[list[dict]] = [[], []]
        for rank in (0, 1, 0, 1):  # batches 0 and 1 of each rank, before step 0's collective
            got[rank].append(dict(next(its[rank])))
        for _ in range(len(loaders[0]) - 2):  # then one batch each between two steps
            for rank in (0, 1):
                got[rank].append(dict(next(its[rank])))
        for rank in (0, 1):
            assert next(its[rank], None) is None
            assert same(got[rank], expected[rank]), (start, rank)
