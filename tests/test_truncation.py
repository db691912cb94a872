"""A shard truncated or rewritten shorter while it is read: a typed error naming it, never SIGBUS.

Each reader (the native loader, ShardDataset, backend="torch" with DataLoader workers) runs in a
subprocess that reads one batch, then cuts the shard (truncated in place, or overwritten in place by a
shorter file), then reads on. Every reader maps the shard; a read of a page the file no longer has
raises SIGBUS, which fastload's handler turns into a CorruptShardError naming the shard
("changed while being read"): the process lives and no byte of the cut file is delivered.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastload

SCRIPT = textwrap.dedent("""
    import os, sys
    import fastload
    from fastload.errors import FastloadError
    reader, mode, keep, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    shard = os.path.join(path, "shard-00000.lmdb")

    def cut():
        size = os.path.getsize(shard)
        if mode == "truncate":
            os.truncate(shard, int(size * keep))
        else:  # overwritten in place by a shorter file of other bytes
            with open(shard, "r+b") as f:
                f.truncate(0)
                f.write(os.urandom(int(size * keep)))

    try:
        if reader == "dataset":
            ds = fastload.ShardDataset(path)
            ds[0]
            cut()
            for i in range(len(ds)):
                ds[i]
            ds.read_batch(list(range(len(ds))))
        else:
            kw = {"num_workers": 2} if reader == "torch" else {"num_threads": 2, "prefetch": 1}
            loader = fastload.ShardLoader(path, batch_size=64, backend=reader, **kw)
            it = iter(loader)
            next(it)
            cut()
            for _ in it:
                pass
    except FastloadError as err:
        print("ERROR", type(err).__name__, err)
        sys.exit(3)
    print("NO ERROR")
""")


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    images = np.random.default_rng(0).integers(0, 255, (2048, 3, 32, 32), dtype=np.uint8)
    fastload.write_arrays(out, {"image": images, "label": np.arange(2048, dtype=np.int64)},
                          codec={"image": "raw"}, samples_per_shard=4096)
    return out


@pytest.mark.parametrize("reader", ["native", "dataset", "torch"])
def test_shard_cut_while_read_is_a_typed_error(dataset: Path, tmp_path: Path, reader: str) -> None:
    pristine = (dataset / "shard-00000.lmdb").read_bytes()
    rounds = [("truncate", 0.5), ("truncate", 0.05), ("truncate", 0.0), ("rewrite", 0.3), ("rewrite", 0.9)]
    for mode, keep in rounds:
        (dataset / "shard-00000.lmdb").write_bytes(pristine)
        proc = subprocess.run([sys.executable, "-c", SCRIPT, reader, mode, str(keep), str(dataset)],
                              capture_output=True, text=True, timeout=120)
        where = f"{reader} {mode} {keep}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        assert proc.returncode != -signal.SIGBUS, where
        # DataLoader workers: torch rebuilds a worker's exception as its type called with the worker's
        # traceback text, which our errors accept: the typed error arrives, naming the shard.
        assert proc.returncode == 3, where
        assert "shard-00000.lmdb" in proc.stdout, where
        if reader == "torch":  # workers open the shard lazily, maybe after the cut: then it is found damaged
            assert "CorruptShardError" in proc.stdout, where
        else:
            assert "changed while being read" in proc.stdout, where


RACE_SCRIPT = textwrap.dedent("""
    import os, random, shutil, sys, threading, time
    import numpy as np
    import fastload
    from fastload.errors import CorruptShardError, CorruptRecordError
    reader, path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shard = os.path.join(path, "shard-00000.lmdb")
    pristine = open(shard, "rb").read()
    rng = random.Random(0)
    outcomes = {"whole": 0, "changed": 0}
    for r in range(rounds):
        with open(shard, "wb") as f:
            f.write(pristine)
        keep = rng.choice([0.0, 0.1, 0.5, 0.9])
        delay = rng.uniform(0.0, 0.004)
        cutter = threading.Timer(delay, os.truncate, (shard, int(len(pristine) * keep)))
        try:
            if reader == "native":
                source = fastload.ShardLoader(path, batch_size=32, num_threads=4, prefetch=8, shuffle=True, seed=r)
            else:
                ds = fastload.ShardDataset(path)
                order = np.random.default_rng(r).permutation(len(ds))
                source = (ds.read_batch(order[i:i + 32].tolist()) for i in range(0, len(ds), 32))
            for batch in source:
                if not cutter.is_alive() and not cutter.finished.is_set():
                    cutter.start()  # once the shard is open: the cut races the reads
                # Every delivered sample is the one written: label i holds image i's bytes.
                labels = batch["label"].numpy()
                expected = (labels[:, None] * 7 + np.arange(3 * 16 * 16)) % 251
                got = batch["image"].numpy().reshape(len(labels), -1)
                if not np.array_equal(got, expected):
                    print("WRONG SAMPLE DELIVERED", r, keep, delay)
                    sys.exit(5)
            outcomes["whole"] += 1
        except (CorruptShardError, CorruptRecordError) as err:
            if "changed while being read" in str(err):
                outcomes["changed"] += 1
            else:
                print("UNEXPECTED", type(err).__name__, err)
                sys.exit(6)
        if cutter.is_alive():
            cutter.join()
    print("OUTCOMES", outcomes["whole"], outcomes["changed"])
""")


@pytest.mark.parametrize("reader", ["native", "dataset"])
def test_shard_cut_at_random_moments_never_delivers_a_wrong_sample(tmp_path: Path, reader: str) -> None:
    """A cut racing the reader's threads: each pass ends whole or with the typed error, and every sample
    delivered is the one written (no page of zeros taken for data), over 30 cuts at random moments."""
    out = tmp_path / "ds"
    labels = np.arange(4096, dtype=np.int64)
    images = ((labels[:, None] * 7 + np.arange(3 * 16 * 16)) % 251).astype(np.uint8).reshape(-1, 3, 16, 16)
    fastload.write_arrays(out, {"image": images, "label": labels}, codec={"image": "raw"},
                          samples_per_shard=8192)
    proc = subprocess.run([sys.executable, "-c", RACE_SCRIPT, reader, str(out), "30"],
                          capture_output=True, text=True, timeout=300)
    where = f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, where
    whole, changed = map(int, proc.stdout.split("OUTCOMES")[1].split())
    assert whole + changed == 30, where
    assert changed >= 5, where  # many cuts land while the pass reads
