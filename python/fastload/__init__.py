"""fastload: a fast, deterministic data loader for PyTorch over LMDB tile shards.

The public names are re-exported here; the implementation lives in private modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._array_writer import write_arrays
from ._dataset import ShardDataset
from ._format import Field
from ._loader import ShardLoader
from ._order import ORDER_VERSION, EpochOrder
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
    "EpochOrder",
    "Field",
    "ORDER_VERSION",
    "SchemaMismatchError",
    "ShardDataset",
    "ShardLoader",
    "ShardNotFoundError",
    "__version__",
    "write_arrays",
]
