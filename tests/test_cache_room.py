"""Room in one bounded cache shared by several datasets and processes: by need, not by who came first.

Against the moto S3 server of tests/test_remote.py. A windowed dataset (larger than its room) holds the
room its order needs (``2 K`` shards for ``shuffle_window=K``), claimed by its loader, not all the room
there is: datasets and processes that fit together all run, in any order of opening, with the local
copy's batches and the cache within ``cache_limit``; one that does not fit waits for the holders to let
go, then names them. The cache's own marker files take no room.
"""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from test_remote import batches, s3, same, upload  # noqa: F401  (s3: the module's server fixture)
from test_remote_window import TWO_EPOCH_DIGEST, CacheWatch, shard_bytes, two_epoch_digest

import fastload
from fastload.errors import RemoteError
from fastload.storage import _room

pytestmark = pytest.mark.slow  # tier: the moto S3 server and processes sharing a cache

META = 16384  # room for a version's own files (its manifest), generously


@pytest.fixture(scope="module")
def pair(tmp_path_factory, s3):  # noqa: F811
    """Two datasets of 12 shards of 40 samples (raw 3x32x32: about 125 KB a shard), local and uploaded."""
    made = []
    for k in range(2):
        local = tmp_path_factory.mktemp(f"room{k}") / "ds"
        rng = np.random.default_rng(10 + k)
        fastload.write_arrays(local, {"image": rng.integers(0, 255, (480, 3, 32, 32), dtype=np.uint8),
                                      "label": (np.arange(480) + k) % 10}, samples_per_shard=40)
        made.append((local, upload(s3[1], local, f"room{k}")))
    return made


def window_loader(source: str, s3=None, cache: Path | None = None, limit: int | None = None,  # noqa: F811
                  window: int = 1, **kwargs) -> fastload.ShardLoader:
    remote = {} if s3 is None else {"storage_options": s3[2], "cache_dir": cache, "cache_limit": limit}
    return fastload.ShardLoader(source, batch_size=20, shuffle=True, shuffle_window=window, seed=3, **remote,
                                **kwargs)


def epochs(loader, n: int = 2) -> list:
    out = []
    for epoch in range(n):
        loader.set_epoch(epoch)
        out += batches(loader)
    return out


@pytest.mark.parametrize("backend", [{}, {"backend": "torch", "num_workers": 2}], ids=["native", "torch-workers"])
def test_two_windowed_datasets_share_one_limit_by_their_need(pair, s3, tmp_path, backend):  # noqa: F811
    """Each dataset is larger than the limit; room for both windows (2 shards each) is all there is.

    Before claims, the first took all the room and the second was refused at once ("leaves 0 bytes").
    The torch backend's worker processes read within the same claims."""
    (local_a, url_a), (local_b, url_b) = pair
    _, largest = shard_bytes(local_a)
    cache = tmp_path / "cache"
    limit = 2 * (2 * largest + META)
    watch = CacheWatch(cache)
    a = window_loader(url_a, s3, cache, limit, **backend)
    b = window_loader(url_b, s3, cache, limit, **backend)
    assert a.dataset._cached.window is not None and b.dataset._cached.window is not None
    got_a, got_b = [], []
    for epoch in range(2):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for x, y in zip(a, b):  # both read at once
            got_a.append(dict(x))
            got_b.append(dict(y))
    peak = watch.stop()
    assert same(got_a, epochs(window_loader(str(local_a))))
    assert same(got_b, epochs(window_loader(str(local_b))))
    assert peak <= limit, watch.over(limit)


def test_a_dataset_that_fits_whole_opens_after_a_windowed_one(pair, s3, tmp_path, small_dataset):  # noqa: F811
    """A resumed Lightning run opens its train split (windowed) before its val split (small): both run."""
    (local, url), _ = pair
    _, largest = shard_bytes(local)
    val_local = small_dataset
    val_url = upload(s3[1], val_local, "room-val")
    val_bytes = sum(p.stat().st_size for p in val_local.iterdir() if p.is_file())
    cache = tmp_path / "cache"
    limit = 2 * 2 * largest + META + val_bytes + META
    train = window_loader(url, s3, cache, limit, window=2)
    val = fastload.ShardLoader(val_url, batch_size=8, storage_options=s3[2], cache_dir=cache, cache_limit=limit)
    assert val.dataset._cached.window is None  # whole: the train split holds only what its window needs
    assert same(batches(val), batches(fastload.ShardLoader(str(val_local), batch_size=8)))
    assert same(epochs(train), epochs(window_loader(str(local), window=2)))


