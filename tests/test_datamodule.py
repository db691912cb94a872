"""ShardDataModule: loaders per split, state delegation, and no Lightning import at fastload import time."""

import subprocess
import sys

import numpy as np
import pytest

import fastload


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("dm") / "root"
    for split, n in (("train", 40), ("val", 12)):
        fastload.write_arrays(root / split, {"label": np.arange(n, dtype=np.int64)})
    return root


def test_importing_fastload_does_not_import_lightning():
    code = ("import sys, fastload; fastload.ShardLoader; fastload.ShardDataset; "
            "assert not any(m.split('.')[0] in ('lightning', 'pytorch_lightning') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_loaders_per_split(root):
    dm = fastload.ShardDataModule(root, batch_size=8, shuffle=True, seed=3, eval_batch_size=5, num_threads=1)
    from lightning.pytorch import LightningDataModule

    assert isinstance(dm, LightningDataModule)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert dm.train_dataloader() is train and train.shuffle and train.seed == 3 and len(train) == 5
    assert isinstance(val, fastload.ShardLoader) and not val.shuffle and len(val) == 3
    assert dm.test_dataloader() == []  # no test/ directory: no test loop
    with pytest.raises(fastload.DatasetError, match="has no test/ directory"):
        dm.loader("test")
    with pytest.raises(fastload.DatasetError, match="no such dataset root"):
        fastload.ShardDataModule(root / "missing", batch_size=8)
    with pytest.raises(fastload.DatasetError, match="none of the split directories"):
        fastload.ShardDataModule(root / "train", batch_size=8)


def test_state_dict_delegates_to_the_loaders(root):
    dm = fastload.ShardDataModule(root, batch_size=8, shuffle=True)
    it = iter(dm.train_dataloader())
    head = [next(it)["label"].tolist() for _ in range(2)]
    state = dm.state_dict()
    assert list(state) == ["train"] and state["train"]["position"] == 16
    restored = fastload.ShardDataModule(root, batch_size=8, shuffle=True)
    restored.load_state_dict(state)  # before the loader exists: applied when it is built
    rest = [b["label"].tolist() for b in restored.train_dataloader()]
    assert restored.state_dict()["train"]["epoch"] == 1
    assert sorted(sum(head + rest, [])) == list(range(40))
    with pytest.raises(ValueError, match="unknown split 'extra'"):
        restored.load_state_dict({"extra": {}})
