"""A Lightning DDP run from a bucket with a bounded cache, killed mid-epoch and resumed with the same limit.

The cache holds less than the training split (read a window of shards at a time) and the validation
split whole. A fresh run opens val first (the sanity check); a resumed one opens train first. Both
must fit the same ``cache_limit``: the training split holds the room its window needs (claimed by
each rank's loader), not all the room there is (before, the resumed run was refused on both ranks).
The killed run's ranks leave claims and locks behind; the resumed run drops them and goes on with
exactly the uninterrupted run's steps. Against the moto S3 server of tests/test_remote.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_images
from test_remote import s3, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.format._splits import write_splits

pytest.importorskip("lightning", reason="lightning is not installed")
pytest.importorskip("obstore", reason="fastload[remote] (obstore) is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.no_asan]

WORKER = Path(__file__).with_name("lightning_worker.py")
TRAIN, VAL, PER_SHARD = 200, 40, 10  # 20 training shards: 10 steps an epoch on each of 2 ranks (batch 10)


@pytest.fixture(scope="module")
def s3_root(tmp_path_factory, s3):  # noqa: F811
    """A root (train/, val/, splits.json) uploaded to the S3 server: (URL, storage_options, local root)."""
    local = tmp_path_factory.mktemp("ddp-remote") / "root"
    for name, n, seed in (("train", TRAIN, 0), ("val", VAL, 1)):
        fastload.write_arrays(local / name, {"image": smooth_images(n, (3, 8, 8), seed=seed),
                                             "label": np.arange(n, dtype=np.int64) * 3},
                              samples_per_shard=PER_SHARD)
    write_splits(local, {n: {"path": n, "samples": c, "sources": c, "class_counts": None}
                         for n, c in (("train", TRAIN), ("val", VAL))}, {"tool": "tests"})
    return upload(s3[1], local, "ddp-root"), s3[2], local


def run(tmp: Path, name: str, url: str, remote: Path, *args: str, killed: bool = False) -> list[dict]:
    """Run lightning_worker.py on 2 DDP ranks over ``url``; return each rank's record (none when ``killed``)."""
    out = tmp / name
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning", "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.Popen([sys.executable, str(WORKER), "lightning", url, str(out), "--datamodule", "fastload",
                             "--strategy", "ddp", "--devices", "2", "--remote", str(remote), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a rank left behind by a killed run
        except ProcessLookupError:
            pass
    cache = Path(json.loads(remote.read_text())["cache_dir"])
    if killed:
        assert proc.returncode == -signal.SIGKILL, evidence(out, proc.returncode, stdout, stderr, cache)
        return []
    assert proc.returncode == 0, evidence(out, proc.returncode, stdout, stderr, cache)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]


def evidence(out: Path, returncode: int, stdout: str, stderr: str, cache: Path) -> str:
    """Return what a failed run left: its exit status, faulthandler's reports, the cache, its output (kept whole).

    Both ranks write to one stderr, so its tail alone may hold only the survivor's traceback (gloo's
    "Connection closed by peer"); the whole of it is kept in ``<out>.stderr``. A rank Lightning
    started reports its exit status in stderr ("Child process ... terminated with code"); a rank's
    fatal signal, or where it waited, is in its ``<out>.faults-<pid>`` (tests/lightning_worker.py).
    """
    Path(f"{out}.stdout").write_text(stdout)
    Path(f"{out}.stderr").write_text(stderr)
    status = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"
    reports = sorted(out.parent.glob(f"{out.name}.faults-*"))
    faults = "".join(f"\n--- {p.name}:\n{p.read_text()[-6000:]}" for p in reports)
    files = "\n".join(f"{p.relative_to(cache)} {p.stat().st_size}" for p in sorted(cache.rglob("*")) if p.is_file()
                      and not p.name.endswith((".lock", ".readers")))  # (locks are empty; the kernel held them)
    return (f"{out.name}: {status}; whole output in {out}.stdout and {out}.stderr\n{faults}\n--- the cache:\n"
            f"{files}\n--- stdout:\n"
            f"{stdout[-3000:]}\n--- stderr:\n{stderr[-20000:]}")


def test_a_ddp_run_from_a_bucket_killed_mid_epoch_resumes_with_the_same_cache_limit(s3_root, tmp_path):
    url, options, local = s3_root
    shards = sorted(p.stat().st_size for p in (local / "train").glob("*.lmdb"))
    val_bytes = sum(p.stat().st_size for p in (local / "val").iterdir())
    limit = val_bytes + 2 * 2 * shards[-1] + 2 * 16384  # val whole, and a window of 2 shards per rank
    assert limit < sum(shards)  # the training split is read a window at a time

    def remote(cache: Path) -> Path:
        path = tmp_path / f"{cache.name}.json"
        path.write_text(json.dumps({"storage_options": options, "cache_dir": str(cache), "cache_limit": limit,
                                    "shuffle_window": 1}))
        return path

    full = run(tmp_path, "full", url, remote(tmp_path / "cache-full"), "--ckpt-every", "4",
               "--ckpt-dir", str(tmp_path / "ckpt-full"))
    assert [len(r["steps"]) for r in full] == [20, 20]
    cache = tmp_path / "cache"
    run(tmp_path, "killed", url, remote(cache), "--ckpt-every", "4", "--ckpt-dir", str(tmp_path / "ckpt"),
        "--kill-at-step", "6", killed=True)
    checkpoint = tmp_path / "ckpt" / "every4" / "step=4.ckpt"
    assert checkpoint.exists()
    assert any(p.name.startswith(".claim-") for p in cache.rglob("*"))  # what the killed ranks left behind
    resumed = run(tmp_path, "resumed", url, remote(cache), "--resume", str(checkpoint))
    for rank in range(2):
        assert [s["labels"] for s in resumed[rank]["steps"]] == [s["labels"] for s in full[rank]["steps"][4:]]
        assert [s["loss"] for s in resumed[rank]["steps"]] == [s["loss"] for s in full[rank]["steps"][4:]]
