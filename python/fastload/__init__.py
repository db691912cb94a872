"""fastload: a fast, deterministic data loader for PyTorch over LMDB tile shards.

The public names are re-exported here; the implementation lives in private
modules. Names that need torch are imported on first use (PEP 562), so
``preprocess_tiles`` and ``fastload verify`` start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    CorruptRecordError,
    CorruptShardError,
    DatasetError,
    FastloadError,
    SchemaMismatchError,
    ShardNotFoundError,
)

__version__ = "0.1.0"

# Public name -> the private module that defines it.
_LAZY = {
    "EpochDataLoader": "._helpers",
    "EpochOrder": "._order",
    "ConcatShardDataset": "._compose",
    "Field": "._format",
    "MixedShardDataset": "._compose",
    "ORDER_VERSION": "._order",
    "SAMPLING_VERSION": "._alias",
    "ShardDataModule": "._datamodule",
    "ShardDataset": "._dataset",
    "ShardLoader": "._loader",
    "ShardSubset": "._compose",
    "StateError": "._state",
    "check_determinism": "._helpers",
    "class_balanced_weights": "._compose",
    "concat": "._compose",
    "create_dataloader": "._helpers",
    "mix": "._compose",
    "seed_everything": "._helpers",
    "write_arrays": "._array_writer",
    "write_dataset": "._convert",
}

__all__ = [
    "ConcatShardDataset",
    "CorruptRecordError",
    "CorruptShardError",
    "DatasetError",
    "EpochDataLoader",
    "EpochOrder",
    "FastloadError",
    "Field",
    "MixedShardDataset",
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
    "write_arrays",
    "write_dataset",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from ._alias import SAMPLING_VERSION
    from ._array_writer import write_arrays
    from ._compose import ConcatShardDataset, MixedShardDataset, ShardSubset, class_balanced_weights, concat, mix
    from ._convert import write_dataset
    from ._datamodule import ShardDataModule
    from ._dataset import ShardDataset
    from ._format import Field
    from ._helpers import EpochDataLoader, check_determinism, create_dataloader, seed_everything
    from ._loader import ShardLoader
    from ._order import ORDER_VERSION, EpochOrder
    from ._state import StateError
