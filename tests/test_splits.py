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
    assert "warning: class 'cat' has no val samples" in stderr
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
