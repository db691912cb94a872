"""Samples of arbitrary datasets as numpy fields: conversion, schema inference and checking.

A sample is a dict (field name -> value) or a tuple/list (fields named
``"0"``, ``"1"``, ... unless names are given); a value is a numpy array, a
torch tensor, a PIL image, a Python or numpy scalar, or a list of numbers. The
schema is taken from the first sample; every later sample must match it, or a
SchemaMismatchError names the sample index and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, SchemaMismatchError
from ..format._dtypes import dtype_name
from ..format._record import MAX_SAMPLE_BYTES_ENV, Field, max_sample_bytes


def _to_array(value: Any, index: int, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch") and hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    if module.startswith("PIL") and hasattr(value, "mode"):
        from ._images import _pillow_target_mode

        target = _pillow_target_mode(value)
        return np.asarray(value.convert(target) if target != value.mode else value)
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    if isinstance(value, (list, tuple)):
        arr = np.asarray(value)
        if arr.dtype.kind in "biuf":
            return arr
    raise SchemaMismatchError(f"sample {index} field {name!r}: a {type(value).__name__} cannot be stored; "
                              "use numpy arrays, tensors, PIL images or numbers")


def sample_arrays(sample: Any, index: int, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Return a sample as field name -> numpy array (C-contiguous)."""
    if isinstance(sample, Mapping):
        items = [(str(k), v) for k, v in sample.items()]
    elif isinstance(sample, (tuple, list)):
        if names is not None and len(names) != len(sample):
            raise SchemaMismatchError(f"sample {index}: {len(sample)} values, but {len(names)} names were given "
                                      f"({list(names)})")
        items = list(zip(names or [str(i) for i in range(len(sample))], sample))
    else:
        items = [((names or ["0"])[0], sample)]
    # np.require keeps 0-d scalars 0-d (np.ascontiguousarray would make them 1-d).
    return {name: np.require(_to_array(v, index, name), requirements="C") for name, v in items}


def check_sample_bytes(fields: Sequence[Field], what: str) -> None:
    """Refuse a schema whose samples exceed the readers' bound, so no dataset is written that no reader opens."""
    total = sum(f.nbytes for f in fields)
    limit = max_sample_bytes()
    if total > limit:
        raise SchemaMismatchError(f"{what}: a sample is {total} bytes decoded "
                                  f"({', '.join(f'{f.name!r} {f.nbytes}' for f in fields)}), over the readers' "
                                  f"bound of {limit} bytes (set {MAX_SAMPLE_BYTES_ENV} to write and read larger "
                                  "samples)")


def check_names(names: Any) -> tuple[str, ...] | None:
    """Return ``names`` as a tuple of distinct non-empty strings (or None); quote what is refused."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise ArgumentTypeError(f"names must be a sequence of field names, not {names!r}")
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise ArgumentTypeError(f"names={list(names)!r}: {bad[0]!r} is not a non-empty string")
    seen = sorted({n for n in names if list(names).count(n) > 1})
    if seen:
        raise ArgumentError(f"names={list(names)!r}: duplicate field name(s) {seen}")
    return tuple(names)


def infer_fields(first: dict[str, np.ndarray], codec: str, options: Mapping[str, int]) -> tuple[Field, ...]:
    """Return the schema of the first sample; arrays get ``codec``, scalars are stored raw."""
    fields = []
    for name, arr in first.items():
        try:
            dtype = dtype_name(arr.dtype)
        except ValueError as err:
            raise SchemaMismatchError(f"sample 0 field {name!r}: {err}") from None
        compressed = arr.ndim > 0 and codec != "raw"
        fields.append(Field(name, dtype, tuple(arr.shape), codec if compressed else "raw",
                            dict(options) if compressed else {}))
    if not fields:
        raise SchemaMismatchError("sample 0 has no fields")
    return tuple(fields)


def check_sample(arrays: dict[str, np.ndarray], fields: Sequence[Field], index: int) -> dict[str, np.ndarray]:
    """Raise SchemaMismatchError naming ``index`` and the field when a sample differs from the schema."""
    names = [f.name for f in fields]
    if list(arrays) != names:
        raise SchemaMismatchError(f"sample {index}: fields {list(arrays)}, the schema (from sample 0) has {names}")
    for f in fields:
        arr = arrays[f.name]
        if tuple(arr.shape) != f.shape:
            raise SchemaMismatchError(f"sample {index} field {f.name!r}: shape {tuple(arr.shape)}, the schema "
                                      f"(from sample 0) has {f.shape}")
        if arr.dtype.kind != f.np_dtype.kind or arr.dtype.itemsize != f.np_dtype.itemsize:
            raise SchemaMismatchError(f"sample {index} field {f.name!r}: dtype {arr.dtype}, the schema "
                                      f"(from sample 0) has {f.dtype}")
    return arrays
