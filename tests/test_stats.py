import time

import numpy as np
import pytest

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
