"""Sampling version 1: the counter stream, the alias table, the exact logarithm and the committed golden vectors."""

from __future__ import annotations

import json
import math
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import SAMPLING_VERSION
from fastload.sampling._alias import GAMMA, AliasTable, quantize, stream_base, word, words
from fastload.sampling._exactlog import neg_log
from fastload.sampling._order import mix64
from fastload.sampling._sampling import MixSampling, SubsetSampling, WeightedSampling

VECTORS = json.loads((Path(__file__).parent / "data" / "sampling_vectors.json").read_text())
MASK = 2**64 - 1


def fromhex(h: str) -> float:
    return float(struct.unpack(">d", bytes.fromhex(h))[0])


def test_vectors_are_for_this_version():
    assert VECTORS["sampling_version"] == SAMPLING_VERSION == 1


@pytest.mark.parametrize("case", VECTORS["streams"], ids=lambda c: f"s{c['seed']}-e{c['epoch']}")
def test_streams_are_splitmix64_from_the_keyed_state(case):
    base = stream_base(case["seed"], case["epoch"], case["tag"])
    assert base == case["base"]
    assert words(base, np.arange(8, dtype=np.uint64)).tolist() == case["words"]
    state, reference = base, []  # SplitMix64 as published: state += gamma, then the finaliser
    for _ in range(8):
        state = (state + GAMMA) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        reference.append(z ^ (z >> 31))
    assert reference == case["words"] == [word(base, p) for p in range(8)]
    assert base == mix64(mix64(mix64(case["seed"] & MASK) ^ case["epoch"]) ^ case["tag"])


@pytest.mark.parametrize("case", VECTORS["alias_tables"], ids=lambda c: f"{len(c['weights'])}w")
def test_alias_tables_reproduce_committed_vectors(case):
    table = AliasTable(quantize(case["weights"]))
    assert table.threshold.tolist() == case["threshold"] and table.alias.tolist() == case["alias"]
    base = stream_base(7, 3, 0x5745494748545331)
    r = words(base, np.arange(32, dtype=np.uint64))
    assert table.draw(r).tolist() == case["draws_seed7_epoch3"]
    assert [table.draw_one(int(x)) for x in r] == case["draws_seed7_epoch3"]


def exact_probabilities(table: AliasTable) -> list[Fraction]:
    """The probability of each index under the table, from its columns (coin resolution 2**-32)."""
    n, probs = table.n, [Fraction(0)] * table.n
    for c in range(n):
        keep = Fraction(int(table.threshold[c]), 2**32)
        probs[c] += keep / n
        probs[int(table.alias[c])] += (1 - keep) / n
    return probs


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40).filter(lambda w: max(w) > 0))
def test_alias_table_probabilities_are_the_weights(weights):
    q = quantize(weights)
    table = AliasTable(q)
    total = sum(q)
    for p, qi in zip(exact_probabilities(table), q):
        assert abs(p - Fraction(qi, total)) <= Fraction(len(q), 2**32)
        if qi == 0:
            assert p == 0  # a zero weight is never drawn


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**52), min_size=1, max_size=30).filter(lambda q: sum(q) > 0),
       st.lists(st.integers(0, MASK), min_size=1, max_size=50))
def test_vectorized_draws_equal_the_scalar_reference(q, rs):
    table = AliasTable(q)
    assert table.draw(np.array(rs, dtype=np.uint64)).tolist() == [table.draw_one(r) for r in rs]


def test_neg_log_bit_patterns_and_accuracy():
    for u_hex, expected in VECTORS["neg_log"]:
        u = fromhex(u_hex)
        got = float(neg_log(np.array([u]))[0])
        assert struct.pack(">d", got).hex() == expected
        if u < 1.0:
            assert abs(got - -math.log(u)) <= 4e-16 * abs(math.log(u)) + 1e-300
    u = np.random.default_rng(0).uniform(1e-12, 1.0, 100_000)
    assert np.allclose(neg_log(u), -np.log(u), rtol=1e-15, atol=1e-16)


@pytest.mark.parametrize("case", VECTORS["epochs"], ids=lambda c: f"{c['mode']}-{c.get('stop', '')}-{c['seed']}")
def test_sampling_epochs_reproduce_committed_vectors(case):
    if case["mode"] == "weights":
        order = WeightedSampling(np.linspace(0.1, 2.0, 50), case["num_samples"],
                                 case["replacement"]).epoch_order(case["seed"], case["epoch"], 50, False)
    elif case["mode"] == "subset":
        order = SubsetSampling(np.arange(100, 0, -7, dtype=np.uint64)).epoch_order(case["seed"], case["epoch"],
                                                                                   101, True)
    else:
        mix = MixSampling(case["sizes"], case["weights"], case["stop"])
        assert mix.sources(case["seed"], case["epoch"]).tolist() == case["sources"]
        order = mix.epoch_order(case["seed"], case["epoch"], sum(case["sizes"]), case["shuffle"])
    assert order.indices().tolist() == case["indices"]
    assert order.at(np.arange(order.n)[::-1]).tolist() == case["indices"][::-1]


def test_quantize_is_relative_to_the_largest_weight():
    assert quantize([2.0, 1.0, 0.0]) == [2**52, 2**51, 0]
    assert quantize([3.0, 1e-300]) == [2**52, 0]  # below max * 2**-52: never drawn (documented)
    with pytest.raises(ValueError, match=r"weights\[1\] is inf"):
        quantize([1.0, math.inf])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        quantize([])
