import json

import numpy as np
import pytest
from conftest import BACKENDS, batches_equal

import fastload
from fastload import ShardLoader, StateError


def take(it, k):
    return [{key: t.clone() for key, t in next(it).items()} for _ in range(k)]


def run_resume_check(make_loader, stop_after, epoch=0):
    """Save after `stop_after` batches of `epoch`, load into a new loader, compare with an uninterrupted run."""
    reference = make_loader()
    reference.set_epoch(epoch)
    full = [{k: t.clone() for k, t in b.items()} for b in reference] + list(reference)  # this epoch and the next

    first = make_loader()
    first.set_epoch(epoch)
    it = iter(first)
    head = take(it, stop_after)
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON, no pickle
    del it

    second = make_loader()
    second.load_state_dict(state)
    tail = list(second) + list(second)
    assert batches_equal(head + tail[: len(full) - stop_after], full)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stop_after", [0, 1, 5, 10, 11])
def test_resume_mid_epoch_start_end_and_next_epoch(small_dataset, backend, stop_after):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=4, backend=backend, num_workers=0)

    run_resume_check(make, stop_after, epoch=2)


def test_resume_with_drop_last_and_another_batch_size(small_dataset):
    run_resume_check(lambda: ShardLoader(small_dataset, batch_size=8, shuffle=True, drop_last=True), 6)
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True)
    it = iter(loader)
    seen = [b["label"] for b in take(it, 3)]
    state = loader.state_dict()
    assert state["position"] == 30 and state["epoch"] == 0
    other = ShardLoader(small_dataset, batch_size=7, shuffle=True)
    other.load_state_dict(state)
    rest = [b["label"] for b in other]
    labels = np.concatenate([t.numpy() for t in seen + rest])
    assert sorted(labels.tolist()) == [7 * i for i in range(103)]


def test_state_after_a_finished_epoch_points_at_the_next(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=50)
    list(loader)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0


@pytest.mark.parametrize(("saved_world", "resumed_world"), [(4, 2), (2, 4), (3, 1), (1, 3)])
def test_elastic_resume_continues_the_global_sequence(small_dataset, saved_world, resumed_world):
    batch, steps = 4, 3
    seen, states = [], []
    for rank in range(saved_world):
        loader = ShardLoader(small_dataset, batch_size=batch, shuffle=True, seed=9, rank=rank,
                             world_size=saved_world)
        it = iter(loader)
        seen += [b["label"] for b in take(it, steps)]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states) and states[0]["position"] == batch * steps * saved_world
    for rank in range(resumed_world):
        loader = ShardLoader(small_dataset, batch_size=batch, shuffle=True, seed=9, rank=rank,
                             world_size=resumed_world)
        loader.load_state_dict(states[0])
        seen += [b["label"] for b in loader]
    labels = np.concatenate([t.numpy() for t in seen]).tolist()
    assert set(labels) == {7 * i for i in range(103)}  # nothing skipped
    remaining = 103 - batch * steps * saved_world
    padding = -(-remaining // resumed_world) * resumed_world - remaining
    assert len(labels) == 103 + padding  # nothing seen twice but the final wrap-around padding


def test_state_errors(small_dataset, tmp_path):
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=1)
    state = loader.state_dict()
    other = tmp_path / "other"
    fastload.write_arrays(other, {"label": np.arange(103, dtype=np.int64)})
    with pytest.raises(StateError, match="another dataset"):
        ShardLoader(other, batch_size=10, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match="state_version 99"):
        loader.load_state_dict({**state, "state_version": 99})
    with pytest.raises(StateError, match="order_version"):
        loader.load_state_dict({**state, "order_version": 0})
    with pytest.raises(StateError, match="seed=1, this loader has seed=2"):
        ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(StateError, match="invalid epoch"):
        loader.load_state_dict({**state, "position": 104})
    with pytest.raises(StateError, match="is a dict"):
        loader.load_state_dict([1, 2])


def _stop(loader, pattern, k):
    """Read ``k`` batches of a pass and return them with the state saved as ``pattern`` saves it."""
    if pattern == "full pass":
        return [{key: t.clone() for key, t in b.items()} for b in loader], loader.state_dict()
    head = []
    for batch in loader:
        head.append({key: t.clone() for key, t in batch.items()})
        if len(head) == k:
            if pattern == "in the loop":
                state = loader.state_dict()
            break
    if pattern == "after break":
        state = loader.state_dict()
    return head, json.loads(json.dumps(state))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ["in the loop", "after break", "full pass"])
@pytest.mark.parametrize("k", [1, 3, 10])
def test_state_saved_in_the_loop_after_break_or_after_a_pass_resumes_where_the_data_stopped(
        small_dataset, backend, pattern, k):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=5, backend=backend, num_workers=0)

    reference = make()
    reference.set_epoch(1)
    full = list(reference) + list(reference)
    loader = make()
    loader.set_epoch(1)
    head, state = _stop(loader, pattern, k)
    expected = (2, 0) if pattern == "full pass" else (1, 10 * k)
    assert (state["epoch"], state["position"]) == expected
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(resumed) + list(resumed)
    assert batches_equal(head + tail[: len(full) - len(head)], full)  # 3 + 8 batches, not 3 + 11


