"""Loaders, datasets and states pickled by an older fastload still load and resume.

``tests/data/legacy_pickles/pickles.pkl`` was written by main at commit 012670a, before the package
was grouped into stage folders (issue 12): its classes are named by their old module paths
(``fastload._loader.ShardLoader``, ``fastload._format.Field``, ``fastload._compose.MixedShardDataset``...).
The dataset they refer to is ``./dataset`` (relative), rebuilt here from the same arrays.
Importing an old path warns (a ``FutureWarning`` naming the new path and the removal, once per process
and path): each test that imports one first forgets the aliases already imported, so it sees its warning.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import pickle
import sys
import warnings
from pathlib import Path

import pytest
from conftest import batches_equal

import fastload
from fastload.transforms import RandomCrop, RandomFlip

HERE = Path(__file__).parent / "data" / "legacy_pickles"
DOCS = Path(__file__).parent.parent / "docs"


def _forget_old_paths(monkeypatch):
    """Drop the old paths imported so far (restored after the test), so that importing one warns again."""
    from fastload._moved import MOVED

    for old in MOVED:
        monkeypatch.delitem(sys.modules, f"fastload.{old}", raising=False)


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
    _forget_old_paths(monkeypatch)
    with pytest.warns(FutureWarning) as warned:
        loaded = {name: pickle.loads(blob) for name, blob in saved["blobs"].items()}
    said = " ".join(str(w.message) for w in warned)
    for old, new in (("_loader", "loading._loader"), ("_format", "format._record"), ("_compose", "loading._compose")):
        assert f"fastload.{old} is the old path of fastload.{new}" in said
    return loaded


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


def test_every_old_module_path_is_an_alias_of_its_new_module(monkeypatch):
    from fastload._moved import MOVED, REMOVED_IN

    assert "_loader" in MOVED and "_format" in MOVED
    _forget_old_paths(monkeypatch)
    for old, new in MOVED.items():
        with pytest.warns(FutureWarning, match=rf"^fastload\.{old} is the old path of fastload\.{new} .* {REMOVED_IN}"):
            alias = importlib.import_module(f"fastload.{old}")
        target = importlib.import_module(f"fastload.{new}")
        assert alias is target and sys.modules[f"fastload.{old}"] is target
        assert target.__name__ == f"fastload.{new}" and target.__spec__.name == f"fastload.{new}"


def test_an_old_path_warns_at_the_importing_line_once_per_process(monkeypatch):
    _forget_old_paths(monkeypatch)
    with pytest.warns(FutureWarning, match="fastload._verify is the old path") as warned:
        import fastload._verify  # noqa: F401
    assert [Path(w.filename).name for w in warned] == [Path(__file__).name]  # the user's line, not importlib's
    with warnings.catch_warnings():  # imported now: no second warning
        warnings.simplefilter("error")
        import fastload._verify  # noqa: F401, F811
        importlib.import_module("fastload._verify")


def test_the_removal_is_dated_in_the_code_and_the_upgrading_notes():
    from fastload._moved import REMOVAL_NOT_BEFORE, REMOVED_IN

    assert datetime.date.fromisoformat(REMOVAL_NOT_BEFORE) > datetime.date(2026, 11, 29)  # when the warning came
    notes = (DOCS / "upgrading.md").read_text()
    assert f"fastload {REMOVED_IN}" in notes and REMOVAL_NOT_BEFORE in notes


def test_a_monkeypatch_through_an_old_path_reaches_the_new_module(monkeypatch):
    _forget_old_paths(monkeypatch)
    with pytest.warns(FutureWarning, match="fastload._manifest is the old path of fastload.format._manifest"):
        import fastload._manifest as old  # the old path
    from fastload.format import _manifest

    monkeypatch.setattr(old, "MANIFEST_NAME", "other.json")
    assert _manifest.MANIFEST_NAME == "other.json"
    monkeypatch.undo()
    assert _manifest.MANIFEST_NAME == "manifest.json"


def test_an_unknown_private_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        import fastload._no_such_module  # noqa: F401