def test_four_processes_over_two_windowed_datasets_all_run_within_the_limit(pair, s3, tmp_path):  # noqa: F811
    """Two processes per dataset, none in step with another: each claims its 2 shards, and all four fit."""
    _, largest = shard_bytes(pair[0][0])
    cache = tmp_path / "cache"
    limit = 4 * 2 * largest + 2 * META
    script = (
        "import fastload, pickle, sys, hashlib\n"
        "options, url, seed = pickle.loads(bytes.fromhex(sys.argv[1])), sys.argv[2], int(sys.argv[3])\n"
        "loader = fastload.ShardLoader(url, batch_size=20, shuffle=True, shuffle_window=1, seed=seed,\n"
        f"    storage_options=options, cache_dir={str(cache)!r}, cache_limit={limit})\n"
        + TWO_EPOCH_DIGEST)
    runs = [(k, seed) for k in range(2) for seed in (1, 2)]
    watch = CacheWatch(cache)
    procs = [subprocess.Popen([sys.executable, "-c", script, pickle.dumps(s3[2]).hex(), pair[k][1], str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, seed in runs]
    outs = [p.communicate(timeout=300) for p in procs]
    peak = watch.stop()
    assert [p.returncode for p in procs] == [0] * 4, [e[-3000:] for _, e in outs]
    for (k, seed), (out, _) in zip(runs, outs):
        local = fastload.ShardLoader(str(pair[k][0]), batch_size=20, shuffle=True, shuffle_window=1, seed=seed)
        assert out.strip() == two_epoch_digest(local), (k, seed)
    assert peak <= limit, watch.over(limit)


def test_a_dataset_that_does_not_fit_waits_then_names_every_holder(pair, s3, tmp_path, monkeypatch):  # noqa: F811
    (local_a, url_a), (_, url_b) = pair
    _, largest = shard_bytes(local_a)
    cache = tmp_path / "cache"
    limit = 2 * 3 * largest + 2 * largest + 2 * META  # a window of 3 and one of 1, not one of 3 and one of 2
    monkeypatch.setattr(_room, "ROOM_WAIT_S", 1.0)
    holder = window_loader(url_a, s3, cache, limit, window=3)
    held = holder.dataset._cached.path
    with pytest.raises(RemoteError, match=rf"needs .* bytes for its readers' windows.*datasets in use hold the rest: "
                                          rf"{held.parent.name}/{held.name} \([0-9]+ bytes\).*waited 1 s"):
        window_loader(url_b, s3, cache, limit, window=2)
    assert same(batches(window_loader(url_b, s3, cache, limit, window=1)),  # what fits runs beside it
                batches(window_loader(str(pair[1][0]), window=1)))
    del holder


def test_a_waiting_dataset_runs_once_the_holder_lets_go(pair, s3, tmp_path, monkeypatch):  # noqa: F811
    (local_a, url_a), (local_b, url_b) = pair
    _, largest = shard_bytes(local_a)
    cache = tmp_path / "cache"
    limit = 2 * 3 * largest + 2 * META
    monkeypatch.setattr(_room, "ROOM_WAIT_S", 60.0)
    holder = window_loader(url_a, s3, cache, limit, window=3)
    assert len(batches(holder)) == 24

    def let_go() -> None:
        nonlocal holder
        holder = None
        gc.collect()

    timer = threading.Timer(1.0, let_go)
    timer.start()
    try:
        waited = window_loader(url_b, s3, cache, limit, window=3)  # waits for the holder's room
    finally:
        timer.join()
    assert same(batches(waited), batches(window_loader(str(local_b), window=3)))


def test_the_caches_own_files_take_no_room(pair, s3, tmp_path):  # noqa: F811
    """cache_limit set exactly to a dataset's documented room holds it whole; a byte less windows it."""
    local, url = pair[0]
    shards = sum(p.stat().st_size for p in local.glob("*.lmdb"))
    room = shards + (local / "manifest.json").stat().st_size + 32  # its shards, its manifest, its .window
    exact = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "cache", cache_limit=room)
    assert exact._cached.window is None
    assert any(p.name.startswith(".fastload-") and p.stat().st_size for p in (tmp_path / "cache").iterdir())
    del exact
    gc.collect()
    short = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "other", cache_limit=room - 1)
    assert short._cached.window is not None


def test_a_second_loader_over_one_dataset_grows_its_claim_without_counting_the_first(pair, s3, tmp_path):  # noqa: F811
    """Two loaders over one ShardDataset: the second's larger claim replaces the first's, which is not counted twice."""
    local, url = pair[0]
    _, largest = shard_bytes(local)
    limit = 5 * largest + META  # room for a window of 2 (4 shards), not for 2 + 4 shards
    dataset = fastload.ShardDataset(url, storage_options=s3[2], cache_dir=tmp_path / "cache", cache_limit=limit)
    first = fastload.ShardLoader(dataset, batch_size=20, shuffle=True, shuffle_window=1, seed=3)
    second = fastload.ShardLoader(dataset, batch_size=20, shuffle=True, shuffle_window=2, seed=3)
    assert dataset._cached._claimed == 2 * 2 * largest
    assert len(list((tmp_path / "cache").rglob(".claim-*"))) == 1
    assert same(batches(second), batches(window_loader(str(local), window=2)))
    del first
