"""ShardLoader inside PyTorch Lightning and Fabric (CPU, deterministic), each run in its own process.

``lightning_worker.py`` trains a tiny model and writes, per step, the epoch,
the loss and the batch's labels; these tests compare runs step by step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_images

import fastload

WORKER = Path(__file__).with_name("lightning_worker.py")
N, BATCH, EPOCH_BATCHES = 103, 10, 11
# Trainers run in subprocesses (tens of seconds each); the sanitizer build covers the native reads elsewhere.
pytestmark = [pytest.mark.slow, pytest.mark.no_asan]


def run_worker(tmp: Path, name: str, *args: str, ranks: int = 1) -> list[dict]:
    out = tmp / name
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, str(WORKER), *args[:2], str(out), *args[2:]], capture_output=True,
                          text=True, timeout=240, env=env, cwd=tmp)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]


def losses(result: dict) -> list[float]:
    return [s["loss"] for s in result["steps"]]


def epoch_labels(result: dict, epoch: int) -> list[int]:
    return sum((s["labels"] for s in result["steps"] if s["epoch"] == epoch), [])


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A dataset root as preprocess_tiles writes it: train/ (103 samples) and val/ (25)."""
    root = tmp_path_factory.mktemp("lightning") / "root"
    fastload.write_arrays(root / "train", {"image": smooth_images(N, (3, 8, 8)),
                                           "label": np.arange(N, dtype=np.int64) * 7},
                          codec={"image": "zstd"}, samples_per_shard=30)
    fastload.write_arrays(root / "val", {"image": smooth_images(25, (3, 8, 8), seed=1),
                                         "label": np.arange(25, dtype=np.int64)})
    return root


@pytest.fixture(scope="module")
def uninterrupted(root, tmp_path_factory) -> tuple[dict, Path]:
    """Two epochs through ShardDataModule with checkpoints every 4 steps (mid-epoch) and every 11 (epoch ends)."""
    tmp = tmp_path_factory.mktemp("full")
    [result] = run_worker(tmp, "full", "lightning", str(root), "--datamodule", "fastload",
                          "--ckpt-every", "4", "11", "--ckpt-dir", str(tmp / "ckpt"))
    return result, tmp / "ckpt"


def test_trainer_fit_equals_a_plain_loop_and_epochs_differ(root, uninterrupted, tmp_path):
    trained, _ = uninterrupted
    [plain] = run_worker(tmp_path, "plain", "plain", str(root / "train"))
    assert len(trained["steps"]) == 2 * EPOCH_BATCHES and trained["num_training_batches"] == EPOCH_BATCHES
    assert losses(trained) == losses(plain)  # bit-identical floats, step by step
    assert [s["labels"] for s in trained["steps"]] == [s["labels"] for s in plain["steps"]]
    first, second = epoch_labels(trained, 0), epoch_labels(trained, 1)
    assert sorted(first) == sorted(second) == [7 * i for i in range(N)] and first != second


def test_validation_loader_reiterated_starts_at_zero_and_covers(uninterrupted):
    trained, _ = uninterrupted
    passes = trained["val_passes"]  # the sanity check (2 batches), then one full pass per epoch
    assert [len(p) for p in passes] == [20, 25, 25]
    assert all(p == list(range(len(p))) for p in passes)


def test_checkpoints_hold_the_loader_position(uninterrupted):
    trained, _ = uninterrupted
    saved = {s["step"]: s["loader"] for s in trained["saved"]}
    assert (saved[4]["epoch"], saved[4]["position"]) == (0, 40)
    assert (saved[11]["epoch"], saved[11]["position"]) == (1, 0)  # the last batch completed the epoch
    assert (saved[16]["epoch"], saved[16]["position"]) == (1, 50)


