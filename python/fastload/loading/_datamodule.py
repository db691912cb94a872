"""``ShardDataModule``: train, val and test ``ShardLoader``s over a dataset root, for PyTorch Lightning.

A root written by ``preprocess_tiles --val-fraction`` holds ``train/`` and
``val/`` (and perhaps ``test/``), each a shard dataset; in object storage
(``s3://``, ``gs://``, ``az://``, ``https://``) its ``splits.json`` lists them,
and each loader reads its split through the local cache. This module is imported
only when ``fastload.ShardDataModule`` is first used: ``import fastload``
never imports Lightning. When ``lightning`` (or else ``pytorch_lightning``) is
installed, the class is a ``LightningDataModule`` subclass, which ``Trainer``
requires; without either it is a plain class with the same methods.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, DatasetError, FastloadWarning
from ..storage import RemoteSpec, is_remote, redact, remote_splits
from ..transforms import Transform
from ._augment import BatchTransform
from ._loader import ShardLoader

SPLITS = ("train", "val", "test")


def _lightning_base() -> type:
    import importlib

    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            base: type = importlib.import_module(name).LightningDataModule
            return base
        except ImportError:
            continue
    return object


class ShardDataModule(_lightning_base()):  # type: ignore[misc]
    """``train_dataloader()`` / ``val_dataloader()`` / ``test_dataloader()`` over ``root/train`` etc.

    Each split gets one :class:`ShardLoader`, built on first request and then
    returned again, so its epoch and position persist. The training loader
    shuffles (``shuffle``, ``seed``, ``drop_last``); validation and test
    loaders read in stored order with every sample. ``shuffle_window`` (a
    shuffle within windows of shards, docs/sampling.md) goes to the training
    loader only, with ``shuffle``. ``loader_kwargs`` (e.g.
    ``num_threads``, ``backend``, ``device``, ``fields``, ``layout``,
    ``output``) go to every loader.

    ``transforms`` and ``batch_transform`` (the training augmentation) go to
    the training loader only; ``eval_transforms`` and ``eval_batch_transform``
    to the validation and test loaders (none by default: evaluation reads the
    samples as stored, with a ``FastloadWarning`` when there are training
    transforms, so that the difference is seen). An evaluation chain with a
    random op (``op.random``: ``RandomFlip``, ``RandomCrop``, ...) is refused,
    since its batches would change every epoch, unless
    ``allow_random_eval_transforms=True`` (test-time augmentation).
    ``state_dict()`` / ``load_state_dict()`` delegate to the loaders, so a
    Lightning checkpoint restores them (the training loader's position is
    also saved by Lightning's fit loop, which restores it mid-epoch).

    ``root`` may be the URL of a dataset root in object storage
    (``s3://bucket/tiles``, ``gs://``, ``az://``, ``https://``; ``pip install
    "fastload[remote]"``), as ``preprocess_tiles --val-fraction --output-dir
    s3://...`` publishes it: its ``splits.json`` is read here (a root without
    one is a ``DatasetError``), and each split's loader is
    ``ShardLoader(root, split=...)``, reading through the local cache with
    ``storage_options``, ``cache_dir``, ``cache_limit`` and ``predownload`` as
    :class:`ShardLoader` takes them (docs/remote.md). The batches are those of
    a local copy of the root. The storage arguments are refused with a local root.
    """

    def __init__(self, root: str | os.PathLike, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, eval_batch_size: int | None = None,
                 transforms: Sequence[Transform] | None = None, eval_transforms: Sequence[Transform] | None = None,
                 batch_transform: BatchTransform | None = None, eval_batch_transform: BatchTransform | None = None,
                 allow_random_eval_transforms: bool = False, shuffle_window: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None, predownload: int | str = "auto",
                 **loader_kwargs: Any) -> None:
        super().__init__()
        random = [op for op in eval_transforms or () if getattr(op, "random", False)]
        if random and not allow_random_eval_transforms:
            raise ArgumentError(f"eval_transforms holds {', '.join(map(repr, random))}, which draw random parameters "
                             "per sample: validation and test batches would change every epoch; use deterministic "
                             "ops (CenterCrop, Resize, Normalize, ...) or pass allow_random_eval_transforms=True "
                             "for test-time augmentation")
        self.transforms = list(transforms) if transforms is not None else None
        self.eval_transforms = list(eval_transforms) if eval_transforms is not None else None
        self.batch_transform, self.eval_batch_transform = batch_transform, eval_batch_transform
        storage = {"storage_options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit,
                   "predownload": predownload}
        self.root: Path | str
        self._remote_splits: dict[str, str] | None = None  # a URL root's split name -> URL (from its splits.json)
        self._storage: dict[str, Any] = {}  # the storage arguments of a URL root's loaders
        if is_remote(root):
            assert isinstance(root, str)
            self.root, self._storage = root, storage
            self._remote_splits = _remote_root_splits(root, storage)
        else:
            given = sorted(k for k, v in storage.items() if v is not None and v != "auto")
            if given:
                raise ArgumentError(f"{', '.join(given)}: only for a dataset root in object storage (s3://, gs://, "
                                    f"az://, https://), not {str(root)!r}")
            self.root = Path(root)
            if not self.root.is_dir():
                raise DatasetError(f"no such dataset root: {self.root}")
            if not any((self.root / split).is_dir() for split in SPLITS):
                raise DatasetError(f"{self.root} holds none of the split directories {', '.join(SPLITS)}")
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.shuffle_window = shuffle_window
        self.eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        self.loader_kwargs = dict(loader_kwargs)
        self._loaders: dict[str, ShardLoader] = {}
        self._pending: dict[str, Mapping[str, Any]] = {}

    def has_split(self, split: str) -> bool:
        """Return whether ``root/<split>`` exists (a URL root: whether its ``splits.json`` lists ``split``)."""
        if self._remote_splits is not None:
            return split in self._remote_splits
        assert isinstance(self.root, Path)
        return (self.root / split).is_dir()

    def loader(self, split: str) -> ShardLoader:
        """Return the loader of ``split`` ("train", "val" or "test"), building it on first use."""
        if split not in SPLITS:
            raise ArgumentError(f"split must be one of {SPLITS}, not {split!r}")
        if split not in self._loaders:
            if not self.has_split(split):
                if self._remote_splits is not None:
                    raise DatasetError(f"{redact(str(self.root))}: no split {split!r}; its splits.json lists "
                                       f"{list(self._remote_splits)}")
                raise DatasetError(f"{self.root} has no {split}/ directory")
            train = split == "train"
            if not train and self.eval_transforms is None and self.transforms:
                warnings.warn(f"ShardDataModule: transforms={self.transforms} apply to the training loader only; "
                              f"the {split} loader reads the samples as stored. Pass eval_transforms=[...] (e.g. "
                              "CenterCrop, Normalize) for evaluation, or eval_transforms=[] to silence this",
                              FastloadWarning, stacklevel=3)
            remote = self._remote_splits is not None  # a URL root: ShardLoader finds the split in splits.json
            source = self.root if remote else Path(self.root) / split
            where = {"split": split, **self._storage} if remote else {}
            loader = ShardLoader(source, **where, batch_size=self.batch_size if train else self.eval_batch_size,
                                 shuffle=self.shuffle and train, seed=self.seed, drop_last=self.drop_last and train,
                                 transforms=self.transforms if train else self.eval_transforms,
                                 batch_transform=self.batch_transform if train else self.eval_batch_transform,
                                 shuffle_window=self.shuffle_window if train else None,
                                 **self.loader_kwargs)
            if split in self._pending:
                loader.load_state_dict(self._pending.pop(split))
            self._loaders[split] = loader
        return self._loaders[split]

    def train_dataloader(self) -> ShardLoader:
        """Return the shuffled training loader over ``root/train``."""
        return self.loader("train")

    def val_dataloader(self) -> ShardLoader | list[ShardLoader]:
        """Return the validation loader over ``root/val`` (an empty list when there is none: no validation)."""
        return self.loader("val") if self.has_split("val") else []

    def test_dataloader(self) -> ShardLoader | list[ShardLoader]:
        """Return the test loader over ``root/test`` (an empty list when there is none)."""
        return self.loader("test") if self.has_split("test") else []

    def state_dict(self) -> dict[str, Any]:
        """Return the state of every loader built so far (and of those restored but not yet built)."""
        states: dict[str, Any] = dict(self._pending)
        states.update({split: loader.state_dict() for split, loader in self._loaders.items()})
        return states

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore each split's loader now, or when it is built."""
        for split, state in state_dict.items():
            if split not in SPLITS:
                raise ArgumentError(f"unknown split {split!r} in a ShardDataModule state")
            if split in self._loaders:
                self._loaders[split].load_state_dict(state)
            else:
                self._pending[split] = state

    def __repr__(self) -> str:
        splits = [s for s in SPLITS if self.has_split(s)]
        root = redact(self.root) if isinstance(self.root, str) else str(self.root)
        return f"ShardDataModule({root!r}, batch_size={self.batch_size}, splits={splits})"


def _remote_root_splits(url: str, storage: Mapping[str, Any]) -> dict[str, str]:
    """Return split name -> URL of the dataset root at ``url``, from its ``splits.json`` (one of ``SPLITS`` at least).

    Raises DatasetError naming the URL (never a credential) when the root has no ``splits.json``
    or lists none of ``SPLITS``; RemoteError when the store cannot be read.
    """
    spec = RemoteSpec.build(storage["storage_options"], storage["cache_dir"], storage["cache_limit"],
                            storage["predownload"])
    splits = remote_splits(url, spec)
    if splits is None:
        raise DatasetError(f"{redact(url)}: not a dataset root with splits (no splits.json): ShardDataModule needs a "
                           f"root written with preprocess_tiles --val-fraction; for one dataset use ShardLoader(url)")
    if not any(split in splits for split in SPLITS):
        raise DatasetError(f"{redact(url)}: its splits.json lists {list(splits)}, none of {', '.join(SPLITS)}")
    return splits
