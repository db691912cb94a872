"""Reads damaged copies of a dataset with both readers (run by test_damage.py, one batch of trials per process).

stdin: JSON {"trials": [{"id", "dataset", "patches": [[offset, hex bytes], ...]}], "workdir": dir}; a trial may
name another "reference" dataset to compare with, or "control": "abort" (the harness's self-checks).
stdout: one JSON line per trial as it finishes: {"id", "native": verdict, "torch": verdict}, where a verdict
is "ok" (every sample equals the undamaged one), "typed:<error class>" (a fastload error after only
correct samples), "wrong:<where>" or "untyped:<class>: <message>", and "validators": whether the native and
the pure-Python structure validators agree. A crash or a hang shows as a trial without its result line.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

import fastload
from fastload.errors import FastloadError
from fastload.format._lmdb_check import validate_shard

SHARD = "shard-00000.lmdb"


def reference(dataset: str, cache: dict) -> list[dict[str, np.ndarray]]:
    if dataset not in cache:
        ds = fastload.ShardDataset(dataset)
        cache[dataset] = [{k: v.numpy().copy() for k, v in ds[i].items()} for i in range(len(ds))]
        ds.close()
    return cache[dataset]


def same(sample: dict, expected: dict) -> bool:
    return sample.keys() == expected.keys() and all(
        sample[k].shape == expected[k].shape and np.array_equal(sample[k], expected[k]) for k in sample)


def read_native(path: Path, expected: list[dict]) -> str:
    loader = fastload.ShardLoader(path, batch_size=16, backend="native", num_threads=1)
    i = 0
    for batch in loader:
        arrays = {k: v.numpy() for k, v in batch.items()}
        for j in range(len(next(iter(arrays.values())))):
            if i >= len(expected) or not same({k: v[j] for k, v in arrays.items()}, expected[i]):
                return f"wrong:sample {i}"
            i += 1
    return "ok" if i == len(expected) else f"wrong:{i} samples"


def read_torch(path: Path, expected: list[dict]) -> str:
    ds = fastload.ShardDataset(path)
    try:
        if len(ds) != len(expected):
            return f"wrong:{len(ds)} samples"
        for i in range(len(ds)):
            if not same({k: v.numpy() for k, v in ds[i].items()}, expected[i]):
                return f"wrong:sample {i}"
        return "ok"
    finally:
        ds.close()


def verdict(read, path: Path, expected: list[dict]) -> str:
    try:
        return read(path, expected)
    except FastloadError as err:
        return f"typed:{type(err).__name__}"
    except Exception as err:  # noqa: BLE001 - an untyped error is what the test reports
        return f"untyped:{type(err).__name__}: {err}"


def validators_agree(shard: Path, count: int, packed: bool) -> str:
    """Run the native and the pure-Python validator on one file; "same" when they give the same verdict."""
    verdicts = []
    for native in (True, False):
        try:
            validate_shard(str(shard), count, use_native=native, packed=packed)
            verdicts.append("valid")
        except FastloadError as err:
            verdicts.append(f"{type(err).__name__}: {err}")
    return "same" if verdicts[0] == verdicts[1] else f"differ: native {verdicts[0]!r}, python {verdicts[1]!r}"


def main() -> None:
    job = json.load(sys.stdin)
    cache: dict = {}
    workdir = Path(job["workdir"])
    for trial in job["trials"]:
        expected = reference(trial.get("reference", trial["dataset"]), cache)
        path = workdir / f"trial-{trial['id']}"
        shutil.copytree(trial["dataset"], path)
        data = bytearray((path / SHARD).read_bytes())
        for offset, value in trial["patches"]:
            raw = bytes.fromhex(value)
            data[offset:offset + len(raw)] = raw
        (path / SHARD).write_bytes(bytes(data))
        print(json.dumps({"id": trial["id"], "starting": "validators"}), flush=True)
        packed = json.loads((path / "manifest.json").read_text())["format_version"] >= 4  # v4: blocks of records
        result = {"id": trial["id"], "validators": validators_agree(path / SHARD, len(expected), packed)}
        for name, read in (("native", read_native), ("torch", read_torch)):
            print(json.dumps({"id": trial["id"], "starting": name}), flush=True)
            if trial.get("control") == "abort":  # the harness's own check: a crash is caught and reported
                os.abort()
            result[name] = verdict(read, path, expected)
        shutil.rmtree(path)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
