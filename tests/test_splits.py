"""Dataset roots with splits: splits.json, stratified splits, info/verify/ShardLoader on the root."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import fastload
from fastload.errors import DatasetError


@pytest.fixture(scope="session")
def classes_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("classes")
    for cls, n in (("ant", 5), ("bee", 5), ("cat", 1)):
        (d / cls).mkdir()
        for i in range(n):
            np.save(d / cls / f"{cls}{i}.npy", np.full((16, 16), i, np.uint8))
    return d


@pytest.fixture(scope="session")
def split_root(tmp_path_factory, classes_dir) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("split") / "root"
    r = run_cli("preprocess_tiles", "--data-dir", str(classes_dir), "--output-dir", str(out), "--labels-from-dirs",
                "--tile-size", "8", "--val-fraction", "0.4", "--no-progress")
    assert r.returncode == 0, r.stderr
    return out, r.stdout, r.stderr


def test_stratified_split_and_per_split_summary(split_root):
    out, stdout, stderr = split_root
    index = json.loads((out / "splits.json").read_text())["splits"]
    assert index["val"]["class_counts"] == {"ant": 8, "bee": 8, "cat": 0}  # 2 of 5 images per class, 4 tiles each
    assert index["train"]["class_counts"] == {"ant": 12, "bee": 12, "cat": 4}
    assert index["train"]["sources"] == 7 and index["val"]["sources"] == 4
    assert "train: 28 samples from 7 source images; per class: ant 12, bee 12, cat 4" in stdout
    assert "val: 16 samples from 4 source images; per class: ant 8, bee 8, cat 0" in stdout
    assert "warning" not in stderr  # a class too small for val is reported on one line, not warned about
    assert "1 class(es) got no val image (too few images for --val-fraction 0.4): 'cat' (1 image)" in stdout
    val_paths = [s["path"] for s in json.loads((out / "val" / "manifest.json").read_text())["sources"]]
    assert sum(p.startswith("ant/") for p in val_paths) == 2 and sum(p.startswith("bee/") for p in val_paths) == 2


def test_split_root_opens_with_split(split_root):
    out = split_root[0]
    train = fastload.ShardDataset(out, split="train")
    assert len(train) == 28 and train.classes == ["ant", "bee", "cat"]
    loader = fastload.ShardLoader(out, batch_size=5, split="val", backend="torch", num_workers=0)
    assert sum(len(b["label"]) for b in loader) == 16
    with pytest.raises(DatasetError, match=r"a dataset root with splits 'train', 'val'; pass split="):
        fastload.ShardDataset(out)
    with pytest.raises(DatasetError, match=r"a dataset root with splits 'train', 'val'"):
        fastload.ShardLoader(out)
    with pytest.raises(DatasetError, match=r"no split 'test'; the splits are \['train', 'val'\]"):
        fastload.ShardDataset(out, split="test")
    with pytest.raises(DatasetError, match="not a dataset root with splits"):
        fastload.ShardDataset(out / "train", split="train")


def test_info_and_verify_on_a_split_root(split_root):
    out = split_root[0]
    r = run_cli("fastload", "info", str(out))
    assert r.returncode == 0, r.stderr
    assert "splits train, val" in r.stdout and "train: 28 samples from 7 source images" in r.stdout
    assert "[val] dataset" in r.stdout and "classes: ant, bee, cat" in r.stdout
    r = run_cli("fastload", "verify", str(out), "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{out} [train]: OK" in r.stdout and f"{out} [val]: OK" in r.stdout
    assert f"{out}: OK: 2 shards, 44 records" in r.stdout


def test_no_stratify_without_labels_and_stratify_needs_labels(tmp_path, classes_dir):
    r = run_cli("preprocess_tiles", "--data-dir", str(classes_dir), "--output-dir", str(tmp_path / "o"),
                "--val-fraction", "0.4", "--stratify")
    assert r.returncode == 2 and "--stratify needs one label per source file" in r.stderr


def test_interrupted_split_root_is_explained(tmp_path, split_root):
    out = tmp_path / "copy"
    (out / "train").mkdir(parents=True)
    for p in (split_root[0] / "train").iterdir():
        (out / "train" / p.name).write_bytes(p.read_bytes())
    with pytest.raises(DatasetError, match=r"holds splits \['train'\] but no splits.json .*--resume"):
        fastload.ShardDataset(out)


def _classes(*sizes: int):
    from fastload.conversion._sources import Source

    return [Source(f"c{label}/img{i}.png", label) for label, n in enumerate(sizes) for i in range(n)]


@pytest.mark.parametrize(("sizes", "fraction"), [((2, 2, 2, 2, 1), 0.2), ((5, 5), 0.1), ((1, 1, 1, 7), 0.25),
                                                 ((3,) * 10, 0.2), ((40, 7, 2, 1), 0.15), ((5,) * 8, 0.1)])
def test_stratified_split_reaches_the_overall_fraction_by_largest_remainder(sizes, fraction):
    from fastload.conversion._sources import split_by_source

    sources = _classes(*sizes)
    for seed in range(5):
        train, val = split_by_source(sources, fraction, seed, stratify=True)
        assert len(val) == round(fraction * len(sources))  # the overall fraction, whatever the class sizes
        per_class = [sum(s.label == c for s in val) for c in range(len(sizes))]
        for n, v in zip(sizes, per_class):
            assert int(fraction * n) <= v <= int(fraction * n) + 1 and v < n  # within one of its share; train kept
        assert sorted(s.relpath for s in train + val) == sorted(s.relpath for s in sources)


def test_stratified_split_of_large_classes_is_the_per_class_share():
    from fastload.conversion._sources import split_by_source

    train, val = split_by_source(_classes(50, 30, 20), 0.2, 0, stratify=True)
    assert [sum(s.label == c for s in val) for c in range(3)] == [10, 6, 4]


def test_split_errors_name_the_option_that_helps():
    from fastload.conversion._sources import SourceError, split_by_source

    with pytest.raises(SourceError,
                       match=r"'val'.*0\.1 of 3 source images rounds to 0.*change --val-fraction \(0\.34 or more"):
        split_by_source(_classes(3), 0.1, 0)
    with pytest.raises(SourceError, match=r"every class has a single image.*--no-stratify"):
        split_by_source(_classes(1, 1, 1, 1), 0.5, 0, stratify=True)
    train, val = split_by_source(_classes(1, 1, 1, 1), 0.5, 0)  # without stratification it splits
    assert len(val) == 2
    with pytest.raises(SourceError,
                       match=r"'train'.*0\.9 of 2 source images rounds to 2.*--val-fraction \(0\.5 or less"):
        split_by_source(_classes(2), 0.9, 0)


def test_small_classes_split_with_one_info_line_and_no_warning(tmp_path):
    data = tmp_path / "photos"
    for cls, n in (("animals", 2), ("cars", 2), ("food", 2), ("people", 2), ("plants", 1)):  # 9 photos, 5 classes
        (data / cls).mkdir(parents=True)
        for i in range(n):
            np.save(data / cls / f"{cls}{i}.npy", np.full((16, 16), i, np.uint8))
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "o"),
                "--labels-from-dirs", "--tile-size", "8", "--val-fraction", "0.2", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower() and "warning" not in r.stdout.lower()
    index = json.loads((tmp_path / "o" / "splits.json").read_text())["splits"]
    assert index["val"]["sources"] == 2 and index["train"]["sources"] == 7
    info = [line for line in r.stdout.splitlines() if "no val image" in line]
    assert len(info) == 1 and "--no-stratify" in info[0]
    empty = [c for c, n in index["val"]["class_counts"].items() if n == 0]
    assert len(empty) == 3 and all(repr(c) in info[0] for c in empty)
