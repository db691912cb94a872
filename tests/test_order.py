import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import _native
from fastload.sampling._order import ORDER_VERSION, EpochOrder, mix64, num_batches

VECTORS = json.loads((Path(__file__).parent / "data" / "order_vectors.json").read_text())


def test_vectors_are_for_this_version():
    assert VECTORS["order_version"] == ORDER_VERSION == 1


def test_mix64_is_splitmix64():
    # SplitMix64's first output for state 0 is 0xE220A8397B1DCDAF, an independent reference.
    assert mix64(0) == 0xE220A8397B1DCDAF
    for z, expected in VECTORS["mix64"]:
        assert mix64(z) == expected
        assert _native.mix64(z) == expected


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: f"s{c['seed']}-e{c['epoch']}-n{c['n']}")
def test_python_and_cpp_reproduce_committed_vectors(case):
    n = case["n"]
    head, tail = len(case["first"]), len(case["last"])
    order = EpochOrder(case["seed"], case["epoch"], n)
    assert order.positions(0, head).tolist() == case["first"]
    assert order.positions(n - tail, n).tolist() == case["last"]
    assert _native.permutation(case["seed"], case["epoch"], n, 0, head).tolist() == case["first"]
    assert _native.permutation(case["seed"], case["epoch"], n, n - tail, tail).tolist() == case["last"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**20), n=st.integers(0, 3000))
def test_is_a_permutation_and_both_languages_agree(seed, epoch, n):
    py = EpochOrder(seed, epoch, n).positions(0, n)
    cpp = _native.permutation(seed, epoch, n, 0, n)
    assert np.array_equal(py, cpp)
    assert np.array_equal(np.sort(py), np.arange(n, dtype=np.uint64))


def test_any_position_can_be_evaluated_alone():
    order = EpochOrder(5, 1, 10_000)
    full = order.positions(0, 10_000)
    assert np.array_equal(order.positions(1234, 1300), full[1234:1300])
    assert np.array_equal(_native.permutation(5, 1, 10_000, 9990, 10), full[9990:])


def test_epochs_and_seeds_give_different_orders():
    n = 1000
    base = EpochOrder(0, 0, n).positions(0, n)
    for other in (EpochOrder(0, 1, n), EpochOrder(1, 0, n)):
        assert (other.positions(0, n) == base).mean() < 0.02


def test_no_shuffle_is_sequential():
    assert EpochOrder(9, 9, 10, shuffle=False).positions(0, 10).tolist() == list(range(10))


def test_negative_seed_wraps_mod_2_64():
    assert np.array_equal(EpochOrder(-1, 0, 50).positions(0, 50), EpochOrder(2**64 - 1, 0, 50).positions(0, 50))


def test_bad_arguments():
    with pytest.raises(ValueError, match="outside"):
        EpochOrder(0, 0, 10).positions(5, 11)
    with pytest.raises(ValueError, match="exceeds n"):
        _native.permutation(0, 0, 10, 5, 6)
    with pytest.raises(ValueError, match="non-negative"):
        EpochOrder(0, -1, 10)


@pytest.mark.parametrize(("n", "bs", "drop", "expected"), [(10, 3, False, 4), (10, 3, True, 3), (0, 4, False, 0),
                                                           (5, 8, False, 1), (5, 8, True, 0)])
def test_num_batches(n, bs, drop, expected):
    assert num_batches(n, bs, drop) == expected
