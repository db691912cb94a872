"""Format 4 (records packed into ~1 MiB blocks) against format 3 (one record per LMDB key): bytes and reads (issue 44).

Run: ``pytest benchmarks/test_bytes.py --benchmark-only -s`` (``FASTLOAD_BENCH_QUICK=1``: smaller counts,
the peers and the fresh processes on the 3 KB case only: about 20 s). docs/benchmarks.md,
"Bytes on disk (format 4)", has the numbers.

``test_bytes_on_disk``: the same samples written as format 3 (as fastload wrote them before v4:
``RecordEncoder(fields, version=3)`` and ``write_shard``, one record per key, written here by
:func:`write_v3`) and as format 4 (``fastload.write_arrays``), for records of 64 B (one 16-byte field),
264 B, 3 KB (3x32x32 uint8 + int64 label: the issue's case), 49 KB (3x128x128 uint8 tiles), 100 KB
and 1 MiB (uint8 vectors + label), and zstd-compressed 3x64x64 images whose noise varies per sample
(records of about 0.3 to 12 KB); the 64 B samples also at ``write_arrays``' default 1,024 samples a
shard (reported, not held to the goal: each LMDB file pays about 12 KiB of its own). And, where
installed, the same samples in Streaming's MDS and in LitData's chunks (benchmarks/bytes_helper.py).
Per case: the payload (the samples' decoded bytes), the records (their encoded bytes: what the
shards hold), the shard files of each format (manifests and index files apart: a few KB), and the
ratios. Asserted, since sizes do not depend on the machine: format 4 at most 1.03 times the records
for records of 64 B to 64 KB, and never larger than format 3.

``test_read_steady``: ``ShardLoader`` (native, shuffled, batch 256, 2 threads) over both formats of
the 3 KB records and of the tiles in one process, epochs alternating between them (v3 first in
even rounds, v4 first in odd ones) after a warm-up epoch each; per round v4's samples/s over v3's:
their median and range. ``test_read_threads``: format 4's 3 KB records with 8 and 16 threads
against 2, rounds of 8 epochs (one epoch is about 20 ms) rotating the three.

``test_first_epoch_fresh``: a fresh process (benchmarks/bytes_epoch_helper.py) builds a loader over
one format and iterates its first epochs, the formats alternating, in three settings: the files in
the page cache (read just before), out of it, and out of it with ``warm_up=False``. Out of the page
cache: ``posix_fadvise(DONTNEED)`` on every file of the dataset, which leaves other processes' cache
alone, unlike ``/proc/sys/vm/drop_caches`` (the pages still resident afterwards are counted with
``fincore`` where it exists). The warm-up maps every shard page in the loader's constructor, so the
figure compared is samples over the constructor's seconds plus the first epoch's (the first epoch's
own rate is recorded too); expected from the bytes saved: format 3's file bytes over format 4's.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bytes_helper
import lmdb
import numpy as np
import pytest
from conftest import BATCH, SEED
from datasets import QUICK
from measure import EpochResult, MemorySampler, extra_info, run_epoch

import fastload
from fastload.conversion._shard_writer import dataset_id, write_shard
from fastload.format._blocks import unpack_block
from fastload.format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from fastload.format._record import Field, RecordEncoder

GOAL = 1.03  # format 4's shards over their records, records of 64 B to 64 KB
CHILD = Path(__file__).with_name("bytes_epoch_helper.py")


@dataclass(frozen=True)
class Case:
    """One kind of sample: its uint8 fields (with an int64 ``label`` when ``label``), counts, shard size, goal."""

    name: str
    fields: tuple[tuple[str, tuple[int, ...]], ...]
    label: bool
    full: int
    quick: int
    per_shard: int
    codec: str = "raw"  # the codec of the field "image"
    goal: str = "records"  # "records": v4 <= GOAL x records (and <= v3); "v3": v4 <= v3; "none": reported only
    peers: bool = True

    @property
    def count(self) -> int:
        return self.quick if QUICK else self.full

    @property
    def payload_per_sample(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.fields) + (8 if self.label else 0)


CASES = [
    Case("64B", (("x", (16,)),), False, 50_000, 20_000, 65_536),
    Case("64B-1024-per-shard", (("x", (16,)),), False, 50_000, 20_000, 1_024, goal="none", peers=False),
    Case("264B", (("image", (184,)),), True, 50_000, 10_000, 65_536),
    Case("3KB", (("image", (3, 32, 32)),), True, 50_000, 4_000, 4_096),
    Case("49KB-tile", (("image", (3, 128, 128)),), True, 10_000, 200, 4_096),
    Case("100KB", (("image", (102_320,)),), True, 2_000, 40, 256, goal="v3"),
    Case("1MiB", (("image", (1_048_496,)),), True, 64, 4, 16, goal="v3"),
    Case("zstd-var", (("image", (3, 64, 64)),), True, 10_000, 1_000, 4_096, codec="zstd"),
]
BY_NAME = {c.name: c for c in CASES}


def make_arrays(case: Case) -> dict[str, np.ndarray]:
    """Return the case's samples (seed 0): random bytes, or for zstd images whose noise varies per sample."""
    rng = np.random.default_rng(0)
    n = case.count
    arrays = {}
    for name, shape in case.fields:
        if case.codec == "zstd" and name == "image":
            arrays[name] = variable_images(rng, n, shape)
        else:
            arrays[name] = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    if case.label:
        arrays["label"] = rng.integers(0, 1000, size=n).astype(np.int64)
    return arrays


