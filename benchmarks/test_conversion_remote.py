"""Conversion from object storage against the same conversion from a local folder (issue 27).

Run: ``pytest benchmarks/test_conversion_remote.py --benchmark-only -s`` (``FASTLOAD_BENCH_QUICK=1``
for a tiny run). The same folder of PNG scenes (3x512x512 uint8, smooth content) converted by
``preprocess_tiles`` (256-pixel tiles, zstd, ``--workers 2``, or on a Dask ``LocalCluster`` of 2 worker
processes: ``engine``) from its local path and from a moto S3
server on 127.0.0.1, in a process of its own (``--data-dir s3://...``: the listing, then each probe
and encode task copies its file), alternating, 3 rounds, best of each; the shards are compared byte
for byte each round.
Recorded: ``samples_per_s`` of the remote run, ``local_samples_per_s`` and ``ratio_to_local``.
moto serves from one Python process on the same 2 cores: the ratio is an upper bound of the cost.
Each source file is downloaded once: its probe's copy stays in the run's spool for its encode task.
"""

from __future__ import annotations

import filecmp
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from datasets import QUICK
from measure import EpochResult, MemorySampler, extra_info

from fastload.conversion.preprocess import build_parser, run

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
pytest.importorskip("obstore")
Image = pytest.importorskip("PIL.Image")
from s3_server import moto_process  # noqa: E402  (after the skips: it imports boto3)

BUCKET = "fastload-bench-input"
SCENES = 8 if QUICK else 64
ROUNDS = 1 if QUICK else 3
TILES_PER_SCENE = 4  # 512x512 scenes in 256-pixel tiles
SAMPLE_BYTES = 3 * 256 * 256


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """(local folder, its URL, storage_options): SCENES PNGs, uploaded to a moto server of this module."""
    folder = tmp_path_factory.mktemp("scenes")
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:512, 0:512]
    for i in range(SCENES):
        base = (y * (i + 1) // 7 + x // 3) % 256
        image = np.stack([base, (base + 85) % 256, (base * 3) % 256], axis=-1).astype(np.uint8)
        image = np.clip(image.astype(np.int16) + rng.integers(-3, 4, image.shape), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(folder / f"scene{i:03d}.png")
    with moto_process(BUCKET) as (_, client, options):
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"scenes/{path.name}")
        yield folder, f"s3://{BUCKET}/scenes", options



@pytest.fixture(scope="module")
def dask_client():
    """Yield a client of a ``LocalCluster`` of 2 worker processes of 1 thread each on 127.0.0.1."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


def timed_conversion(data_dir: str, out: Path, options: dict | None, client=None) -> float:
    if out.exists():
        shutil.rmtree(out)
    args = build_parser().parse_args(["--data-dir", data_dir, "--output-dir", str(out), "--tile-size", "256",
                                      "--codec", "zstd", "--workers", "2", "--no-progress"])
    if options is not None:
        args.storage_options = options
    start = time.perf_counter()
    results = run(args, client)
    seconds = time.perf_counter() - start
    assert sum(r.manifest.total for r in results) == SCENES * TILES_PER_SCENE
    return seconds


@pytest.mark.parametrize("engine", ["pool", "dask"])
def test_conversion_from_object_storage_vs_local(benchmark, scenes, tmp_path, capsys, request, engine):
    folder, url, options = scenes
    client = request.getfixturevalue("dask_client") if engine == "dask" else None
    benchmark.group = f"conversion-remote-input-{engine}"
    samples = SCENES * TILES_PER_SCENE
    local, remote = EpochResult(samples=samples), EpochResult(samples=samples)

    def round_() -> None:
        for result, source, opts, out in ((local, str(folder), None, tmp_path / "local"),
                                          (remote, url, options, tmp_path / "remote")):
            cpu0 = time.process_time()
            seconds = timed_conversion(source, out, opts, client)
            result.seconds.append(seconds)
            result.first_batch.append(seconds)  # a conversion delivers nothing usable before it ends
            result.cpu.append(time.process_time() - cpu0)  # this process's: the driver's share
        names = sorted(p.name for p in (tmp_path / "local").glob("*.lmdb"))
        _, differ, missing = filecmp.cmpfiles(tmp_path / "local", tmp_path / "remote", names, shallow=False)
        assert names and differ == [] and missing == []

    with capsys.disabled(), MemorySampler() as memory:
        benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=0)
    benchmark.extra_info.update(extra_info(remote, SAMPLE_BYTES, None, memory))
    local_rate = samples / min(local.seconds)
    ratio = benchmark.extra_info["samples_per_s"] / local_rate
    benchmark.extra_info.update({"local_samples_per_s": local_rate, "ratio_to_local": ratio,
                                 "source_mb": sum(p.stat().st_size for p in folder.iterdir()) / 1e6})
    print(f"\n{engine}: local {local_rate:,.0f} tiles/s, from s3 {benchmark.extra_info['samples_per_s']:,.0f} tiles/s, "
          f"s3/local {ratio:.2f}; rounds local {[round(s, 2) for s in local.seconds]} s, "
          f"s3 {[round(s, 2) for s in remote.seconds]} s")
