"""fastload: a fast, deterministic data loader for PyTorch over LMDB tile shards.

Public: the names in ``fastload.__all__`` (re-exported here), :mod:`fastload.errors`,
:mod:`fastload.transforms`, :mod:`fastload.sampling`, :mod:`fastload.weights` (imported on
first use), and the command modules
:mod:`fastload.preprocess` (``preprocess_tiles``), :mod:`fastload.cli` (``fastload``) and
:mod:`fastload.demo`. Everything else is private, grouped by stage (docs/ARCHITECTURE.md):
``format`` (the files and reading them back), ``conversion`` (into the format),
``loading`` (out of it, as batches), ``tools`` (the commands); underscored modules there
may change without notice. Names that need torch are imported on first use (PEP 562), so
``preprocess_tiles`` and ``fastload verify`` start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from .errors import (
    CorruptRecordError,
    CorruptShardError,
    DatasetError,
    FastloadError,
    FastloadWarning,
    SchemaMismatchError,
    ShardNotFoundError,
)

__version__ = "0.1.0"

_moved.install()  # the module paths before issue 12's grouping, for old pickles

# Public name -> the private module that defines it.
_LAZY = {
    "EpochDataLoader": ".loading._helpers",
    "EpochOrder": ".sampling._order",
    "ConcatShardDataset": ".loading._compose",
    "Field": ".format._record",
    "MixedShardDataset": ".loading._compose",
    "Mosaic": ".loading._mosaic",
    "ORDER_VERSION": ".sampling._order",
    "SAMPLING_VERSION": ".sampling._alias",
    "ShardDataModule": ".loading._datamodule",
    "ShardDataset": ".loading._dataset",
    "ShardLoader": ".loading._loader",
    "ShardSubset": ".loading._subset",
    "StateError": ".loading._state",
    "check_determinism": ".loading._helpers",
    "class_balanced_weights": ".loading._weights",
    "concat": ".loading._compose",
    "create_dataloader": ".loading._helpers",
    "mix": ".loading._compose",
    "seed_everything": ".loading._helpers",
    "upgrade_dataset": ".conversion._upgrade",
    "write_arrays": ".conversion._array_writer",
    "write_dataset": ".conversion._convert",
}

__all__ = [
    "ConcatShardDataset",
    "CorruptRecordError",
    "CorruptShardError",
    "DatasetError",
    "EpochDataLoader",
    "EpochOrder",
    "FastloadError",
    "FastloadWarning",
    "Field",
    "MixedShardDataset",
    "Mosaic",
    "ORDER_VERSION",
    "SAMPLING_VERSION",
    "SchemaMismatchError",
    "ShardDataModule",
    "ShardDataset",
    "ShardLoader",
    "ShardNotFoundError",
    "ShardSubset",
    "StateError",
    "__version__",
    "check_determinism",
    "class_balanced_weights",
    "concat",
    "create_dataloader",
    "mix",
    "seed_everything",
    "upgrade_dataset",
    "write_arrays",
    "write_dataset",
]


# Public submodules that need torch, imported on first attribute access (``fastload.weights``).
_SUBMODULES = ("weights",)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in globals() too
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


if TYPE_CHECKING:
    from . import weights as weights
    from .conversion._array_writer import write_arrays
    from .conversion._convert import write_dataset
    from .conversion._upgrade import upgrade_dataset
    from .format._record import Field
    from .loading._compose import ConcatShardDataset, MixedShardDataset, concat, mix
    from .loading._datamodule import ShardDataModule
    from .loading._dataset import ShardDataset
    from .loading._helpers import EpochDataLoader, check_determinism, create_dataloader, seed_everything
    from .loading._loader import ShardLoader
    from .loading._mosaic import Mosaic
    from .loading._state import StateError
    from .loading._subset import ShardSubset
    from .loading._weights import class_balanced_weights
    from .sampling._alias import SAMPLING_VERSION
    from .sampling._order import ORDER_VERSION, EpochOrder
