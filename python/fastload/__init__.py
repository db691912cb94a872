"""fastload: a fast, deterministic data loader for PyTorch over LMDB tile shards.

The public names are re-exported here; the implementation lives in private modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._dataset import ShardDataset
from ._format import Field
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
    "Field",
    "SchemaMismatchError",
    "ShardDataset",
    "ShardNotFoundError",
    "__version__",
]
