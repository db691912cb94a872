"""``predownload``: how far a remote dataset's downloads run ahead of the reader.

Against the moto S3 server of tests/test_remote.py, through its fault proxy (which records every
request). The promise: with ``predownload=K`` a pass never has more than the shards its batches
in flight read plus ``K`` downloaded (or downloading), whatever the backend; ``"all"`` fetches the
whole epoch ahead; the batches are bitwise the local copy's for every bound, ``0`` (each shard when
a batch needs it) included; bad values are typed errors.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_remote import batches, proxy, s3, same, tiles  # noqa: F401  (the module's server fixtures)

import fastload
from fastload.errors import ArgumentError, ArgumentTypeError

pytestmark = pytest.mark.slow  # tier: the moto S3 server

SHARD_SAMPLES = 64  # tests/test_remote.py's tiles: 700 samples, 11 shards of 64
SHARDS = 11


def shard_gets(fp) -> set[str]:
    """Return the shard objects the proxy has been asked for (GET)."""
    return {k.rsplit("/", 1)[-1] for k in fp.seen if k.startswith("GET ") and k.endswith(".lmdb")}


def fetched_after_first_batch(url: str, options: dict, cache, fp, **kwargs) -> tuple[set[str], list]:
    """Take one batch of a sequential pass (batch b reads shard b), wait, and return the shards asked for meanwhile.

    Then read the rest of the pass: (the shards asked for after the pause, every batch of the pass).
    """
    fp.seen.clear()
    loader = fastload.ShardLoader(url, batch_size=SHARD_SAMPLES, storage_options=options, cache_dir=cache, **kwargs)
    it = iter(loader)
    first = next(it)
    time.sleep(1.5)  # a download of one of these shards takes milliseconds: whatever may be fetched now is
    asked = shard_gets(fp)
    return asked, [dict(first)] + batches(it)


@pytest.mark.parametrize("reading", [{"num_threads": 1, "prefetch": 2},
                                     {"backend": "torch", "num_workers": 0}],
                         ids=["native", "torch-main-process"])
def test_downloads_stay_within_predownload_shards_of_the_reader(tiles, proxy, tmp_path, reading):  # noqa: F811
    local, url = tiles
    fp, options = proxy
    expected = batches(fastload.ShardLoader(str(local), batch_size=SHARD_SAMPLES))
    # The batches submitted by then read shards 0 to 2 at most (the first, and prefetch=2 behind it;
    # the torch backend's main process reads one batch at a time): 2 more are allowed ahead.
    asked, got = fetched_after_first_batch(url, options, tmp_path / "bounded", fp, predownload=2, **reading)
    in_flight = 3 if reading.get("backend") != "torch" else 1
    assert {"shard-00000.lmdb"} <= asked <= {f"shard-{k:05d}.lmdb" for k in range(in_flight + 2)}, sorted(asked)
    assert same(got, expected)
    asked, got = fetched_after_first_batch(url, options, tmp_path / "all", fp, predownload="all", **reading)
    assert len(asked) == SHARDS, sorted(asked)  # no bound: the whole epoch while the reader waits
    assert same(got, expected)


def test_predownload_zero_fetches_each_shard_when_a_batch_needs_it(tiles, proxy, tmp_path):  # noqa: F811
    local, url = tiles
    fp, options = proxy
    asked, got = fetched_after_first_batch(url, options, tmp_path / "c", fp, predownload=0, num_threads=2,
                                           prefetch=1)
    assert asked <= {"shard-00000.lmdb", "shard-00001.lmdb"}, sorted(asked)
    assert same(got, batches(fastload.ShardLoader(str(local), batch_size=SHARD_SAMPLES)))
    assert len(shard_gets(fp)) == SHARDS  # every shard once, none twice
    assert all(n == 1 for k, n in fp.seen.items() if k.endswith(".lmdb"))


def test_workers_of_the_torch_backend_are_fetched_for_ahead_of_the_main_process(tiles, proxy, tmp_path):  # noqa: F811
    """The workers read prefetch_factor batches each ahead of what the main process was handed: that lead counts."""
    local, url = tiles
    fp, options = proxy
    asked, got = fetched_after_first_batch(url, options, tmp_path / "c", fp, predownload=1, backend="torch",
                                           num_workers=2, prefetch_factor=2)
    # position 1 (one batch handed over), a lead of 2 workers x 2 batches, then 1 shard more
    assert {"shard-00000.lmdb"} <= asked <= {f"shard-{k:05d}.lmdb" for k in range(1 + 4 + 1)}, sorted(asked)
    assert same(got, batches(fastload.ShardLoader(str(local), batch_size=SHARD_SAMPLES)))


@pytest.mark.parametrize("predownload", [0, 1, 3, "auto", "all"])
def test_every_bound_gives_the_local_batches_shuffled_and_resumed(tiles, s3, tmp_path, predownload):  # noqa: F811
    local, url = tiles
    kwargs = {"batch_size": 50, "shuffle": True, "shuffle_window": 2, "seed": 5, "num_threads": 2}
    expected = batches(fastload.ShardLoader(str(local), **kwargs))
    loader = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "c", predownload=predownload,
                                  **kwargs)
    it = iter(loader)
    head = [dict(next(it)) for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "other",
                                   predownload=predownload, **kwargs)
    resumed.load_state_dict(state)
    assert same(head + batches(resumed), expected)


def test_shard_dataset_takes_predownload_and_bad_values_are_typed_errors(tiles, s3, tmp_path):  # noqa: F811
    local, url = tiles
    ds = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "c", predownload=4)
    assert np.array_equal(ds[650]["image"].numpy(), fastload.ShardDataset(str(local))[650]["image"].numpy())
    for bad, error in [(-1, ArgumentError), ("some", ArgumentTypeError), (True, ArgumentTypeError),
                       (2.5, ArgumentTypeError)]:
        with pytest.raises(error, match="predownload"):
            fastload.ShardLoader(url, storage_options=s3[2], cache_dir=tmp_path / "c", predownload=bad)
    with pytest.raises(ArgumentError, match="predownload"):  # a local dataset downloads nothing
        fastload.ShardLoader(str(local), predownload=2)
    with pytest.raises(ArgumentError, match="predownload"):
        fastload.ShardDataset(str(local), predownload=2)


@pytest.mark.parametrize("predownload", [0, 1])
def test_a_tight_bound_in_a_concat_and_a_mix_with_a_local_dataset_gives_the_local_batches(tiles, s3, tmp_path,  # noqa: F811
                                                                                          predownload):
    """The bound counts a remote dataset's own shards, wherever its samples fall in a composed epoch."""
    local, url = tiles
    kwargs = {"batch_size": 100, "shuffle": True, "seed": 8, "num_threads": 2}
    for backend in ("native", "torch"):
        remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / f"{backend}-c",
                                       predownload=predownload)
        both = fastload.concat([str(local), remote])
        expected = fastload.concat([str(local), str(local)])
        assert same(batches(fastload.ShardLoader(both, backend=backend, **kwargs)),
                    batches(fastload.ShardLoader(expected, backend=backend, **kwargs))), backend
        remote = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / f"{backend}-m",
                                       predownload=predownload)
        mixed = fastload.mix([remote, str(local)], weights=[0.5, 0.5], stop="all_exhausted")
        reference = fastload.mix([str(local), str(local)], weights=[0.5, 0.5], stop="all_exhausted")
        assert same(batches(fastload.ShardLoader(mixed, fields=["label"], backend=backend, **kwargs)),
                    batches(fastload.ShardLoader(reference, fields=["label"], backend=backend, **kwargs))), backend