@pytest.mark.parametrize("step", [4, 11, 16])  # mid-epoch 0, the epoch boundary, mid-epoch 1
def test_resume_from_a_checkpoint_in_a_new_process_reproduces_the_run(root, uninterrupted, tmp_path, step):
    trained, ckpt = uninterrupted
    every = 11 if step == 11 else 4
    [resumed] = run_worker(tmp_path, f"resume{step}", "lightning", str(root), "--datamodule", "fastload",
                           "--resume", str(ckpt / f"every{every}" / f"step={step}.ckpt"))
    expected = trained["steps"][step:]
    print(f"resume from step {step}: first 10 losses\n" + "\n".join(
        f"  step {step + i:2d}: uninterrupted {a['loss']:.9f}  resumed {b['loss']:.9f}"
        for i, (a, b) in enumerate(zip(expected[:10], resumed["steps"][:10]))))
    print(f"  steps {len(expected)} vs {len(resumed['steps'])}, max abs diff "
          f"{max(abs(a['loss'] - b['loss']) for a, b in zip(expected, resumed['steps'])):.3g}")
    assert len(resumed["steps"]) == len(expected)
    assert losses(resumed) == [s["loss"] for s in expected]
    assert [s["labels"] for s in resumed["steps"]] == [s["labels"] for s in expected]


def test_limit_train_batches_reads_each_epochs_own_batches_also_after_a_resume(root, tmp_path):
    [limited] = run_worker(tmp_path, "limited", "lightning", str(root / "train"), "--limit", "3", "--epochs", "3",
                           "--ckpt-every", "3", "--ckpt-dir", str(tmp_path / "ckpt"))
    reference = fastload.ShardLoader(root / "train", batch_size=BATCH, shuffle=True, seed=7)
    for epoch in range(3):
        reference.set_epoch(epoch)
        expected = sum((b["label"].tolist() for _, b in zip(range(3), reference)), [])
        assert epoch_labels(limited, epoch) == expected
    assert len({tuple(epoch_labels(limited, e)) for e in range(3)}) == 3
    saved = {s["step"]: s["loader"] for s in limited["saved"]}
    assert (saved[3]["epoch"], saved[3]["position"]) == (0, 30)  # the cut-short pass, as it stood
    [resumed] = run_worker(tmp_path, "resumed", "lightning", str(root / "train"), "--limit", "3", "--epochs", "3",
                           "--resume", str(tmp_path / "ckpt" / "every3" / "step=3.ckpt"))
    assert resumed["steps"] == limited["steps"][3:]  # Lightning's set_epoch(1) moves past the rest of epoch 0


def check_partition(results: list[dict], epochs: int = 2) -> None:
    assert [r["rank"] for r in results] == [0, 1] and all(r["world_size"] == 2 for r in results)
    for epoch in range(epochs):
        parts = [epoch_labels(r, epoch) for r in results]
        steps = [sum(1 for s in r["steps"] if s["epoch"] == epoch) for r in results]
        overlap = set(parts[0]) & set(parts[1])
        print(f"epoch {epoch}: sizes {[len(p) for p in parts]}, steps {steps}, overlap {len(overlap)} "
              f"(wrap-around padding of 103 to 104), union {len(set(parts[0]) | set(parts[1]))} of {N}")
        assert len(parts[0]) == len(parts[1]) == 52 and steps == [6, 6]
        assert set(parts[0]) | set(parts[1]) == {7 * i for i in range(N)}
        assert len(overlap) == 1 and all(len(set(p)) == len(p) for p in parts)
    for r in results:
        assert epoch_labels(r, 0) != epoch_labels(r, 1)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_process_ddp_with_the_loader_built_before_fit(root, tmp_path, strategy):
    results = run_worker(tmp_path, strategy, "lightning", str(root / "train"), "--strategy", strategy,
                         "--devices", "2", ranks=2)
    check_partition(results)


def test_fabric_two_processes_iterating_the_loader_directly(root, tmp_path):
    results = run_worker(tmp_path, "fabric", "fabric", str(root / "train"), "--strategy", "ddp", "--devices", "2",
                         ranks=2)
    check_partition(results)
    assert all(r["loader_len"] == 6 for r in results)
