"""The docs' "With PyTorch Lightning" and "With torchrun / DDP" snippets (docs/distributed.md), run as written
on a tiny dataset.

Only sizes are substituted (the dataset path, batch size, epochs, checkpoint
interval, input channels), by exact text replacement that fails when the
README text changes.

One addition: the torchrun workers end with ``os._exit(0)`` after
``dist.destroy_process_group()``, skipping interpreter finalization. With
torch 2.13 and gloo, DDP keeps the process group (and gloo's worker threads)
alive past ``destroy_process_group()``; the last gradient all-reduce was
launched inside ``backward()``, so its work object holds a copy of the thread
state that ``torch.autograd`` stashes a Python object in (the
``contextvars`` context), and gloo's thread drops that work after the
all-reduce completes. When the main thread has meanwhile begun finalizing,
that thread's GIL acquire ends in ``pthread_exit``, unwinding through a
``noexcept`` destructor: SIGABRT, "terminate called without an active
exception" (backtrace: ``ProcessGroupGloo::runLoop`` >
``~AsyncAllreduceWork`` > ``~ThreadLocalState`` > ``SafePyObject`` decref >
``take_gil`` > ``pthread_exit``). It also happens with a plain DataLoader,
none of fastload's threads exist then, and nothing the script can call joins
gloo's threads; the README says so below the snippet. Everything the test
checks happens before that line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import smooth_images

import fastload

README = Path(__file__).resolve().parents[1] / "README.md"
# Trainers in subprocesses (tens of seconds); the sanitizer build covers the native reads elsewhere.
pytestmark = [pytest.mark.slow, pytest.mark.no_asan]


DOCS = [README, *sorted((README.parent / "docs").glob("*.md"))]


def snippet(heading: str, replacements: dict[str, str]) -> str:
    """The first python block under ``## heading`` in the README or a docs page, with sizes replaced."""
    text = next(t for t in (d.read_text() for d in DOCS) if f"## {heading}\n" in t)
    section = text[text.index(f"## {heading}\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, heading
    source = code.group(1)
    for old, new in replacements.items():
        assert old in source, f"{old!r} is no longer in the README's {heading!r} snippet"
        source = source.replace(old, new)
    return source


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("readme") / "shards"
    for split, n in (("train", 103), ("val", 25)):
        fastload.write_arrays(root / split, {"image": smooth_images(n, (3, 8, 8)),
                                             "label": np.arange(n, dtype=np.int64) % 10})
    return root


def run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


# torch's abort at interpreter exit, not fastload's: see the module docstring.
GLOO_EXIT = "dist.destroy_process_group()\nimport sys\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"


def loader_state(ckpt: Path) -> tuple[int, dict]:
    state = torch.load(ckpt, weights_only=False)
    return state["global_step"], state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


def test_lightning_snippet_trains_and_resumes_mid_epoch(shards, tmp_path):
    sizes = {'"shards"': repr(str(shards)), "batch_size=256": "batch_size=10", "num_threads=8": "num_threads=2",
             "every_n_train_steps=500": "every_n_train_steps=4", "in_channels: int = 13": "in_channels: int = 3"}
    (tmp_path / "first.py").write_text(snippet("With PyTorch Lightning", {**sizes, "max_epochs=10": "max_epochs=1"}))
    (tmp_path / "second.py").write_text(snippet("With PyTorch Lightning", {**sizes, "max_epochs=10": "max_epochs=2"}))
    last = tmp_path / "checkpoints" / "last.ckpt"
    run([sys.executable, "first.py"], tmp_path)
    step, state = loader_state(last)
    assert step == 8 and (state["epoch"], state["position"]) == (0, 80)  # saved mid-epoch (11 batches)
    out = run([sys.executable, "second.py"], tmp_path)
    assert "Restored all states from the checkpoint" in out
    step, state = loader_state(last)
    assert step == 20 and (state["epoch"], state["position"]) == (1, 90)  # 22 steps in all, none replayed


def test_torchrun_snippet_splits_and_resumes(shards, tmp_path):
    source = snippet("With torchrun / DDP", {'"shards/train"': repr(str(shards / "train")),
                                              "batch_size=256": "batch_size=10", "range(loader.epoch, 10)":
                                              "range(loader.epoch, 2)", "Linear(13, 10)": "Linear(3, 10)",
                                              "steps % 500 == 0": "steps % 4 == 0",
                                              "dist.destroy_process_group()\n": GLOO_EXIT})
    (tmp_path / "train_ddp.py").write_text(source)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train_ddp.py"]
    out = run(torchrun, tmp_path)
    for rank in (0, 1):
        for epoch in (0, 1):
            assert f"rank {rank} of 2: epoch {epoch}, 6 of 6 batches" in out, out
    saved = torch.load(tmp_path / "ckpt.pt")["loader"]
    assert (saved["epoch"], saved["position"], saved["world_size"]) == (1, 80, 2)  # after 4 steps of 2 x 10
    out = run(torchrun, tmp_path)  # resumes from the checkpoint: the last 2 batches of epoch 1 on each rank
    assert "epoch 0" not in out
    for rank in (0, 1):
        assert f"rank {rank} of 2: epoch 1, 2 of 6 batches" in out, out


def test_sampling_snippet_runs_as_written(shards, tmp_path, monkeypatch):
    source = snippet("Sampling", {"batch_size=256": "batch_size=10"})
    source = source.replace("    ...\n", "    seen.append(batch)\n")
    monkeypatch.chdir(tmp_path)  # the snippet writes its own stand-in shards/ (103 train, 25 val samples)
    namespace: dict = {"seen": []}
    exec(compile(source, "README.md (Sampling)", "exec"), namespace)
    fold, balanced, batches = namespace["fold"], namespace["balanced"], namespace["seen"]
    assert sorted(int(x) for b in fold for x in b["label"]) == sorted([i % 10 for i in range(0, 103, 5)])
    assert len(balanced) == 11 and sum(len(b["label"]) for b in balanced) == 103
    sources = torch.cat([b["source"] for b in batches])
    assert int((sources == 0).sum()) >= 103 and int((sources == 1).sum()) >= 25  # all_exhausted: everything read
