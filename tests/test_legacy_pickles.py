"""Loaders, datasets and states pickled by an older fastload still load and resume.

``tests/data/legacy_pickles/pickles.pkl`` was written by main at commit 012670a, before the package
was grouped into stage folders (issue 12): its classes are named by their old module paths
(``fastload._loader.ShardLoader``, ``fastload._format.Field``, ``fastload._compose.MixedShardDataset``...).
The dataset they refer to is ``./dataset`` (relative), rebuilt here from the same arrays.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import pytest
from conftest import batches_equal

import fastload
from fastload.transforms import RandomCrop, RandomFlip

HERE = Path(__file__).parent / "data" / "legacy_pickles"


def _writer():
    spec = importlib.util.spec_from_file_location("make_pickles", HERE / "make_pickles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def legacy(tmp_path, monkeypatch):
    """The old pickles, unpickled in a directory holding their dataset."""
    monkeypatch.chdir(tmp_path)
    fastload.write_arrays("dataset", _writer().arrays(), samples_per_shard=16)
    _rewrite_as_format_2(Path("dataset"))  # the pickles hold the manifest of a format 2 dataset
    with open(HERE / "pickles.pkl", "rb") as f:
        saved = pickle.load(f)
    assert saved["fastload"] == "0.1.0"
    return {name: pickle.loads(blob) for name, blob in saved["blobs"].items()}


def _rewrite_as_format_2(directory: Path) -> None:
    """Rewrite a dataset as fastload wrote it when the pickles were made (format 2)."""
    from fastload.conversion._shard_writer import write_shard
    from fastload.format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
    from fastload.format._record import RecordEncoder

    ds = fastload.ShardDataset(directory)
    m = ds.manifest
    encoder = RecordEncoder(m.fields, version=2)
    shards, start = [], 0
    for index, shard in enumerate(m.shards):
        records = [encoder.encode(dict(zip([f.name for f in m.fields], ds.read_arrays(i))))
                   for i in range(start, start + shard.count)]
        start += shard.count
        shards.append(write_shard(directory, index, records))
    ds.close()
    write_json_atomic(directory / MANIFEST_NAME, Manifest(m.fields, shards, m.provenance, m.extra, 2).to_json())


def test_the_pickles_name_the_old_module_paths():
    raw = (HERE / "pickles.pkl").read_bytes()
    for old in (b"fastload._loader", b"fastload._dataset", b"fastload._format", b"fastload._compose"):
        assert old in raw  # so this file keeps testing the compatibility aliases


def test_a_native_loader_resumes_where_it_was_pickled(legacy):
    loader, state = legacy["native_loader"], legacy["native_state"]
    assert isinstance(loader, fastload.ShardLoader) and loader.backend == "native"
    assert (state["epoch"], state["position"]) == (0, 8)
    new = loader.state_dict()  # a state of today also records the augmentation (none here)
    assert {**{k: new[k] for k in state}, "format_version": 2} == state  # states now say format 4: the same positions
    assert {k: new[k] for k in new.keys() - state.keys()} == {"transforms": [], "layout": None, "batch_transform": None}
    fresh = fastload.ShardLoader("dataset", batch_size=4, shuffle=True, seed=7, num_threads=2)
    fresh.load_state_dict(state)
    assert batches_equal(list(loader), list(fresh))


def test_a_torch_loader_with_transforms_and_weights_resumes(legacy):
    loader = legacy["torch_loader"]
    assert loader.backend == "torch" and loader.state_dict()["position"] == 4
    fresh = fastload.ShardLoader(fastload.ShardDataset("dataset"), batch_size=4, seed=8, backend="torch",
                                 num_workers=0, transforms=[RandomCrop(6), RandomFlip()], layout="hwc",
                                 sample_weights=legacy["torch_loader"]._init_kwargs["sample_weights"], num_samples=24)
    fresh.load_state_dict(loader.state_dict())
    got = list(loader)
    assert len(got) == 5 and batches_equal(got, list(fresh))


@pytest.mark.parametrize("name", ["subset_loader", "concat_loader", "mix_loader"])
def test_loaders_over_subsets_concatenations_and_mixtures(legacy, name):
    loader = legacy[name]
    ds = fastload.ShardDataset("dataset")
    fresh = {"subset_loader": lambda: fastload.ShardLoader(ds.subset([3, 1, 4, 15, 9, 26]), batch_size=2, seed=9),
             "concat_loader": lambda: fastload.ShardLoader(fastload.concat([ds, ds]), batch_size=8, seed=10),
             "mix_loader": lambda: fastload.ShardLoader(fastload.mix([ds, ds], weights=[1, 3]), batch_size=8,
                                                        seed=11)}[name]()
    got = list(loader)
    assert got and batches_equal(got, list(fresh))


def test_a_dataset_a_field_and_an_order(legacy):
    ds = legacy["dataset"]
    assert isinstance(ds, fastload.ShardDataset) and len(ds) == 40
    assert ds[5]["label"].item() == 0 and ds[7]["label"].item() == 2
    assert isinstance(legacy["field"], fastload.Field) and legacy["field"] == ds.fields[0]
    order = legacy["order"]
    assert isinstance(order, fastload.EpochOrder)
    assert list(order.positions(0, 40)) == list(fastload.EpochOrder(3, 1, 40).positions(0, 40))


def test_every_old_module_path_is_an_alias_of_its_new_module():
    import importlib
    import sys

    from fastload._moved import MOVED

    assert "_loader" in MOVED and "_format" in MOVED
    for old, new in MOVED.items():
        alias = importlib.import_module(f"fastload.{old}")
        target = importlib.import_module(f"fastload.{new}")
        assert alias is target and sys.modules[f"fastload.{old}"] is target
        assert target.__name__ == f"fastload.{new}" and target.__spec__.name == f"fastload.{new}"


def test_a_monkeypatch_through_an_old_path_reaches_the_new_module(monkeypatch):
    import fastload._manifest as old  # the old path
    from fastload.format import _manifest

    monkeypatch.setattr(old, "MANIFEST_NAME", "other.json")
    assert _manifest.MANIFEST_NAME == "other.json"
    monkeypatch.undo()
    assert _manifest.MANIFEST_NAME == "manifest.json"


def test_an_unknown_private_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        import fastload._no_such_module  # noqa: F401
