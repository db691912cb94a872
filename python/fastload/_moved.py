"""Old module paths of the modules issue 12 grouped into stage packages, kept as aliases.

A pickle names a class by its module: a loader pickled before the move says
``fastload._loader.ShardLoader``. Importing an old path (``import fastload._loader``,
``pickle.load``) gives the module at its new path, so pickles written by older versions
load and old private imports keep working. New code imports the new paths; the tests
use the old ones only in tests/test_legacy_pickles.py.

Each old path, the first time a process imports it, warns with a ``FutureWarning`` (shown to
users by default, unlike a ``DeprecationWarning``: the one who loads an old pickle is usually not
the one who wrote the import) naming its new path and the removal, so the pickle can be re-saved
while it still loads.

Removal: in fastload 0.3 (two minor releases after 0.1, the first to ship the new paths), and
not before ``REMOVAL_NOT_BEFORE`` (six months after the warning first shipped, so a user who
upgrades rarely sees it at least once). A pickle written by 0.1 or earlier then loads only after
it is re-saved by 0.2; docs/upgrading.md says how. ``REMOVED_IN`` is that version.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

REMOVED_IN = "0.3"
REMOVAL_NOT_BEFORE = "2027-06-01"

# fastload.<old> -> fastload.<new>
MOVED = {
    "_alias": "sampling._alias",
    "_array_writer": "conversion._array_writer",
    "_augment": "loading._augment",
    "_auto": "conversion._auto",
    "_bench": "tools._bench",
    "_cli_options": "conversion._cli_options",
    "_codecs": "format._codecs",
    "_compose": "loading._compose",
    "_convert": "conversion._convert",
    "_datamodule": "loading._datamodule",
    "_dataset": "loading._dataset",
    "_dataset_writer": "conversion._dataset_writer",
    "_device": "loading._device",
    "_distributed": "loading._distributed",
    "_dtypes": "format._dtypes",
    "_encode": "conversion._encode",
    "_epoch": "loading._epoch",
    "_exactlog": "sampling._exactlog",
    "_format": "format._record",
    "_hdf5": "conversion._hdf5",
    "_helpers": "loading._helpers",
    "_images": "conversion._images",
    "_info": "tools._info",
    "_label_csv": "conversion._label_csv",
    "_lmdb_check": "format._lmdb_check",
    "_loader": "loading._loader",
    "_manifest": "format._manifest",
    "_manifest_check": "format._manifest_check",
    "_native_backend": "loading._native_backend",
    "_native_groups": "loading._native_groups",
    "_order": "sampling._order",
    "_parallel": "conversion._parallel",
    "_payload": "format._payload",
    "_pinned": "loading._pinned",
    "_plan": "loading._plan",
    "_preprocess_h5": "conversion._preprocess_h5",
    "_preprocess_plan": "conversion._preprocess_plan",
    "_run_record": "conversion._run_record",
    "_sampler": "loading._sampler",
    "_samples": "conversion._samples",
    "_sampling": "sampling._sampling",
    "_sampling_setup": "loading._sampling_setup",
    "_shard_files": "format._shard_files",
    "_shard_writer": "conversion._shard_writer",
    "_sources": "conversion._sources",
    "_splits": "format._splits",
    "_state": "loading._state",
    "_tiling": "conversion._tiling",
    "_torch_backend": "loading._torch_backend",
    "_turbojpeg": "format._turbojpeg",
    "_verify": "format._verify",
}


def moved_message(old: str) -> str:
    """Return the warning for importing the old module path ``old`` (``fastload._loader``)."""
    new = "fastload." + MOVED[old.partition(".")[2]]
    return (f"{old} is the old path of {new} (before fastload 0.2) and goes in fastload {REMOVED_IN}, not before "
            f"{REMOVAL_NOT_BEFORE}: import {new}, and load and pickle again anything pickled by fastload 0.1 "
            "(docs/upgrading.md)")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``fastload.<old>`` for every old path in :data:`MOVED` (and nothing else).

    The old name is bound to the new module object itself (as ``os.path`` is ``posixpath``), so
    classes, functions and monkeypatches are the same whichever name is used.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        """Return a spec for an old module path, None for any other name."""
        prefix, _, old = fullname.partition(".")
        if prefix != "fastload" or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """Return the new module (imported now), remembering its own spec; warn that the old path goes."""
        new = "fastload." + MOVED[spec.name.partition(".")[2]]
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        # stacklevel 2: the importer's line (the warnings module skips importlib's bootstrap frames).
        warnings.warn(moved_message(spec.name), FutureWarning, stacklevel=2)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Give the module back its own ``__spec__``, which the import system set to the old name's."""
        spec = module.__spec__
        if spec is not None and spec.loader is self:
            module.__spec__ = spec.loader_state


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (after the path finders: real modules come first)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