def variable_images(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Bands of a few levels with noise on a per-sample share of the pixels (0.1% to all of them).

    zstd makes records of about 0.3 to 12 KB of them (3x64x64: mean 3.6 KB).
    """
    c, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((n, c, h, w), dtype=np.uint8)
    for start in range(0, n, 500):
        m = min(500, n - start)
        fx, fy = rng.uniform(0.02, 0.2, size=(2, m, 1, 1, 1)).astype(np.float32)
        base = 128 + 32 * np.round(3 * np.sin(xx * fx + yy * fy))
        share = (10 ** rng.uniform(-3, 0, size=(m, 1, 1, 1))).astype(np.float32)
        noisy = rng.random((m, c, h, w), dtype=np.float32) < share
        noise = rng.normal(0, 20, size=(m, c, h, w)).astype(np.float32) * noisy
        out[start:start + m] = np.clip(base + noise, 0, 255).astype(np.uint8)
    return out


def write_v3(out: Path, fields: list[Field], arrays: dict[str, np.ndarray], per_shard: int) -> int:
    """Write ``arrays`` as a format 3 dataset (one record per key, as before v4); return the records' bytes."""
    out.mkdir(parents=True)
    ident = dataset_id(fields, f"benchmarks/test_bytes.py format 3 {out.name}", [])
    encoder = RecordEncoder(fields, version=3)
    n = len(next(iter(arrays.values())))
    shards, record_bytes = [], 0
    for index, start in enumerate(range(0, n, per_shard)):
        records = [encoder.encode({name: a[i] for name, a in arrays.items()}) for i in range(start, min(n, start
                                                                                                       + per_shard))]
        record_bytes += sum(len(r) for r in records)
        shards.append(write_shard(out, index, records, (fields, ident)))
    manifest = Manifest(fields, shards, {"tool": "benchmarks/test_bytes.py"}, format_version=3, dataset_id=ident)
    write_json_atomic(out / MANIFEST_NAME, manifest.to_json())
    return record_bytes


def v4_records(path: Path) -> tuple[int, int]:
    """Return (the records' bytes, the number of blocks) of a format 4 dataset, read from its blocks."""
    manifest = fastload.ShardDataset(path).manifest
    assert manifest.format_version == 4
    total = blocks = 0
    for shard in manifest.shards:
        env = lmdb.open(str(path / shard.file), subdir=False, readonly=True, lock=False)
        key = 0
        with env.begin(buffers=True) as txn:
            for number, (_, value) in enumerate(txn.cursor()):
                spans = unpack_block(value, number, key)
                total += sum(n for _, n in spans)
                key += len(spans)
                blocks += 1
        env.close()
        assert key == shard.count
    return total, blocks


def data_bytes(directory: Path) -> int:
    """Return the bytes of a dataset's data files: everything but its manifest or index."""
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file() and p.suffix != ".json")


