"""fastload verify at scale: parallel jobs, per-problem lines, a final summary, bytes counted for the bar."""

import re
import shutil

import pytest
from conftest import run_cli

from fastload.format._manifest import load_manifest
from fastload.format._verify import check_shard, verify_dataset
from fastload.tools import cli


def test_summary_counts_shards_records_bytes(small_dataset):
    manifest = load_manifest(small_dataset)
    for jobs in ("1", "3"):
        r = run_cli("fastload", "verify", str(small_dataset), "--jobs", jobs)
        assert r.returncode == 0, r.stdout + r.stderr
        last = r.stdout.strip().splitlines()[-1]
        total = sum(s.bytes for s in manifest.shards)
        assert re.fullmatch(rf"{re.escape(str(small_dataset))}: OK: 4 shards, 103 records, "
                            rf"{total / 1e9:.3f} GB in \d+\.\d\d s \(\d+\.\d\d GB/s\)", last), last


def test_problems_in_several_shards_are_each_reported(tmp_path, small_dataset):
    ds = tmp_path / "ds"
    shutil.copytree(small_dataset, ds)
    for name in ("shard-00001.lmdb", "shard-00003.lmdb"):
        data = bytearray((ds / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (ds / name).write_bytes(bytes(data))
    r = run_cli("fastload", "verify", str(ds), "--jobs", "2")
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert any("shard-00001.lmdb: content hash differs" in line for line in lines)
    assert any("shard-00003.lmdb: content hash differs" in line for line in lines)
    first = [i for i, line in enumerate(lines) if "shard-00001" in line][0]
    assert all("shard-00003" not in line for line in lines[:first])  # shard order, whatever finished first
    assert re.search(r"ds: \d+ problem\(s\): 4 shards, 103 records", lines[-1])


def test_progress_counts_every_byte(small_dataset):
    manifest = load_manifest(small_dataset)
    seen = []
    for shard, fingerprint in zip(manifest.shards, manifest.record_fingerprints()):
        assert check_shard(small_dataset, shard, manifest.fields, seen.append, fingerprint=fingerprint) == []
    assert sum(seen) == sum(s.bytes for s in manifest.shards)
    report = verify_dataset(small_dataset, jobs=2, progress=True)
    assert report.ok and report.records == 103 and report.shards == 4


def test_bad_jobs_is_a_usage_error(small_dataset):
    r = run_cli("fastload", "verify", str(small_dataset), "--jobs", "0")
    assert r.returncode == 2 and "--jobs must be at least 1" in r.stderr


def test_an_error_that_replaced_a_ctrl_c_stops_verify_as_the_ctrl_c(small_dataset, monkeypatch):
    # a cleanup interrupted by Ctrl-C that fails in turn (an OSError whose context is the KeyboardInterrupt)
    # must not read as a problem of the dataset, nor let verify go on to the next split
    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(cli, "verify_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["verify", str(small_dataset)])
