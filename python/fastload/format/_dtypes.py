"""The dtypes a field may have, with their little-endian numpy spellings (no torch needed here)."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

# Name in the schema -> numpy dtype (always little-endian on disk).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
    "uint16": np.dtype("<u2"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bool": np.dtype("?"),
}

def dtype_name(dtype: np.dtype | str) -> str:
    """Return the schema name of a numpy dtype, or raise ValueError if fields cannot hold it."""
    dt = np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if dt.kind == candidate.kind and dt.itemsize == candidate.itemsize:
            return name
    raise ArgumentError(f"dtype {dt} is not supported; use one of {', '.join(NUMPY_DTYPES)}")
