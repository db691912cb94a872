import platform
import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastload
from fastload import check_determinism, create_dataloader, seed_everything


class RandomDraws(Dataset):
    """Each item draws from the worker's random generators, exposing their seeding."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"i": torch.tensor(i), "py": torch.tensor(random.random()), "np": torch.tensor(np.random.rand()),
                "torch": torch.rand(())}


@pytest.mark.parametrize("workers", [0, 2])
def test_seeded_loaders_repeat_exactly(workers):
    make = lambda: create_dataloader(RandomDraws(), batch_size=4, shuffle=True, seed=3, num_workers=workers)  # noqa: E731
    assert check_determinism(make, num_batches=None) is None
    other = create_dataloader(RandomDraws(), batch_size=4, shuffle=True, seed=4, num_workers=workers)
    assert [b["i"].tolist() for b in other] != [b["i"].tolist() for b in make()]


def test_workers_get_different_streams_and_the_same_ones_each_run():
    def draws():
        loader = create_dataloader(RandomDraws(), batch_size=1, shuffle=False, seed=5, num_workers=2,
                                   persistent_workers=False)
        return [(float(b["py"]), float(b["np"])) for b in loader]

    first = draws()
    assert first == draws()
    worker0, worker1 = first[0::2], first[1::2]  # DataLoader alternates batches between workers
    assert worker0[0] != worker1[0] and worker0[0][0] != worker0[0][1]


def test_check_determinism_reports_the_first_difference():
    calls = []

    def make():
        calls.append(1)
        offset = len(calls)
        return [{"x": torch.tensor([1, 2, 3])}, {"x": torch.tensor([4, 5 + offset, 6])}]

    assert check_determinism(make) == "batch 1['x'][1]: 6 vs 7"


def test_options_follow_the_platform_and_cuda(monkeypatch):
    loader = create_dataloader(RandomDraws(), batch_size=4, num_workers=0)
    assert loader.pin_memory == torch.cuda.is_available() and loader.prefetch_factor is None
    assert not loader.persistent_workers
    loader = create_dataloader(RandomDraws(), batch_size=4, num_workers=2)
    assert loader.persistent_workers and loader.prefetch_factor == 2
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    assert create_dataloader(RandomDraws(), batch_size=4).num_workers == 0
    with pytest.warns(RuntimeWarning, match="ignored on Windows"):
        assert create_dataloader(RandomDraws(), batch_size=4, num_workers=2).num_workers == 0
    assert create_dataloader(RandomDraws(), batch_size=4, num_workers=2, force_workers_on_windows=True,
                             ).num_workers == 2


def test_distributed_sampler_with_seed_and_set_epoch():
    loaders = [create_dataloader(RandomDraws(), batch_size=4, shuffle=True, seed=1, world_size=2, rank=r,
                                 num_workers=0) for r in range(2)]
    parts = [sorted(sum((b["i"].tolist() for b in loader), [])) for loader in loaders]
    assert sorted(parts[0] + parts[1]) == list(range(16)) and not set(parts[0]) & set(parts[1])
    first = [b["i"].tolist() for b in loaders[0]]
    loaders[0].set_epoch(1)
    assert [b["i"].tolist() for b in loaders[0]] != first


def test_seed_everything():
    seed_everything(123)
    a = (random.random(), np.random.rand(), torch.rand(()).item())
    seed_everything(123)
    assert a == (random.random(), np.random.rand(), torch.rand(()).item())
    assert fastload.seed_everything is seed_everything
