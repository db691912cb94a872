"""The ``spawn`` start method, as on Windows (no fork): everything a worker needs is pickled and re-imported.

These run on Linux the paths Windows always takes: the torch backend's DataLoader workers, the
``create_dataloader`` helpers' workers, and a ``ShardLoader`` handed to ``torch.multiprocessing.spawn``.
Each spawned process re-imports torch, so the tests keep to two workers.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing
from conftest import BACKENDS, batches_equal
from torch.utils.data import Dataset

from fastload import ShardLoader, check_determinism, create_dataloader

pytestmark = pytest.mark.slow  # tier: DataLoader workers started by spawn, each importing torch


class Draws(Dataset):
    """Each item reports its index, the worker's id and a draw from each of its random generators."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        return {"i": torch.tensor(i), "worker": torch.tensor(-1 if info is None else info.id),
                "py": torch.tensor(random.random()), "np": torch.tensor(np.random.rand())}


def test_torch_backend_spawn_workers_give_the_native_batches(small_dataset):
    kwargs = dict(batch_size=10, shuffle=True, seed=11)
    spawned = ShardLoader(small_dataset, backend="torch", num_workers=2, multiprocessing_context="spawn", **kwargs)
    assert spawned._dataloader.multiprocessing_context.get_start_method() == "spawn"
    native = ShardLoader(small_dataset, backend="native", **kwargs)
    for _ in range(2):  # two epochs through the same (persistent) spawned workers
        assert batches_equal(list(spawned), list(native))
    assert spawned.epoch == native.epoch == 2


def test_torch_backend_forks_on_linux_unless_told(small_dataset):
    loader = ShardLoader(small_dataset, backend="torch", num_workers=1, batch_size=10)
    assert loader._dataloader.multiprocessing_context.get_start_method() == "fork"


def test_create_dataloader_spawn_workers_repeat_and_differ():
    def make():
        return create_dataloader(Draws(), batch_size=3, shuffle=True, seed=8, num_workers=2,
                                 multiprocessing_context="spawn", persistent_workers=False)

    loader = make()
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    batches = list(loader)
    assert sorted(torch.cat([b["i"] for b in batches]).tolist()) == list(range(12))
    assert {int(w) for b in batches for w in b["worker"]} == {0, 1}
    draws = [float(x) for b in batches for x in b["py"]]
    assert len(set(draws)) == len(draws)  # workers seeded apart, not copies of one state
    assert check_determinism(make, num_batches=None) is None


def _read_the_rest(rank: int, loader: ShardLoader, out: str) -> None:
    """In a spawned process: read the rest of the loader's epoch and the next epoch, save them."""
    batches = list(loader) + list(loader)
    torch.save({"batches": batches, "epoch": loader.epoch, "backend": loader.backend}, Path(out) / f"{rank}.pt")


@pytest.mark.parametrize("backend", BACKENDS)
def test_shard_loader_through_torch_multiprocessing_spawn(small_dataset, tmp_path, backend):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=5, backend=backend, num_workers=0)

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(3)]  # mid-epoch: the shards are open in this process
    torch.multiprocessing.spawn(_read_the_rest, args=(loader, str(tmp_path)), nprocs=2, join=True)
    reference = make()
    expected = list(reference) + list(reference)
    assert batches_equal(head + list(it), expected[:11])
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        assert got["backend"] == backend and got["epoch"] == 2
        assert batches_equal(got["batches"], expected[3:])
