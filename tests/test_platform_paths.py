"""Paths and file flags as Windows has them, exercised on Linux: non-ASCII dataset paths through every
reader, and the pure-Python validator without ``os.O_NONBLOCK`` (which Windows lacks).

The native core's Windows side (wide-character paths, backslashes, drive letters, sharing) runs under
Wine in ``make test-windows-core`` (csrc/tests/shard_tests.cpp).
"""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import BACKENDS, batches_equal

import fastload
from fastload.errors import CorruptShardError
from fastload.format._lmdb_check import validate_shard


@pytest.fixture
def unicode_dataset(small_dataset, tmp_path):
    out = tmp_path / "données 数据 Δ" / "ds é"
    shutil.copytree(small_dataset, out)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_ascii_dataset_path_reads_like_an_ascii_one(small_dataset, unicode_dataset, backend):
    kwargs = dict(batch_size=16, shuffle=True, seed=2, backend=backend, num_workers=0)
    assert batches_equal(list(fastload.ShardLoader(unicode_dataset, **kwargs)),
                         list(fastload.ShardLoader(small_dataset, **kwargs)))
    assert len(fastload.ShardDataset(unicode_dataset)) == 103


def test_non_ascii_shard_errors_name_the_file(unicode_dataset):
    shard = unicode_dataset / "shard-00001.lmdb"
    shard.write_bytes(shard.read_bytes()[:5000])
    for use_native in (True, False):
        with pytest.raises(CorruptShardError, match="données 数据 Δ"):
            validate_shard(str(shard), 30, use_native=use_native, packed=True)


def test_python_validator_without_o_nonblock(small_dataset, monkeypatch):
    shard = str(small_dataset / "shard-00000.lmdb")
    expected = validate_shard(shard, 30, use_native=False, packed=True)
    monkeypatch.delattr(os, "O_NONBLOCK")
    assert validate_shard(shard, 30, use_native=False, packed=True) == expected
    assert expected == validate_shard(shard, 30, use_native=True, packed=True)
    assert expected["page_size"] >= 4096
