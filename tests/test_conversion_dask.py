"""Conversion on a Dask cluster: write_dataset(client=...) and preprocess_tiles --scheduler.

A real cluster, started here (``LocalCluster``: a scheduler and 2 worker processes with a
nanny each, on 127.0.0.1), no mocks. Every output is compared byte for byte with the
one-machine run of the same inputs: every shard file, and the manifest apart from
``provenance.created`` (the one run-specific field).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import preprocess_two_classes

import fastload
from fastload.conversion._write_groups import GroupedOrder, group_samples_for
from fastload.errors import ArgumentError, ArgumentTypeError, ClusterError, PreprocessError

distributed = pytest.importorskip("distributed")

from fastload.conversion import _dask_map  # noqa: E402  (after the skip: needs no distributed, tested with it)

pytestmark = pytest.mark.slow  # tier: Dask clusters


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    from fastload.conversion import _convert

    monkeypatch.setattr(_convert, "CHUNK_BYTES", 20 * 3 * 16 * 16)  # about 20 samples per task


def tile(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 255, size=(3, 16, 16), dtype=np.uint8)


class Tiles:
    """A map-style dataset (it reaches the workers pickled, by reference to this module)."""

    def __init__(self, n: int = 300, seed: int = 0, fail_at: int | None = None,
                 die_once_at: int | None = None, marker: str | None = None) -> None:
        self.n, self.seed, self.fail_at, self.die_once_at, self.marker = n, seed, fail_at, die_once_at, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise OSError(f"disk gone at {i}")
        if i == self.die_once_at and self.marker and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)  # the worker process dies mid-task; its nanny restarts it and Dask reruns the task
        return {"image": tile(i + self.seed), "label": np.int64(i % 5), "weight": np.float32(i) / 3}


def streamed(n: int = 200):
    for i in range(n):
        yield {"image": tile(i), "label": np.int64(i % 3)}


def files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path, the manifests without their creation time."""
    found = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(out).as_posix()
        if p.name in ("manifest.json", "splits.json"):
            doc = json.loads(p.read_text())
            doc.get("provenance", {}).pop("created", None)
            found[rel] = json.dumps(doc, sort_keys=True).encode()
        else:
            found[rel] = p.read_bytes()
    return found