@dataclass
class Written:
    """Both formats of one case, written, and what was measured writing them."""

    case: Case
    v3: Path
    v4: Path
    records: int
    v4_seconds: float
    v4_cpu: float
    shards: int
    blocks: int


class Store:
    """The cases written so far in this module's temporary directory (each once)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.written: dict[str, Written] = {}

    def get(self, case: Case) -> Written:
        if case.name not in self.written:
            self.written[case.name] = self._write(case)
        return self.written[case.name]

    def _write(self, case: Case) -> Written:
        arrays = make_arrays(case)
        v3, v4 = self.root / case.name / "v3", self.root / case.name / "v4"
        codec = {"image": case.codec} if case.codec != "raw" else "raw"
        cpu0, start = time.process_time(), time.perf_counter()
        manifest = fastload.write_arrays(v4, arrays, codec=codec, samples_per_shard=case.per_shard)
        v4_seconds, v4_cpu = time.perf_counter() - start, time.process_time() - cpu0
        records = write_v3(v3, manifest.fields, arrays, case.per_shard)
        v4_record_bytes, blocks = v4_records(v4)
        assert v4_record_bytes == records, "a record is as long in format 4 as in format 3"
        return Written(case, v3, v4, records, v4_seconds, v4_cpu, len(manifest.shards), blocks)


@pytest.fixture(scope="module")
def store():
    root = Path(tempfile.mkdtemp(prefix="fastload-bytes-"))
    try:
        yield Store(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def peer_bytes(case: Case, root: Path) -> dict[str, int | str]:
    """Return each peer's data bytes for the case's samples, or why there are none."""
    out: dict[str, int | str] = {}
    installed = bytes_helper.available()
    if not all(installed.values()):
        for peer, ok in installed.items():
            if not ok:
                out[peer] = "not installed"
    if not case.peers or (QUICK and case.name != "3KB"):
        return {peer: out.get(peer, "not run") for peer in bytes_helper.PEERS}
    source = root / "peer-source"
    source.mkdir()
    for name, a in make_arrays(case).items():
        np.save(source / f"{name}.npy", a)
    zstd_field = "image" if case.codec == "zstd" else None
    todo = [peer for peer in bytes_helper.PEERS if peer not in out]
    targets = {peer: root / f"peer-{peer}" for peer in todo}
    failed = bytes_helper.write_peers(todo, source, targets, zstd_field)
    for peer in todo:
        out[peer] = f"failed: {failed[peer]}" if peer in failed else data_bytes(targets[peer])
        shutil.rmtree(targets[peer], ignore_errors=True)
    shutil.rmtree(source)
    return out


def size_row(w: Written, peers: dict[str, int | str]) -> dict:
    case = w.case
    payload = case.count * case.payload_per_sample
    v3, v4 = data_bytes(w.v3), data_bytes(w.v4)
    row = {"case": case.name, "samples": case.count, "per_shard": case.per_shard, "shards": w.shards,
           "blocks": w.blocks, "record_bytes_mean": w.records / case.count, "payload_bytes": payload,
           "record_bytes": w.records, "v3_bytes": v3, "v4_bytes": v4, "v4_over_records": v4 / w.records,
           "v3_over_records": v3 / w.records, "v4_over_payload": v4 / payload, "v3_over_payload": v3 / payload,
           "v4_over_v3": v4 / v3, "goal": case.goal}
    for peer in bytes_helper.PEERS:
        value = peers[peer]
        row[f"{peer}_bytes"] = value
        row[f"{peer}_over_payload"] = value / payload if isinstance(value, int) else None
    return row


def size_table(rows: list[dict]) -> str:
    def mb(v: int | str) -> str:
        return f"{v / 1e6:,.2f}" if isinstance(v, int) else str(v)

    def ratio(v: float | None) -> str:
        return "" if v is None else f"{v:.3f}"

    lines = ["| case | samples (per shard) | record B | payload MB | records MB | v3 MB | v4 MB | v4/records "
             "| v3/records | v4/payload | v3/payload | MDS MB (/payload) | LitData MB (/payload) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['samples']:,} ({r['per_shard']:,}) | {r['record_bytes_mean']:,.0f} "
            f"| {mb(r['payload_bytes'])} | {mb(r['record_bytes'])} | {mb(r['v3_bytes'])} | {mb(r['v4_bytes'])} "
            f"| {ratio(r['v4_over_records'])} | {ratio(r['v3_over_records'])} | {ratio(r['v4_over_payload'])} "
            f"| {ratio(r['v3_over_payload'])} | {mb(r['mds_bytes'])}"
            + (f" ({ratio(r['mds_over_payload'])})" if r["mds_over_payload"] else "")
            + f" | {mb(r['litdata_bytes'])}" + (f" ({ratio(r['litdata_over_payload'])})" if r["litdata_over_payload"]
                                                 else "") + " |")
    return "\n".join(lines)


def test_bytes_on_disk(benchmark, store):
    rows: list[dict] = []

    def measure_all() -> None:
        for case in CASES:
            w = store.get(case)
            rows.append(size_row(w, peer_bytes(case, store.root / case.name)))

    benchmark.group = "bytes-on-disk"
    with MemorySampler(interval=0.1) as memory:
        benchmark.pedantic(measure_all, rounds=1, warmup_rounds=0)
    table = size_table(rows)
    print("\n" + table)
    # The common figures: format 4's writing (write_arrays) over all the cases.
    written = list(store.written.values())
    samples = sum(w.case.count for w in written)
    seconds = sum(w.v4_seconds for w in written)
    benchmark.extra_info.update({
        "samples_per_s": samples / seconds, "mb_per_s": sum(w.case.count * w.case.payload_per_sample
                                                             for w in written) / seconds / 1e6,
        "first_batch_s": seconds, "cpu_s": sum(w.v4_cpu for w in written), "peak_rss_mb": memory.peak_rss / 2**20,
        "figures": "samples_per_s, mb_per_s, first_batch_s, cpu_s: write_arrays writing every case as format 4",
        "table": rows, "table_markdown": table})
    for r in rows:
        benchmark.extra_info[f"{r['case']}_v4_over_records"] = r["v4_over_records"]
        benchmark.extra_info[f"{r['case']}_v4_over_v3"] = r["v4_over_v3"]
    missed = [f"{r['case']}: v4 {r['v4_bytes']:,} B > v3 {r['v3_bytes']:,} B" for r in rows
              if r["v4_bytes"] > r["v3_bytes"]]
    missed += [f"{r['case']}: v4 {r['v4_over_records']:.4f}x its records > {GOAL}" for r in rows
               if r["goal"] == "records" and r["v4_over_records"] > GOAL]
    assert not missed, "; ".join(missed)


def native_loader(path: Path, threads: int) -> fastload.ShardLoader:
    return fastload.ShardLoader(path, batch_size=BATCH, shuffle=True, seed=SEED, num_threads=threads,
                                backend="native")


def interleaved(loaders: dict[str, fastload.ShardLoader], rounds: int,
                epochs: int = 1) -> tuple[dict[str, list[float]], dict[str, EpochResult]]:
    """Run one warm-up epoch of each loader, then ``rounds`` rounds of ``epochs`` epochs each, the order rotating.

    Returns each loader's samples/s per round and its EpochResult (of the timed rounds).
    """
    names = list(loaders)
    for loader in loaders.values():
        loader.set_epoch(0)
        run_epoch(lambda loader=loader: loader, EpochResult())
    results = {name: EpochResult() for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            run_epoch(lambda name=name: same_epoch(loaders[name], epochs), results[name])
            rates[name].append(results[name].samples / results[name].seconds[-1])
    return rates, results


def same_epoch(loader: fastload.ShardLoader, epochs: int) -> Iterator:
    """Yield the batches of epoch 0, ``epochs`` times over (the same order every time, as benchmarks/test_epoch.py)."""
    for _ in range(epochs):
        loader.set_epoch(0)
        yield from loader


def spread(ratios: list[float], prefix: str) -> dict[str, float]:
    return {f"{prefix}_median": statistics.median(ratios), f"{prefix}_min": min(ratios), f"{prefix}_max": max(ratios)}


STEADY_ROUNDS = 3 if QUICK else 60


@pytest.mark.parametrize("name", ["3KB", "49KB-tile"])
def test_read_steady(benchmark, store, name):
    w = store.get(BY_NAME[name])
    loaders = {"v3": native_loader(w.v3, 2), "v4": native_loader(w.v4, 2)}
    measured: dict = {}

    def run() -> None:
        measured["rates"], measured["results"] = interleaved(loaders, STEADY_ROUNDS)

    benchmark.group = f"bytes-read-steady-{name}"
    with MemorySampler(interval=0.1) as memory:
        benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    rates, results = measured["rates"], measured["results"]
    loaders.clear()
    gc.collect()  # no mapping of the shards outlives the test (test_first_epoch_fresh evicts them)
    assert results["v3"].samples == results["v4"].samples == w.case.count
    assert results["v3"].checksum == results["v4"].checksum  # the same labels from both formats
    ratios = [a / b for a, b in zip(rates["v4"], rates["v3"])]
    info = extra_info(results["v4"], w.case.payload_per_sample, None, memory)  # the common figures: v4's best
    info.update({"threads": 2, "rounds": STEADY_ROUNDS,
                 "v4_median_samples_per_s": statistics.median(rates["v4"]),
                 "v3_median_samples_per_s": statistics.median(rates["v3"]),
                 "v3_best_samples_per_s": max(rates["v3"]), **spread(ratios, "v4_over_v3")})
    benchmark.extra_info.update(info)
    print(f"\n{name} steady, 2 threads, {STEADY_ROUNDS} rounds: v3 {info['v3_median_samples_per_s']:,.0f}, "
          f"v4 {info['v4_median_samples_per_s']:,.0f} samples/s (medians); v4/v3 per round median "
          f"{info['v4_over_v3_median']:.3f} [{info['v4_over_v3_min']:.3f}-{info['v4_over_v3_max']:.3f}]")


THREAD_ROUNDS = 2 if QUICK else 30
THREAD_EPOCHS = 1 if QUICK else 8  # epochs per round: one epoch of 50,000 records is about 20 ms, too short to time


def test_read_threads(benchmark, store):
    w = store.get(BY_NAME["3KB"])
    loaders = {f"{t}t": native_loader(w.v4, t) for t in (2, 8, 16)}
    measured: dict = {}

    def run() -> None:
        measured["rates"], measured["results"] = interleaved(loaders, THREAD_ROUNDS, THREAD_EPOCHS)

    benchmark.group = "bytes-read-threads-3KB-v4"
    with MemorySampler(interval=0.1) as memory:
        benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    rates, results = measured["rates"], measured["results"]
    loaders.clear()
    gc.collect()
    assert all(r.samples == w.case.count * THREAD_EPOCHS for r in results.values())
    info = extra_info(results["2t"], w.case.payload_per_sample, None, memory)  # the common figures: 2 threads
    info["rounds"], info["epochs_per_round"] = THREAD_ROUNDS, THREAD_EPOCHS
    for t in ("2t", "8t", "16t"):
        info[f"{t}_median_samples_per_s"] = statistics.median(rates[t])
    for t in ("8t", "16t"):
        info.update(spread([a / b for a, b in zip(rates[t], rates["2t"])], f"{t}_over_2t"))
    benchmark.extra_info.update(info)
    print(f"\n3KB v4 threads, {THREAD_ROUNDS} rounds of {THREAD_EPOCHS} epochs, samples/s medians: " + ", ".join(
        f"{t} {info[f'{t}_median_samples_per_s']:,.0f}" for t in ("2t", "8t", "16t")) + "; per round " + ", ".join(
        f"{t}/2t {info[f'{t}_over_2t_median']:.3f} [{info[f'{t}_over_2t_min']:.3f}-{info[f'{t}_over_2t_max']:.3f}]"
        for t in ("8t", "16t")))


PAIRS = 1 if QUICK else 5
CHILD_EPOCHS = 2 if QUICK else 3


def run_child(path: Path, warm_up: bool) -> dict:
    """Run epochs 1 to CHILD_EPOCHS of a 2-thread ShardLoader in a fresh process; return its figures."""
    done = subprocess.run([sys.executable, str(CHILD), str(path), "2", str(CHILD_EPOCHS), "1" if warm_up else "0"],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def warm(directory: Path) -> None:
    for p in directory.iterdir():
        p.read_bytes()


def evict(directory: Path) -> None:
    """Drop the dataset's files from the page cache (theirs alone: POSIX_FADV_DONTNEED on each, written back first)."""
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(directory: Path) -> float | None:
    """Return the fraction of the dataset's bytes in the page cache (``fincore``), or None without it."""
    files = sorted(str(p) for p in directory.iterdir())
    if shutil.which("fincore") is None:
        return None
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
                          capture_output=True, text=True, check=True)
    return sum(int(v) for v in done.stdout.split()) / sum(os.path.getsize(f) for f in files)


