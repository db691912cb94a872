import numpy as np
import pytest

from fastload.loading._plan import BatchIndices, EpochPlan


def rank_positions(plan_kw, world):
    plans = [EpochPlan(world_size=world, rank=r, **plan_kw) for r in range(world)]
    return plans, [np.concatenate([p.batch_positions(b) for b in range(len(p))] or [np.array([], np.uint64)])
                   for p in plans]


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 103, 256])
@pytest.mark.parametrize("batch", [1, 5, 32])
def test_even_split_is_disjoint_equal_and_covering(world, n, batch):
    plans, parts = rank_positions({"n": n, "batch_size": batch}, world)
    assert len({len(p) for p in plans}) == 1  # same number of batches on every rank
    per_rank = -(-n // world)
    assert all(len(part) == per_rank for part in parts)
    everything = np.concatenate(parts)
    assert set(everything.tolist()) == set(range(n))  # covers the epoch
    padding = per_rank * world - n
    assert len(everything) - len(set(everything.tolist())) == padding  # only wrap-around padding repeats
    if padding == 0:
        for a in range(world):
            for b in range(a + 1, world):
                assert not set(parts[a].tolist()) & set(parts[b].tolist())


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 103])
def test_uneven_split_partitions_exactly(world, n):
    _, parts = rank_positions({"n": n, "batch_size": 4, "even_batches": False}, world)
    everything = np.concatenate(parts).tolist()
    assert sorted(everything) == list(range(n))


@pytest.mark.parametrize("world", range(1, 9))
def test_drop_last_drops_tails_only(world):
    plans, parts = rank_positions({"n": 103, "batch_size": 4, "drop_last": True}, world)
    assert len({len(p) for p in plans}) == 1
    everything = np.concatenate(parts).tolist()
    assert len(everything) == len(set(everything))
    assert all(len(part) % 4 == 0 for part in parts)
    assert 103 - len(everything) < 4 * world + world


def test_single_rank_is_the_plain_order():
    plan = EpochPlan(n=10, batch_size=4)
    assert [plan.batch_positions(b).tolist() for b in range(len(plan))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_resuming_from_a_position_covers_the_rest():
    for world in (1, 2, 3, 4):
        for start in (0, 17, 60, 103):
            _, parts = rank_positions({"n": 103, "batch_size": 5, "start": start}, world)
            assert set(np.concatenate(parts).tolist()) == set(range(start, 103))


def test_position_after():
    plan = EpochPlan(n=103, batch_size=5, world_size=4, rank=1, start=3)
    assert plan.position_after(0) == 3 and plan.position_after(2) == 43 and plan.position_after(99) == 103


def test_bad_plans():
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        EpochPlan(n=10, batch_size=2, world_size=2, rank=2)
    with pytest.raises(ValueError, match="start position 11"):
        EpochPlan(n=10, batch_size=2, start=11)


@pytest.mark.parametrize("plan", [
    EpochPlan(n=1000, batch_size=7),
    EpochPlan(n=1000, batch_size=7, drop_last=True, world_size=3, rank=2, start=101),
    EpochPlan(n=50, batch_size=8, world_size=4, rank=1, even_batches=False),
    EpochPlan(n=5, batch_size=64),
], ids=["one-rank", "three-ranks-resumed", "uneven", "one-partial-batch"])
@pytest.mark.parametrize("window", [1, 3, 32])
def test_batch_indices_by_window_equal_the_per_batch_values(plan, window):
    calls = []

    def to_indices(positions):
        calls.append(len(positions))
        return (positions * np.uint64(2654435761)) % np.uint64(1_000_003)  # any elementwise map of positions

    indices = BatchIndices(plan, to_indices, window)
    expected = [to_indices(plan.batch_positions(b)) for b in range(len(plan))]
    calls.clear()
    lag = 4  # the delivered batch trails the submitted one, as in the native backend
    for b in range(len(plan)):
        assert np.array_equal(indices(b), expected[b]), b
        if b >= lag:
            assert np.array_equal(indices(b - lag), expected[b - lag]), b - lag
    assert np.array_equal(indices(0), expected[0])  # a window long gone is worked out again
    assert len(calls) <= -(-len(plan) // window) * (2 if window <= lag else 1) + 2
    with pytest.raises(IndexError):
        indices(len(plan))
