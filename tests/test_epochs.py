"""Epochs as DataLoader + DistributedSampler users know them: len, completion, set_epoch hooks, abandoned passes."""

import json
import pickle

import pytest
import torch
from conftest import BACKENDS, batches_equal

import fastload
from fastload import ShardLoader

ALL = [7 * i for i in range(103)]


def labels(batches):
    return [b["label"].tolist() for b in batches]


def flat(batches):
    return sum(labels(batches), [])


def clone(batch):
    return {k: v.clone() for k, v in batch.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_epoch_advances_with_the_last_batch_not_on_an_extra_next(small_dataset, backend):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, backend=backend, num_workers=0)
    it = iter(loader)
    for k in range(len(loader)):
        assert loader.epoch == loader.state_dict()["epoch"] == 0
        assert loader.remaining() == len(loader) - k
        next(it)
    assert loader.epoch == 1 and loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0
    assert loader.remaining() == len(loader) == 11 and len(it) == 0
    with pytest.raises(StopIteration):
        next(it)
    assert loader.epoch == 1  # the extra next() changes nothing


def test_a_trainer_that_stops_after_len_batches_gets_a_new_order_each_epoch(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    epochs = []
    for _ in range(3):  # like Lightning: len(loader) next() calls on a fresh iter(), never the final one
        it = iter(loader)
        epochs.append(flat(clone(next(it)) for _ in range(len(loader))))
    assert all(sorted(e) == ALL for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and loader.epoch == 3


def test_len_is_a_full_epoch_after_load_state_dict_and_remaining_is_the_rest(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=2)
    it = iter(loader)
    head = [clone(next(it)) for _ in range(4)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=2)
    resumed.load_state_dict(state)
    assert len(resumed) == 11 and resumed.remaining() == 7 and resumed.epoch == 0
    tail = list(resumed)
    assert len(tail) == 7 and sorted(flat(head + tail)) == ALL
    assert resumed.epoch == 1 and resumed.remaining() == 11 and len(list(resumed)) == 11


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampler_and_batch_sampler_set_epoch_reach_the_order(small_dataset, backend):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=3, backend=backend, num_workers=0)
    assert loader.batch_sampler.sampler is loader.sampler
    assert len(loader.sampler) == 103 and len(loader.batch_sampler) == 11
    loader.sampler.set_epoch(5)
    planned = list(loader.batch_sampler)
    assert list(loader.sampler) == sum(planned, [])
    got = labels(loader)
    assert got == [[7 * i for i in b] for b in planned]
    reference = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=3)
    reference.set_epoch(5)
    assert labels(reference) == got
    loader.batch_sampler.sampler.set_epoch(5)
    assert labels(loader) == got


