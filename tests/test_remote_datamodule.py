"""ShardDataModule over a dataset root in object storage (moto's S3 server on 127.0.0.1, tests/test_remote.py).

The promise: ``ShardDataModule("s3://bucket/root", ...)`` finds the splits in the root's
``splits.json`` and gives, split by split and epoch by epoch, exactly the batches of the same data
module over a local copy of the root, with ShardLoader's storage arguments (a ``cache_limit``
that windows the training split included); a URL that is no root with splits, and storage
arguments given with a local root, are typed errors naming the URL, never a credential.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_remote import SECRET, batches, s3, same, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.errors import ArgumentError, DatasetError
from fastload.format._splits import write_splits

pytestmark = pytest.mark.slow  # tier: the moto S3 server


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def root(tmp_path_factory, s3):  # noqa: F811
    """A root with train/ (240 samples, 8 shards) and val/ (60) and its splits.json, local and uploaded."""
    local = tmp_path_factory.mktemp("dm") / "root"
    rng = np.random.default_rng(7)
    counts = {"train": 240, "val": 60}
    for name, n in counts.items():
        fastload.write_arrays(local / name, {"image": rng.integers(0, 255, (n, 3, 16, 16), dtype=np.uint8),
                                             "label": np.arange(n) % 5}, codec={"image": "zstd"},
                              samples_per_shard=30)
    write_splits(local, {n: {"path": n, "samples": c, "sources": c, "class_counts": None} for n, c in counts.items()},
                 {"tool": "tests"})
    return local, upload(s3[1], local, "dmroot")


def epochs(loader, count: int) -> list[list[dict]]:
    """Return the batches of ``count`` passes of ``loader`` (each pass reads the next epoch)."""
    return [batches(loader) for _ in range(count)]


@pytest.mark.parametrize("reading", [{"num_threads": 2}, {"backend": "torch", "num_workers": 2}])
def test_a_url_root_gives_the_batches_of_the_local_root(root, s3, tmp_path, reading):  # noqa: F811
    local, url = root
    kwargs = {"batch_size": 32, "seed": 3, "eval_batch_size": 25, **reading}
    remote = fastload.ShardDataModule(url, storage_options=s3[2], cache_dir=tmp_path / "cache", **kwargs)
    expected = fastload.ShardDataModule(local, **kwargs)
    assert [remote.has_split(s) for s in ("train", "val", "test")] == [True, True, False]
    assert remote.test_dataloader() == []
    assert same(batches(remote.val_dataloader()), batches(expected.val_dataloader()))
    got, want = epochs(remote.train_dataloader(), 2), epochs(expected.train_dataloader(), 2)
    assert len(got[0]) == 8 and not same(got[0], got[1])  # two different epochs, both the local ones
    assert all(same(g, w) for g, w in zip(got, want))
    assert remote.train_dataloader().dataset.url == f"{url}/train"
    assert repr(remote) == f"ShardDataModule('{url}', batch_size=32, splits=['train', 'val'])"


def test_a_cache_smaller_than_the_training_split_reads_it_a_window_at_a_time(root, s3, tmp_path):  # noqa: F811
    local, url = root
    largest = max(p.stat().st_size for p in (local / "train").glob("*.lmdb"))
    val = sum(p.stat().st_size for p in (local / "val").iterdir())
    # val whole; train windowed with shuffle_window=2: two windows of two shards, and the manifests
    limit = val + 4 * largest + largest // 2 + 16384
    kwargs = {"batch_size": 20, "seed": 1, "shuffle_window": 2, "num_threads": 1}
    remote = fastload.ShardDataModule(url, storage_options=s3[2], cache_dir=tmp_path / "cache", cache_limit=limit,
                                      predownload=2, **kwargs)
    expected = fastload.ShardDataModule(local, **kwargs)
    # val first: it fits whole in the room a windowed train split leaves it (once train held all that was left)
    assert same(batches(remote.val_dataloader()), batches(expected.val_dataloader()))
    assert remote.val_dataloader().dataset._cached.window is None
    assert remote.train_dataloader().dataset._cached.window is not None  # windowed: it does not fit whole
    assert all(same(g, w) for g, w in zip(epochs(remote.train_dataloader(), 2),
                                          epochs(expected.train_dataloader(), 2)))
    assert same(batches(remote.val_dataloader()), batches(expected.val_dataloader()))
    shards = [p for p in (tmp_path / "cache").rglob("*.lmdb")]
    assert sum(p.stat().st_size for p in shards) <= limit


def test_a_state_saved_over_the_url_resumes_over_the_local_root(root, s3, tmp_path):  # noqa: F811
    local, url = root
    remote = fastload.ShardDataModule(url, batch_size=32, seed=9, storage_options=s3[2], cache_dir=tmp_path / "c")
    it = iter(remote.train_dataloader())
    first = [dict(next(it)) for _ in range(3)]
    state = remote.state_dict()
    del it
    resumed = fastload.ShardDataModule(local, batch_size=32, seed=9)
    resumed.load_state_dict(state)
    whole = batches(fastload.ShardDataModule(local, batch_size=32, seed=9).train_dataloader())
    assert same(first + batches(resumed.train_dataloader()), whole)


def test_a_url_that_is_no_root_with_splits_is_a_typed_error_naming_it(root, s3, tmp_path):  # noqa: F811
    _, url = root
    options = {**s3[2], "max_retries": 0}
    with pytest.raises(DatasetError, match="no splits.json") as err:
        fastload.ShardDataModule(f"{url}/train", batch_size=8, storage_options=options, cache_dir=tmp_path / "c")
    assert f"{url}/train" in str(err.value) and SECRET not in str(err.value)
    with pytest.raises(DatasetError) as missing:  # a missing bucket: no splits.json there either
        fastload.ShardDataModule("s3://no-such-bucket-dm/root", batch_size=8, storage_options=options,
                                 cache_dir=tmp_path / "c")
    assert "s3://no-such-bucket-dm/root" in str(missing.value) and SECRET not in str(missing.value)
    dm = fastload.ShardDataModule(url, batch_size=8, storage_options=options, cache_dir=tmp_path / "c")
    with pytest.raises(DatasetError, match="no split 'test'"):
        dm.loader("test")


def test_storage_arguments_with_a_local_root_are_refused(root, tmp_path):
    local, _ = root
    for kwargs in ({"storage_options": {"region": "x"}}, {"cache_dir": tmp_path}, {"cache_limit": "1GB"},
                   {"predownload": 3}):
        with pytest.raises(ArgumentError, match=f"{next(iter(kwargs))}: only for a dataset root in object storage"):
            fastload.ShardDataModule(local, batch_size=8, **kwargs)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_trainer_fits_over_a_url_root_on_the_local_roots_batches(root, s3, tmp_path):  # noqa: F811
    """Two epochs of Trainer.fit (train and val) over the URL see the labels of a fit over the local root."""
    L = pytest.importorskip("lightning", reason="lightning is not installed")
    import torch

    class Record(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(3, 5)
            self.seen: list[tuple[str, int, list[int]]] = []

        def training_step(self, batch, batch_idx):
            self.seen.append(("train", self.current_epoch, batch["label"].tolist()))
            return torch.nn.functional.cross_entropy(self.head(batch["image"].float().mean(dim=(2, 3))),
                                                     batch["label"])

        def validation_step(self, batch, batch_idx):
            self.seen.append(("val", self.current_epoch, batch["label"].tolist()))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(data: fastload.ShardDataModule) -> list:
        model = Record()
        trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            default_root_dir=str(tmp_path))
        trainer.fit(model, datamodule=data)
        return model.seen

    kwargs = {"batch_size": 40, "seed": 2, "num_threads": 1}
    remote = fit(fastload.ShardDataModule(root[1], storage_options=s3[2], cache_dir=tmp_path / "c", **kwargs))
    local = fit(fastload.ShardDataModule(root[0], **kwargs))
    assert [s[0] for s in remote].count("train") == 12 and [s[0] for s in remote].count("val") == 4
    assert remote == local
