"""Floors for each dataset, measured in the same run as the loaders.

``memcpy``: numpy copying the bytes one epoch decodes, one thread (the bandwidth bound for raw data).
``decode-1t``: the extension's own record decoder over the same records laid end to end in memory,
one thread, no Python per record (the bound a single core sets for zstd data).
``lmdb-lookup``: finding every sample's record in the shuffled order, no decoding (since the
shards are validated up front this is an index into the mapping, no LMDB B-tree descent).

A loader's ``ratio_to_floor`` is its samples/s over memcpy (raw data) or decode-1t (compressed data).
"""

from __future__ import annotations

import pytest
from conftest import DATASETS
from datasets import QUICK
from measure import EpochResult, MemorySampler, extra_info, one_call_round

FLOORS = {"floor-memcpy": "memcpy", "floor-decode-1t": "decode", "floor-lmdb-lookup": "lookup"}
ROUNDS = {"rounds": 1} if QUICK else {"rounds": 5, "warmup_rounds": 1}


@pytest.mark.parametrize("floor_name", list(FLOORS))
@pytest.mark.parametrize("ds", DATASETS, ids=lambda d: d.name)
def test_floor(benchmark, floors, ds, floor_name):
    floor = floors(ds)
    benchmark.group = ds.name
    result = EpochResult()
    with MemorySampler() as memory:
        benchmark.pedantic(one_call_round(getattr(floor, "make_" + FLOORS[floor_name])(), ds.count, result),
                           **ROUNDS)
    benchmark.extra_info.update(extra_info(result, ds.sample_bytes, floor.for_codec(ds.codec), memory))
    assert benchmark.extra_info["samples_per_s"] > 0
