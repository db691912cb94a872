import time

import numpy as np
import pytest
from conftest import kernel_has_populate

import fastload
from fastload import ShardLoader


@pytest.fixture(scope="module")
def zstd_tiles(tmp_path_factory):
    from conftest import smooth_images

    out = tmp_path_factory.mktemp("tiles") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(64, (3, 64, 64)), "label": np.arange(64, dtype=np.int64)},
                          codec={"image": "zstd"})
    return out


def test_stats_count_what_was_delivered(zstd_tiles):
    loader = ShardLoader(zstd_tiles, batch_size=8, num_threads=2)
    list(loader)
    s = loader.stats()
    assert s["batches"] == 8 and s["samples"] == 64
    assert s["bytes_decoded"] == 64 * (3 * 64 * 64 + 8)
    assert s["decompress_s"] > 0 and s["read_s"] > 0 and s["copy_s"] >= 0
    assert 0 <= s["wait_share"] <= 1 and s["ready_batches"] == 0 and s["num_threads"] == 2
    loader.reset_stats()
    assert loader.stats()["bottleneck"] is None


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_samples_count_the_plan_since_the_last_reset(zstd_tiles, backend):
    """The samples counter is the plan's (the short last batch included), from the last reset_stats()."""
    loader = ShardLoader(zstd_tiles, batch_size=10, backend=backend)  # 64 samples: 6 batches of 10 and one of 4
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert loader.stats()["samples"] == 30
    loader.reset_stats()
    assert loader.stats()["samples"] == 0 and loader.stats()["batches"] == 0
    rest = list(it)
    assert len(rest) == 4 and loader.stats()["samples"] == 34 == sum(len(b["label"]) for b in rest)
    assert loader.stats()["batches"] == 4
    dropped = ShardLoader(zstd_tiles, batch_size=10, backend=backend, drop_last=True)
    list(dropped)
    assert dropped.stats()["samples"] == 60
    for rank in range(3):  # a rank of 3: ceil(64 / 3) = 22 positions, the last one padded, in batches of 10
        ranked = ShardLoader(zstd_tiles, batch_size=10, backend=backend, rank=rank, world_size=3)
        got = list(ranked)
        assert ranked.stats()["samples"] == 22 == sum(len(b["label"]) for b in got)
    loader = ShardLoader(zstd_tiles, batch_size=10, backend=backend)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    resumed = ShardLoader(zstd_tiles, batch_size=10, backend=backend)
    resumed.load_state_dict(state)
    got = list(resumed)
    assert resumed.stats()["samples"] == 44 == sum(len(b["label"]) for b in got)


def test_a_slow_read_stage_is_named_the_bottleneck(zstd_tiles, slow_reads):
    slow_reads(3000)
    loader = ShardLoader(zstd_tiles, batch_size=8, num_threads=2)
    list(loader)
    s = loader.stats()
    assert s["bottleneck"] == "read" and s["wait_share"] > 0.5 and s["read_s"] > 0.15


def test_a_slow_training_step_makes_the_consumer_the_bottleneck(zstd_tiles):
    loader = ShardLoader(zstd_tiles, batch_size=8, num_threads=2)
    for _ in loader:
        time.sleep(0.03)
    s = loader.stats()
    assert s["bottleneck"] == "consumer" and s["wait_share"] < 0.1


@pytest.mark.skipif(not kernel_has_populate(), reason="needs Linux 5.14+ (madvise MADV_POPULATE_WRITE)")
def test_a_waiting_consumer_faults_fresh_batch_buffers_in_where_a_core_is_idle(zstd_tiles, slow_reads, monkeypatch):
    from fastload.loading import _loader

    slow_reads(2000)  # the batches are never ready when asked for: the consumer has time to fault every slot in
    monkeypatch.setattr(_loader, "usable_cores", lambda: 4)  # 1 thread on 4 cores: the consumer's core is idle
    # No warm-up: its thread would fault some of the same slots in first (tests/test_warm_up.py: the two together)
    loader = ShardLoader(zstd_tiles, batch_size=8, num_threads=1, shuffle=False, warm_up=False)
    first = [b["image"].clone() for b in loader]
    slot_bytes = 8 * (3 * 64 * 64 + 8)
    s = loader.stats()
    assert s["prefaulted_bytes"] >= 4 * slot_bytes  # the first two slots, then the rest of the window
    assert s["wait_s"] >= s["prefault_s"] > 0  # time spent waiting for data, as the wait itself
    second = [b["image"].clone() for b in loader]  # the pool's slots again: nothing fresh to fault in
    assert loader.stats()["prefaulted_bytes"] == 0
    assert len(first) == len(second) == 8 and all(a.equal(b) for a, b in zip(first, second))

    monkeypatch.setattr(_loader, "usable_cores", lambda: 1)  # as many threads as cores: the workers fault them
    busy = ShardLoader(zstd_tiles, batch_size=8, num_threads=1, shuffle=False)
    assert all(a.equal(b["image"]) for a, b in zip(first, busy))
    assert busy.stats()["prefaulted_bytes"] == 0


def test_stats_while_running_and_for_the_torch_backend(zstd_tiles):
    loader = ShardLoader(zstd_tiles, batch_size=8)
    it = iter(loader)
    next(it)
    assert loader.stats()["batches"] == 1
    torch_loader = ShardLoader(zstd_tiles, batch_size=8, backend="torch", num_workers=0)
    list(torch_loader)
    s = torch_loader.stats()
    assert s["backend"] == "torch" and s["samples"] == 64 and s["bottleneck"] in ("consumer", "loader")


def test_waiting_mostly_on_copies_names_h2d_the_bottleneck():
    from fastload.loading._epoch import summarize_stats

    base = {"batches": 10, "wall_s": 1.0, "wait_s": 0.8, "read_s": 0.3, "decompress_s": 0.1, "copy_s": 0.1}
    assert summarize_stats({**base, "copy_wait_s": 0.6}, "native")["bottleneck"] == "h2d"
    assert summarize_stats({**base, "copy_wait_s": 0.1}, "native")["bottleneck"] == "read"
