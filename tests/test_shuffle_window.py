"""``shuffle_window=K``: a shuffle within windows of K shards, taken in a shuffled order (docs/ORDER.md).

The promises shared with every sampling mode (both backends, thread counts,
resume, elastic resume, rank partitions, pickling) are tested in
tests/test_sampling.py (modes "window" and "window-concat"); this file tests
what is particular to windows: the order against a scalar reading of the
documented definition, which shards a batch reads, and the arguments refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import BACKENDS

import fastload
from fastload import ShardLoader, StateError
from fastload.errors import ArgumentError, ArgumentTypeError
from fastload.sampling._alias import stream_base, word
from fastload.sampling._order import EpochOrder
from fastload.sampling._windows import TAG_WINDOW_SAMPLES, TAG_WINDOW_SHARDS, ShardWindowSampling

SHARD = 30  # the small dataset: 103 samples in shards of 30, 30, 30 and 13; label = 7 * index


def reference_order(sizes: list[int], window: int, seed: int, epoch: int) -> list[int]:
    """The documented definition, one position at a time, with the pure-numpy v1 order."""
    offsets = [sum(sizes[:j]) for j in range(len(sizes))]
    shard_order = EpochOrder(stream_base(seed, epoch, TAG_WINDOW_SHARDS), 0, len(sizes))
    shards = [int(s) for s in shard_order.positions(0, len(sizes))]
    out = []
    for w in range(0, -(-len(sizes) // window)):
        members = [offsets[s] + i for s in shards[w * window:(w + 1) * window] for i in range(sizes[s])]
        inner = EpochOrder(word(stream_base(seed, epoch, TAG_WINDOW_SAMPLES), w), 0, len(members))
        out += [members[int(q)] for q in inner.positions(0, len(members))]
    return out


@pytest.mark.parametrize(("sizes", "window"), [([30, 30, 30, 13], 2), ([5, 0, 9, 1, 7, 7, 3], 3), ([4], 1),
                                               ([3, 8, 2, 6, 1], 1), ([3, 8, 2, 6, 1], 9)])
def test_the_order_is_the_documented_function(sizes, window):
    sampling = ShardWindowSampling(sizes, window)
    for seed, epoch in ((0, 0), (7, 3), (2**64 - 1, 12)):
        got = sampling.epoch_order(seed, epoch, sum(sizes), True).at(np.arange(sum(sizes)))
        assert got.tolist() == reference_order(sizes, window, seed, epoch)
        assert sorted(got.tolist()) == list(range(sum(sizes)))  # every sample once


def test_epochs_and_seeds_give_other_orders():
    sampling = ShardWindowSampling([50] * 8, 2)
    orders = {tuple(sampling.epoch_order(seed, epoch, 400, True).at(np.arange(400)).tolist())
              for seed in (0, 1) for epoch in (0, 1, 2)}
    assert len(orders) == 6


def shard_of(batch) -> list[int]:
    return sorted({int(label) // 7 // SHARD for label in batch["label"]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_of_one_shard_reads_one_shard_at_a_time(small_dataset, backend):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, shuffle_window=1, seed=4, backend=backend,
                         num_workers=0)
    shards = [int(label) // 7 // SHARD for b in loader for label in b["label"]]
    stretches = [shards[0]] + [s for prev, s in zip(shards, shards[1:]) if s != prev]
    assert sorted(stretches) == [0, 1, 2, 3]  # each shard read in one stretch, one shard after another
    whole = torch.cat([b["label"] for b in loader]) // 7
    assert sorted(whole.tolist()) == list(range(103))
    plain = [int(x) for x in torch.cat([b["label"] for b in ShardLoader(small_dataset, batch_size=10)]) // 7]
    assert whole.tolist() != plain  # shuffled within the shard


def test_a_window_as_large_as_the_dataset_mixes_every_shard(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=20, shuffle=True, shuffle_window=4, seed=1)
    assert max(len(shard_of(b)) for b in loader) == 4


def test_ranks_read_the_same_window_at_the_same_time(small_dataset):
    world = 2
    per_rank = [list(ShardLoader(small_dataset, batch_size=5, shuffle=True, shuffle_window=1, seed=9, rank=r,
                                 world_size=world)) for r in range(world)]
    for step in range(len(per_rank[0])):  # 10 samples per step: at most the shard boundary crossed once
        together = sorted(set(shard_of(per_rank[0][step]) + shard_of(per_rank[1][step])))
        assert len(together) <= 2 and (len(together) == 1 or step > 0)


def test_a_state_of_another_window_or_of_a_global_shuffle_is_refused(small_dataset):
    state = ShardLoader(small_dataset, batch_size=7, shuffle=True, shuffle_window=2).state_dict()
    assert state["sampling"]["mode"] == "shard_window" and state["sampling"]["window"] == 2
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, batch_size=7, shuffle=True, shuffle_window=3).load_state_dict(state)
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, batch_size=7, shuffle=True).load_state_dict(state)
    plain = ShardLoader(small_dataset, batch_size=7, shuffle=True).state_dict()
    with pytest.raises(StateError, match="sampling"):
        ShardLoader(small_dataset, batch_size=7, shuffle=True, shuffle_window=2).load_state_dict(plain)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"shuffle_window": 2}, ArgumentError, "pass shuffle=True with it"),
    ({"shuffle": True, "shuffle_window": 0}, ArgumentError, "positive number of shards, not 0"),
    ({"shuffle": True, "shuffle_window": -3}, ArgumentError, "positive number of shards, not -3"),
    ({"shuffle": True, "shuffle_window": True}, ArgumentTypeError, "positive number of shards, not True"),
    ({"shuffle": True, "shuffle_window": 1.5}, ArgumentTypeError, "positive number of shards, not 1.5"),
    ({"shuffle": True, "shuffle_window": "2"}, ArgumentTypeError, "positive number of shards, not '2'"),
    ({"shuffle": True, "shuffle_window": 2, "indices": [1, 2]}, ArgumentError, "does not combine with indices"),
])
def test_arguments_it_does_not_take_are_refused(small_dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        ShardLoader(small_dataset, batch_size=4, **kwargs)


def test_weights_and_mixtures_are_refused(small_dataset):
    with pytest.raises(ArgumentError, match="does not combine with sample_weights"):
        ShardLoader(small_dataset, batch_size=4, shuffle_window=2, sample_weights=np.ones(103))
    mixed = fastload.mix([small_dataset, small_dataset], weights=[1, 1], stop="first_exhausted")
    with pytest.raises(ArgumentError, match="does not combine with a mixture"):
        ShardLoader(mixed, batch_size=4, shuffle=True, shuffle_window=2)