@pytest.mark.parametrize("backend", BACKENDS)
def test_after_break_the_same_loader_reads_the_next_epoch_and_keeps_len_and_set_epoch(small_dataset, backend):
    def make():
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=5, backend=backend, num_workers=0)

    reference = make()
    epochs = [list(reference) for _ in range(3)]
    loader = make()
    head, state = _stop(loader, "after break", 3)
    assert (state["epoch"], state["position"]) == (0, 30) and loader.state_dict() == state  # saving twice: same
    assert loader.epoch == 1 and loader.remaining() == len(loader) == 11  # the next pass: epoch 1 from its start
    assert list(loader.batch_sampler) == [b["label"].div(7).long().tolist() for b in epochs[1]]
    assert batches_equal(list(loader), epochs[1])  # the advance happens when the next pass begins
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (2, 0)
    _stop(loader, "after break", 2)
    loader.set_epoch(2)  # a trainer's hook for the epoch after the abandoned one: from its start
    assert loader.state_dict()["position"] == 0 and batches_equal(list(loader), epochs[2])
    _stop(loader, "after break", 2)  # epoch 3, abandoned
    loader.set_epoch(3)  # the abandoned epoch itself: from its start, as DistributedSampler.set_epoch
    reference.set_epoch(3)
    assert loader.remaining() == 11 and batches_equal(list(loader), list(reference))


def test_state_after_break_with_two_ranks_resumes_each_rank(small_dataset):
    def make(rank):
        return ShardLoader(small_dataset, batch_size=4, shuffle=True, seed=9, rank=rank, world_size=2)

    states, seen = [], []
    for rank in range(2):
        head, state = _stop(make(rank), "after break", 5)
        states.append(state)
        seen += [b["label"] for b in head]
    assert states[0] == states[1] and (states[0]["epoch"], states[0]["position"]) == (0, 40)
    for rank in range(2):
        resumed = make(rank)
        resumed.load_state_dict(states[0])
        seen += [b["label"] for b in resumed]
    labels = np.concatenate([t.numpy() for t in seen]).tolist()
    assert set(labels) == {7 * i for i in range(103)} and len(labels) == 104  # one wrap-around pad


def test_state_refuses_other_transforms_naming_the_difference(small_dataset):
    from fastload.transforms import Normalize, RandomCrop, RandomFlip

    def make(**kw):
        return ShardLoader(small_dataset, batch_size=10, shuffle=True, seed=1, **kw)

    chain = [RandomCrop(2, padding=1), RandomFlip(p=0.5), Normalize(127.5, 64.0)]
    loader = make(transforms=chain)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    make(transforms=[RandomCrop(2, padding=1), RandomFlip(p=0.5), Normalize(127.5, 64.0)]).load_state_dict(state)
    with pytest.raises(StateError, match=r"transforms.*op 1.*RandomFlip\(.*p=0\.5.*\).*RandomFlip\(.*p=0\.7"):
        make(transforms=[RandomCrop(2, padding=1), RandomFlip(p=0.7), Normalize(127.5, 64.0)]).load_state_dict(state)
    with pytest.raises(StateError, match=r"transforms.*this loader has none"):
        make().load_state_dict(state)
    with pytest.raises(StateError, match=r"saved without transforms.*RandomFlip"):
        make(transforms=[RandomFlip()]).load_state_dict(json.loads(json.dumps(make().state_dict())))
    with pytest.raises(StateError, match=r"layout='chw'.*layout='hwc'"):
        make(transforms=chain, layout="hwc").load_state_dict(state)
    make(layout="hwc").load_state_dict(make().state_dict())  # without transforms the layout changes nothing


def test_state_refuses_a_batch_transform_present_on_one_side_only(small_dataset):
    def jitter(batch, generator):
        return batch

    with_fn = ShardLoader(small_dataset, batch_size=10, batch_transform=jitter)
    state = with_fn.state_dict()
    assert state["batch_transform"].endswith("jitter")
    ShardLoader(small_dataset, batch_size=10, batch_transform=lambda b, g: b).load_state_dict(state)  # not comparable
    with pytest.raises(StateError, match=r"batch_transform=.*jitter.*this loader has no batch_transform"):
        ShardLoader(small_dataset, batch_size=10).load_state_dict(state)


def test_a_state_without_the_transform_fields_is_not_checked_for_them(small_dataset):
    from fastload.transforms import RandomFlip

    old = ShardLoader(small_dataset, batch_size=10, shuffle=True).state_dict()
    for key in ("transforms", "layout", "batch_transform"):
        del old[key]  # as saved by a fastload before these fields
    loader = ShardLoader(small_dataset, batch_size=10, shuffle=True, transforms=[RandomFlip()],
                         batch_transform=lambda b, g: b)
    loader.load_state_dict(old)
    assert loader.remaining() == 11
