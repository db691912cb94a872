"""ShardDataModule: loaders per split, state delegation, and no Lightning import at fastload import time."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

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


def test_shuffle_window_reaches_only_the_training_loader(tmp_path):
    root = tmp_path / "root"
    for split, n in (("train", 40), ("val", 12)):
        fastload.write_arrays(root / split, {"label": np.arange(n, dtype=np.int64)}, samples_per_shard=10)
    dm = fastload.ShardDataModule(root, batch_size=10, shuffle=True, seed=1, shuffle_window=1, num_threads=1)
    for batch in dm.train_dataloader():  # windows of one shard of 10: a batch is one shard, shuffled
        labels = batch["label"].tolist()
        assert len({x // 10 for x in labels}) == 1
    assert torch.cat([b["label"] for b in dm.val_dataloader()]).tolist() == list(range(12))  # stored order
    with pytest.raises(fastload.errors.ArgumentError, match="pass shuffle=True"):
        fastload.ShardDataModule(root, batch_size=10, shuffle=False, shuffle_window=1).train_dataloader()


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


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("dm_images") / "root"
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("val", 8), ("test", 8)):
        fastload.write_arrays(root / split, {"image": rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8),
                                             "label": np.arange(n, dtype=np.int64)})
    return root


def test_training_transforms_reach_only_the_training_loader(image_root):
    from fastload.transforms import CenterCrop, Normalize, RandomCrop, RandomFlip

    train_ops = [RandomCrop(6), RandomFlip(), Normalize(127.5, 64.0)]
    dm = fastload.ShardDataModule(image_root, batch_size=4, transforms=train_ops,
                                  eval_transforms=[CenterCrop(6), Normalize(127.5, 64.0)], num_threads=1)
    assert dm.train_dataloader().augment.description["transforms"][0]["op"] == "RandomCrop"
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        assert [op["op"] for op in loader.augment.description["transforms"]] == ["CenterCrop", "Normalize"]
        first, second = [torch.cat([b["image"] for b in loader]) for _ in range(2)]
        assert first.shape[1:] == (3, 6, 6) and torch.equal(first, second)  # the same every epoch


def test_without_eval_transforms_evaluation_reads_plain_samples_and_says_so(image_root):
    from fastload.transforms import RandomFlip

    dm = fastload.ShardDataModule(image_root, batch_size=4, transforms=[RandomFlip()], num_threads=1)
    with pytest.warns(fastload.FastloadWarning, match=r"transforms=.*training loader only.*eval_transforms="):
        val = dm.val_dataloader()
    assert val.augment.description["transforms"] == []
    plain = fastload.ShardLoader(image_root / "val", batch_size=4)
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(val, plain))
    quiet = fastload.ShardDataModule(image_root, batch_size=4, transforms=[RandomFlip()], eval_transforms=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.val_dataloader()


def test_random_eval_transforms_are_refused_unless_allowed(image_root):
    from fastload.transforms import AxisMasks, CenterCrop, RandomFlip

    with pytest.raises(ValueError, match=r"eval_transforms.*RandomFlip.*random.*allow_random_eval_transforms=True"):
        fastload.ShardDataModule(image_root, batch_size=4, eval_transforms=[CenterCrop(6), RandomFlip()])
    with pytest.raises(ValueError, match=r"AxisMasks"):
        fastload.ShardDataModule(image_root, batch_size=4, eval_transforms=[AxisMasks("w", 2)])
    dm = fastload.ShardDataModule(image_root, batch_size=4, eval_transforms=[RandomFlip()],
                                  allow_random_eval_transforms=True, num_threads=1)  # test-time augmentation
    assert dm.val_dataloader().augment.description["transforms"][0]["op"] == "RandomFlip"


def test_batch_transform_follows_the_same_rule(image_root):
    calls = []

    def train_fn(batch, generator):
        calls.append("train")

    def eval_fn(batch, generator):
        calls.append("eval")

    dm = fastload.ShardDataModule(image_root, batch_size=8, batch_transform=train_fn, eval_batch_transform=eval_fn,
                                  num_threads=1)
    list(dm.train_dataloader())
    list(dm.val_dataloader())
    assert calls == ["train", "train", "eval"]
