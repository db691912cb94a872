"""Damage LMDB reports (not the record checksums) still surfaces as fastload's typed errors, never lmdb.*."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from shard_edit import read_blocks

import fastload
from fastload.errors import CorruptRecordError, CorruptShardError
from fastload.format._manifest import file_hash


@pytest.fixture
def dataset(tmp_path) -> Path:
    out = tmp_path / "ds"
    images = np.arange(12 * 3 * 32 * 32, dtype=np.uint32).astype(np.uint8).reshape(12, 3, 32, 32)
    fastload.write_arrays(out, {"image": images, "label": np.arange(12, dtype=np.int64)}, samples_per_shard=6)
    return out


def point_key_past_the_file(shard: Path, key: int) -> None:
    """Set the overflow page number of the leaf node holding record ``key`` beyond the file's last page.

    LMDB would say: page not found. Format v4: LMDB key *b* is block *b*, so it is the node of ``key``'s block.
    """
    sizes = [len(records) for records in read_blocks(shard)]
    block = next(b for b in range(len(sizes)) if key < sum(sizes[:b + 1]))
    data = bytearray(shard.read_bytes())
    node = b"\x01\x00\x08\x00" + block.to_bytes(8, "big")  # flags F_BIGDATA, key size 8, the block's key
    at = data.find(node)
    assert at >= 0 and data.find(node, at + 1) < 0
    data[at + len(node): at + len(node) + 8] = (0xFFFFFF).to_bytes(8, "little")
    shard.write_bytes(bytes(data))
    doc = json.loads((shard.parent / "manifest.json").read_text())
    doc["shards"][int(shard.stem[-5:])]["hash"] = file_hash(shard)  # a manifest that agrees with the damage
    (shard.parent / "manifest.json").write_text(json.dumps(doc))


def test_lmdb_errors_become_typed_errors_naming_shard_and_key(dataset):
    shard = dataset / "shard-00001.lmdb"
    point_key_past_the_file(shard, 2)
    ds = fastload.ShardDataset(dataset)
    with pytest.raises((CorruptRecordError, CorruptShardError), match=r"shard-00001\.lmdb") as err:
        ds[8]
    if isinstance(err.value, CorruptRecordError):
        assert err.value.record == 2 and "LMDB" in err.value.reason
    for backend in ("native", "torch"):
        with pytest.raises((CorruptRecordError, CorruptShardError), match=r"shard-00001\.lmdb"):
            list(fastload.ShardLoader(dataset, batch_size=4, backend=backend, num_workers=0))


def test_verify_reports_lmdb_damage_in_one_line_without_a_traceback(dataset):
    point_key_past_the_file(dataset / "shard-00000.lmdb", 4)
    r = run_cli("fastload", "verify", str(dataset))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert "shard-00000.lmdb" in r.stdout
    assert "1 problem(s)" in r.stdout.strip().splitlines()[-1]  # the summary


def test_the_library_raises_no_untyped_value_or_type_error():
    """Every ValueError / TypeError the package raises is a FastloadError too (ArgumentError, ArgumentTypeError),
    so ``except FastloadError`` catches every error a user can cause; a bare one is caught here at its line."""
    import ast

    bare = []
    for path in sorted((Path(fastload.__file__).parent).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(call, ast.Name) and call.id in ("ValueError", "TypeError", "RuntimeError"):
                    bare.append(f"{path.name}:{node.lineno} {call.id}")
    assert not bare, bare