def test_set_epoch_between_iter_and_the_first_batch_takes_effect(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    reference = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    reference.set_epoch(4)
    expected = labels(reference)
    it = iter(loader)  # Lightning calls iter() before its epoch hook calls set_epoch
    loader.sampler.set_epoch(4)
    assert labels(it) == expected


def test_abandoned_pass_without_set_epoch_moves_to_the_next_epoch(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    reference = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    full = [labels(reference) for _ in range(3)]
    for epoch in range(3):  # a loop that breaks early never sees the same batches twice
        for i, batch in enumerate(loader):
            assert batch["label"].tolist() == full[epoch][i]
            if i == 2:
                break
        assert loader.epoch == epoch + 1  # the next pass's epoch; the state says where this one stopped
        assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (epoch, 30)


def test_a_pass_that_never_started_changes_nothing(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    it = iter(loader)  # a trainer probing iter(loader), never drawing from it
    del it
    assert loader.epoch == 0 and flat(loader) == flat(ShardLoader(small_dataset, batch_size=10, shuffle=True))


def test_unshuffled_loader_reiterated_always_starts_at_zero_and_covers(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10)  # a validation loader, as Lightning re-iterates it
    for limit in (2, 5, None, 1):
        seen = []
        for i, batch in enumerate(loader):
            seen += batch["label"].tolist()
            if limit is not None and i + 1 == limit:
                break
        assert seen == ALL[: len(seen)] and len(seen) == (103 if limit is None else 10 * limit)


def test_set_epoch_keeps_a_loaded_position_and_other_epochs_start_at_zero(small_dataset):
    source = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=1)
    source.set_epoch(2)
    it = iter(source)
    head = [clone(next(it)) for _ in range(3)]
    state = source.state_dict()
    resumed = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    it = iter(resumed)  # Lightning's order on restore: load_state_dict, iter(), then set_epoch(current epoch)
    resumed.sampler.set_epoch(2)
    reference = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=1)
    reference.set_epoch(2)
    assert batches_equal(head + list(it), list(reference))
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    assert labels(resumed) == labels(reference)  # reference is at epoch 3 now


def test_set_epoch_during_a_pass_abandons_it(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    first = labels(ShardLoader(small_dataset, batch_size=10, shuffle=True))
    it = iter(loader)
    next(it)
    next(it)
    loader.set_epoch(0)  # DistributedSampler semantics: the epoch from its start
    assert loader.epoch == 0 and loader.remaining() == 11
    assert labels(loader) == first
    assert len(list(it)) == 9  # the detached pass still runs to its end, without moving the loader
    assert loader.epoch == 1


def test_a_second_pass_supersedes_the_first(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    reference = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    epochs = [labels(reference) for _ in range(2)]
    first = iter(loader)
    next(first)
    assert labels(loader) == epochs[1] and loader.epoch == 2


def test_distributed_settings_resolve_when_a_pass_starts(small_dataset, monkeypatch):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)  # built before the process group exists
    assert (loader.rank, loader.world_size, len(loader)) == (0, 1, 11)
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    parts = []
    for rank in (0, 1):
        monkeypatch.setattr(dist, "get_rank", lambda group=None, r=rank: r)
        assert (loader.rank, loader.world_size, len(loader)) == (rank, 2, 6)
        parts.append(flat(loader))
        loader.set_epoch(0)
    assert len(parts[0]) == len(parts[1]) == 52 and set(parts[0] + parts[1]) == set(ALL)
    explicit = ShardLoader(small_dataset, batch_size=10, rank=0, world_size=1)
    assert explicit.world_size == 1 and len(explicit) == 11  # explicit values never consult torch.distributed


def test_len_without_a_process_group_under_a_launcher_warns(small_dataset, monkeypatch):
    loader = ShardLoader(small_dataset, batch_size=10)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(RuntimeWarning, match="WORLD_SIZE=2 but torch.distributed is not initialised"):
        assert len(loader) == 11
    assert len(ShardLoader(small_dataset, batch_size=10, rank=1, world_size=2)) == 6  # explicit: no warning


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stop_after", [0, 4, 11])
def test_pickle_mid_epoch_resumes_like_state_dict(small_dataset, backend, stop_after):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=6, backend=backend, num_workers=0)

    loader = make()
    loader.set_epoch(1)
    it = iter(loader)
    head = [clone(next(it)) for _ in range(stop_after)]
    blob = pickle.dumps(loader)
    assert b"ShardSet" not in blob and b"weakref" not in blob
    copy = pickle.loads(blob)
    assert copy.state_dict() == loader.state_dict() and copy.epoch == loader.epoch
    assert copy.backend == backend and copy._shards is None  # shards open on the first pass
    from_state = make()
    from_state.load_state_dict(loader.state_dict())
    assert batches_equal(list(copy), list(from_state))
    reference = make()
    reference.set_epoch(1)
    uninterrupted = list(reference) + list(reference)
    assert batches_equal(head + list(pickle.loads(blob)), uninterrupted[: 22 if stop_after == 11 else 11])


def test_pickle_of_a_used_native_loader_and_dataset(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, backend="native")
    list(loader)
    assert loader._shards is not None
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.epoch == 1 and copy._shards is None and copy.dataset.path == loader.dataset.path
    assert len(list(copy)) == 11
    dataset = loader.dataset
    dataset[0]  # opens an LMDB environment in this process
    assert pickle.loads(pickle.dumps(dataset))._envs == {}


def test_batches_running_out_early_is_an_error_not_an_epoch_end(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10, backend="native")
    it = iter(loader)
    next(it)
    it._inner.close()  # the reader stops (as a closed native epoch does) with 10 batches still planned
    with pytest.raises(fastload.FastloadError, match="a pass over 11 batches stopped after 1"):
        next(it)
    assert loader.epoch == 1 and loader.remaining() == 11  # abandoned, not completed: the next pass reads epoch 1
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (0, 10)  # where the data stopped


@pytest.mark.parametrize("backend", BACKENDS)
def test_pickle_after_break_keeps_where_the_data_stopped_and_the_pending_advance(small_dataset, backend):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=6, backend=backend, num_workers=0)

    loader = make()
    for i, _ in enumerate(loader):
        if i == 2:
            break
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.state_dict() == loader.state_dict() and loader.state_dict()["position"] == 30
    assert copy.epoch == loader.epoch == 1
    assert labels(copy) == labels(loader)  # both read epoch 1 from its start