# How the files stand when a fresh process starts, and whether its loader warms up (warm_up=True, the default,
# maps every page of the shards in its constructor; without it the first epoch faults the pages in).
MODES = {"warm": (True, True), "cold": (False, True), "cold_no_warm_up": (False, False)}  # (cached, warm_up)


def total_s(run: dict) -> float:
    """Return a fresh process's seconds from building its loader to the end of its first epoch."""
    return run["build_s"] + run["epochs"][0]["seconds"]


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux/Unix only")
@pytest.mark.parametrize("name", ["3KB"] if QUICK else ["3KB", "49KB-tile"])
def test_first_epoch_fresh(benchmark, store, name):
    w = store.get(BY_NAME[name])
    paths = {"v3": w.v3, "v4": w.v4}
    runs: dict[tuple[str, str], list[dict]] = {(m, v): [] for m in MODES for v in paths}
    resident_after_evict: list[float] = []

    def run() -> None:
        for pair in range(PAIRS):
            versions = ["v3", "v4"] if pair % 2 == 0 else ["v4", "v3"]
            for mode, (cached, warm_up) in MODES.items():
                for v in versions:
                    if cached:
                        warm(paths[v])
                    else:
                        evict(paths[v])
                        fraction = resident_fraction(paths[v])
                        if fraction is not None:
                            resident_after_evict.append(fraction)
                    runs[mode, v].append(run_child(paths[v], warm_up))

    benchmark.group = f"bytes-first-epoch-{name}"
    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    count, sample_bytes = w.case.count, w.case.payload_per_sample
    files = {v: sum(p.stat().st_size for p in paths[v].iterdir()) for v in paths}
    info: dict = {"pairs": PAIRS, "threads": 2, "v3_over_v4_file_bytes": files["v3"] / files["v4"],
                  "resident_after_evict_max": max(resident_after_evict) if resident_after_evict else None}
    for (mode, v), rs in runs.items():
        firsts = [r["epochs"][0] for r in rs]
        assert all(f["samples"] == count for f in firsts)
        key = f"{mode}_{v}"
        info[f"{key}_first_samples_per_s"] = statistics.median(f["samples_per_s"] for f in firsts)
        info[f"{key}_build_s"] = statistics.median(r["build_s"] for r in rs)
        info[f"{key}_build_and_first_samples_per_s"] = statistics.median(count / total_s(r) for r in rs)
        info[f"{key}_first_batch_s"] = statistics.median(f["first_batch_s"] for f in firsts)
        info[f"{key}_first_major_faults"] = statistics.median(f["major_faults"] for f in firsts)
        info[f"{key}_first_minor_faults"] = statistics.median(f["minor_faults"] for f in firsts)
        info[f"{key}_file_mb_per_s"] = statistics.median(files[v] / total_s(r) for r in rs) / 1e6
        info[f"{key}_steady_samples_per_s"] = statistics.median(
            statistics.median(e["samples_per_s"] for e in r["epochs"][1:]) for r in rs)
        info[f"{key}_peak_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in rs)
        info[f"{key}_build_and_first_samples_per_s_each"] = [count / total_s(r) for r in rs]  # in pair order
    for mode in MODES:
        pairs = list(zip(runs[mode, "v3"], runs[mode, "v4"]))
        info.update(spread([b["epochs"][0]["samples_per_s"] / a["epochs"][0]["samples_per_s"] for a, b in pairs],
                           f"{mode}_first_v4_over_v3"))
        info.update(spread([total_s(a) / total_s(b) for a, b in pairs], f"{mode}_build_and_first_v4_over_v3"))
    warm_v4 = runs["warm", "v4"]  # the common figures: format 4, files cached, warm-up on
    info.update({"samples_per_s": info["warm_v4_first_samples_per_s"],
                 "mb_per_s": info["warm_v4_first_samples_per_s"] * sample_bytes / 1e6,
                 "first_batch_s": info["warm_v4_first_batch_s"], "peak_rss_mb": info["warm_v4_peak_rss_mb"],
                 "cpu_s": statistics.median(r["epochs"][0]["cpu_s"] for r in warm_v4)})
    benchmark.extra_info.update(info)
    print(f"\n{name} first epoch of a fresh process, {PAIRS} pairs, files v3/v4 {info['v3_over_v4_file_bytes']:.3f}x"
          + ("" if info["resident_after_evict_max"] is None
             else f", resident after eviction at most {100 * info['resident_after_evict_max']:.1f}%"))
    for mode in MODES:
        for figure, what in (("first", "first epoch"), ("build_and_first", "loader built + first epoch")):
            print(f"  {mode}, {what}: v3 {info[f'{mode}_v3_{figure}_samples_per_s']:,.0f}, "
                  f"v4 {info[f'{mode}_v4_{figure}_samples_per_s']:,.0f} samples/s (medians); v4/v3 per pair median "
                  f"{info[f'{mode}_{figure}_v4_over_v3_median']:.3f} [{info[f'{mode}_{figure}_v4_over_v3_min']:.3f}-"
                  f"{info[f'{mode}_{figure}_v4_over_v3_max']:.3f}]")
        print(f"  {mode}: build {1e3 * info[f'{mode}_v3_build_s']:.1f} / {1e3 * info[f'{mode}_v4_build_s']:.1f} ms, "
              f"first batch {1e3 * info[f'{mode}_v3_first_batch_s']:.1f} / {1e3 * info[f'{mode}_v4_first_batch_s']:.1f}"
              f" ms, major faults {info[f'{mode}_v3_first_major_faults']:,.0f} / "
              f"{info[f'{mode}_v4_first_major_faults']:,.0f}, peak RSS {info[f'{mode}_v3_peak_rss_mb']:,.0f} / "
              f"{info[f'{mode}_v4_peak_rss_mb']:,.0f} MB (v3 / v4, medians)")
