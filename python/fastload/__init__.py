"""fastload: a fast, deterministic data loader for PyTorch over LMDB tile shards.

The public names are re-exported here; the implementation lives in private modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._array_writer import write_arrays
from ._dataset import ShardDataset
from ._format import Field
from ._helpers import EpochDataLoader, check_determinism, create_dataloader, seed_everything
from ._loader import ShardLoader
from ._order import ORDER_VERSION, EpochOrder
from ._state import StateError
from .errors import (
    CorruptRecordError,
    CorruptShardError,
    DatasetError,
    FastloadError,
    SchemaMismatchError,
    ShardNotFoundError,
)

__all__ = [
    "CorruptRecordError",
    "CorruptShardError",
    "DatasetError",
    "FastloadError",
    "EpochDataLoader",
    "EpochOrder",
    "Field",
    "ORDER_VERSION",
    "SchemaMismatchError",
    "ShardDataset",
    "ShardLoader",
    "ShardNotFoundError",
    "StateError",
    "__version__",
    "check_determinism",
    "create_dataloader",
    "seed_everything",
    "write_arrays",
]