def assert_identical(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    assert any(name.endswith(".lmdb") for name in fa)
    for name in fa:
        assert fa[name] == fb[name], name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- write_dataset(client=...)


def test_map_style_dataset_on_the_cluster_is_byte_identical(tmp_path, client):
    for seed in (0, 1000):  # two datasets in a row on the same workers: each initializes them anew
        local, remote = tmp_path / f"local{seed}", tmp_path / f"dask{seed}"
        options = dict(codec={"image": "zstd-shuffle", "weight": "lz4"}, samples_per_shard=64, progress=False)
        m = fastload.write_dataset(Tiles(seed=seed), local, **options)
        d = fastload.write_dataset(Tiles(seed=seed), remote, client=client, **options)
        assert d.total == m.total == 300 and len(d.shards) == 5
        assert_identical(local, remote)
    assert files(tmp_path / "dask0") != files(tmp_path / "dask1000")


def test_iterable_on_the_cluster_is_byte_identical(tmp_path, client):
    fastload.write_dataset(streamed(), tmp_path / "local", codec="zstd", shard_size="20KB", progress=False)
    fastload.write_dataset(streamed(), tmp_path / "dask", codec="zstd", shard_size="20KB", progress=False,
                           client=client)
    assert_identical(tmp_path / "local", tmp_path / "dask")


def test_progress_names_the_dashboard(tmp_path, client, capsys):
    fastload.write_dataset(Tiles(40), tmp_path / "o", samples_per_shard=16, client=client)
    out = capsys.readouterr().out
    # The cluster asks for a dashboard (":0"); the scheduler serves one only with bokeh installed
    served = "dashboard http://" if importlib.util.find_spec("bokeh") else "no dashboard"
    assert f"dask: scheduler {client.scheduler.address}, 2 worker(s), 2 thread(s); {served}" in out


def test_a_worker_killed_mid_task_gives_the_same_bytes(tmp_path, client, cluster):
    marker = tmp_path / "died"
    fastload.write_dataset(Tiles(), tmp_path / "local", codec="zstd", samples_per_shard=64, progress=False)
    fastload.write_dataset(Tiles(die_once_at=130, marker=str(marker)), tmp_path / "dask", codec="zstd",
                           samples_per_shard=64, progress=False, client=client)
    assert marker.exists()  # a worker did die in a task, and the run went on
    assert_identical(tmp_path / "local", tmp_path / "dask")
    client.wait_for_workers(2, timeout=60)  # its nanny restarted it, for the tests after this one


_offset = {"value": None}


def _set_offset(value: int) -> None:
    _offset["value"] = value


def _slow_plus_offset(i: int) -> int:
    time.sleep(0.1)
    return i + _offset["value"]


def _die_soon() -> None:
    threading.Timer(0.05, os._exit, (1,)).start()  # after client.run has its answer


def test_the_workers_holding_the_dataset_die_and_the_map_goes_on(client):
    # Dask keeps one replica of a key (its active memory manager). The dataset sent to the workers must
    # survive the death of every worker that holds it: Dask computes it again, the map loses nothing.
    outcomes = _dask_map.dask_ordered_map(client, _slow_plus_offset, [(i,) for i in range(40)], _set_offset, (1000,))
    got = [next(outcomes)]
    holders = client.run_on_scheduler(
        lambda dask_scheduler: sorted(ws.address for key, ts in dask_scheduler.tasks.items()
                                      if str(key).startswith(_dask_map.INITARGS_KEY) for ws in ts.who_has))
    assert holders
    client.run(_die_soon, workers=holders)
    got += list(outcomes)
    assert got == [(i + 1000, None) for i in range(40)]
    client.wait_for_workers(2, timeout=60)


def test_a_dataset_that_does_not_pickle_is_refused_naming_why(tmp_path, client):
    with pytest.raises(ClusterError, match=r"to the Dask workers: TypeError: cannot pickle '_thread.lock'"):
        list(_dask_map.dask_ordered_map(client, _slow_plus_offset, [(1,)], _set_offset, (threading.Lock(),)))


def test_an_error_in_a_sample_is_the_same_as_locally(tmp_path, client):
    messages = []
    for kwargs in ({}, {"client": client}):
        with pytest.raises(PreprocessError) as caught:
            fastload.write_dataset(Tiles(fail_at=45), tmp_path / str(len(messages)), samples_per_shard=16,
                                   progress=False, **kwargs)
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "disk gone at 45" in messages[0]
    assert not (tmp_path / "1" / "manifest.json").exists()
    # The default order is shuffled: the shards before the one holding sample 45 are written and kept.
    order = GroupedOrder(0, None, 300, group_samples_for(3 * 16 * 16 + 8 + 4))  # a sample per source
    at = int(np.flatnonzero(order.samples(0, 300) == 45)[0])
    assert sorted(p.name for p in (tmp_path / "1").glob("*.lmdb")) == [f"shard-{k:05d}.lmdb" for k in range(at // 16)]


def test_client_with_workers_or_not_a_client_is_refused(tmp_path, client):
    with pytest.raises(ArgumentError, match="workers=2 with client="):
        fastload.write_dataset(Tiles(10), tmp_path / "a", samples_per_shard=4, workers=2, client=client)
    with pytest.raises(ArgumentTypeError, match="client must be a dask.distributed.Client, not str"):
        fastload.write_dataset(Tiles(10), tmp_path / "b", samples_per_shard=4, client="tcp://127.0.0.1:1")


def test_without_distributed_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    with pytest.raises(ClusterError, match=r'pip install "fastload\[dask\]"'):
        _dask_map.require_distributed()
    with pytest.raises(ClusterError, match=r'pip install "fastload\[dask\]"'):
        fastload.write_dataset(Tiles(10), "unused", samples_per_shard=4, client=object())


def test_closing_the_map_early_cancels_the_tasks_in_flight(client):
    def slow(i):
        time.sleep(0.2)
        return i

    outcomes = _dask_map.dask_ordered_map(client, slow, [(i,) for i in range(40)])
    assert next(outcomes) == (0, None)
    outcomes.close()
    deadline = time.monotonic() + 20
    left = -1
    while time.monotonic() < deadline:
        left = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        if left == 0:
            break
        time.sleep(0.1)
    assert left == 0


def test_results_come_in_input_order_with_errors_in_place(client):
    def task(i):
        time.sleep(0.05 * (i % 3))
        if i == 5:
            raise ValueError("five")
        return i * i

    got = list(_dask_map.dask_ordered_map(client, task, [(i,) for i in range(12)]))
    assert [r for r, _ in got] == [i * i if i != 5 else None for i in range(12)]
    assert isinstance(got[5][1], ValueError) and str(got[5][1]) == "five"


# --- preprocess_tiles --scheduler


@pytest.fixture(scope="module")
def image_dir(two_class_pngs) -> Path:
    return two_class_pngs


def preprocess(data: Path, out: Path, *extra: str):
    return preprocess_two_classes(data, out, *extra)


def test_preprocess_tiles_with_a_scheduler_address_is_byte_identical(tmp_path, image_dir, cluster):
    local = preprocess(image_dir, tmp_path / "local")
    remote = preprocess(image_dir, tmp_path / "dask", "--scheduler", cluster.scheduler_address)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert f"dask: scheduler {cluster.scheduler_address}, 2 worker(s)" in remote.stdout
    assert "samples/s" in remote.stdout and "MB/s decoded" in remote.stdout
    assert_identical(tmp_path / "local", tmp_path / "dask")
    assert (tmp_path / "dask" / "train" / "manifest.json").exists() and (tmp_path / "dask" / "splits.json").exists()


def test_preprocess_tiles_with_a_scheduler_file(tmp_path, image_dir, client):
    scheduler_file = tmp_path / "scheduler.json"
    scheduler_file.write_text(json.dumps({"address": client.scheduler.address}))
    local = preprocess(image_dir, tmp_path / "local")
    remote = preprocess(image_dir, tmp_path / "dask", "--scheduler", str(scheduler_file))
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert_identical(tmp_path / "local", tmp_path / "dask")


def test_a_bad_image_under_dask_is_skipped_or_named_as_locally(tmp_path, image_dir, cluster):
    data = tmp_path / "data"
    for p in image_dir.rglob("*.png"):
        (data / p.parent.name).mkdir(parents=True, exist_ok=True)
        (data / p.parent.name / p.name).write_bytes(p.read_bytes())
    whole = (data / "dogs" / "2.png").read_bytes()
    (data / "dogs" / "2.png").write_bytes(whole[: len(whole) // 2])
    local = preprocess(data, tmp_path / "local", "--skip-bad")
    remote = preprocess(data, tmp_path / "dask", "--skip-bad", "--scheduler", cluster.scheduler_address)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert "skipping dogs/2.png" in remote.stderr
    assert_identical(tmp_path / "local", tmp_path / "dask")
    skipped = [json.loads((tmp_path / "dask" / s / "manifest.json").read_text())["skipped"] for s in ("train", "val")]
    assert [s["path"] for part in skipped for s in part] == ["dogs/2.png"]

    refused = preprocess(data, tmp_path / "refused", "--scheduler", cluster.scheduler_address)
    assert refused.returncode == 1 and "1 unreadable image(s)" in refused.stderr
    assert str(data / "dogs" / "2.png") in refused.stderr


def test_an_unreachable_scheduler_is_a_typed_error_in_bounded_time(tmp_path, image_dir):
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ClusterError, match=f"cannot reach the Dask scheduler {address} within 1 s"):
        _dask_map.connect(address, timeout=1)
    proc = preprocess(image_dir, tmp_path / "o", "--scheduler", address, "--scheduler-timeout", "1")
    assert time.monotonic() - start < 60
    assert proc.returncode == 1 and f"preprocess_tiles: error: cannot reach the Dask scheduler {address}" in proc.stderr
    assert not (tmp_path / "o").exists()
    missing = preprocess(image_dir, tmp_path / "o", "--scheduler", str(tmp_path / "nowhere.json"))
    assert missing.returncode == 1 and "nowhere.json: no such scheduler file" in missing.stderr


def test_scheduler_options_are_checked(tmp_path, image_dir, cluster):
    both = preprocess(image_dir, tmp_path / "o", "--scheduler", cluster.scheduler_address, "--workers", "2")
    assert both.returncode == 2 and "--workers 2 with --scheduler" in both.stderr
    alone = preprocess(image_dir, tmp_path / "o", "--scheduler-timeout", "5")
    assert alone.returncode == 2 and "--scheduler-timeout needs --scheduler" in alone.stderr


class SlowTiles(Tiles):
    """Tiles that take a while each, so that a run is still going when its scheduler is stopped."""

    def __getitem__(self, i: int):
        time.sleep(0.02)
        return super().__getitem__(i)


def test_a_scheduler_lost_mid_run_is_a_typed_error_and_no_manifest(tmp_path):
    import threading

    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    stopper = threading.Timer(3.0, cluster.close)  # the scheduler (and its worker) go away mid-run
    start = time.monotonic()
    try:
        stopper.start()
        with pytest.raises(ClusterError, match="dask"):
            fastload.write_dataset(SlowTiles(2000), tmp_path / "o", samples_per_shard=64, progress=False,
                                   client=client)
    finally:
        stopper.cancel()
        stopper.join()  # closing the cluster a second time while the timer closes it fails inside Dask
        client.close()
        if cluster.status.name != "closed":
            cluster.close()
    assert time.monotonic() - start < 120  # a bounded time, not a hang
    assert not (tmp_path / "o" / "manifest.json").exists()  # nothing looks complete


@pytest.mark.parametrize("first_on_dask", [True, False], ids=["dask-then-local", "local-then-dask"])
def test_resume_across_a_local_and_a_dask_run_is_byte_identical(tmp_path, client, first_on_dask):
    options = dict(codec="zstd", samples_per_shard=16, progress=False)
    fastload.write_dataset(Tiles(), tmp_path / "whole", **options)
    out = tmp_path / "resumed"
    with pytest.raises(PreprocessError, match="disk gone at 150"):  # the first run stops part way
        fastload.write_dataset(Tiles(fail_at=150), out, client=client if first_on_dask else None, **options)
    kept = sorted(p.name for p in out.glob("shard-*.lmdb"))
    assert kept and not (out / "manifest.json").exists()
    fastload.write_dataset(Tiles(), out, resume=True, client=None if first_on_dask else client, **options)
    assert_identical(tmp_path / "whole", out)
