"""The native core, ``fastload._native``, imported in one place.

Every reader needs it (ShardLoader's backends, ShardDataset, ``fastload verify``):
they decode records with its decoders. Writing datasets and the rest of the API
import without it, so ``import fastload`` works on a broken build and the first
read names what is missing. The extension is imported by name
(``importlib``), not with ``from .. import _native``: the C++ core is below every
Python layer and imports nothing of them, and a relative import of it would read,
to the import-graph lint, as an import of the ``fastload`` package itself (which
re-exports everything above).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def _load() -> tuple[Any, ImportError | None]:
    try:
        return importlib.import_module("fastload._native"), None
    except ImportError as err:
        return None, err


native, IMPORT_ERROR = _load()


def require() -> Any:
    """Return ``fastload._native``, or raise ImportError saying why it did not import and what helps."""
    if native is None:
        raise ImportError(f"fastload._native (the native core every reader decodes with) failed to import: "
                          f"{IMPORT_ERROR}; reinstall fastload (pip install --force-reinstall fastload, or "
                          "`make install` in a checkout)")
    return native


__all__ = ["IMPORT_ERROR", "ModuleType", "native", "require"]
