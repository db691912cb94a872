"""Dataset roots with splits: ``splits.json`` beside ``train/`` and ``val/``.

A ``--val-fraction`` run writes one dataset per split and, last, a small root
index naming them, so ``fastload info ROOT``, ``fastload verify ROOT`` and
``ShardDataset(ROOT, split="train")`` find them. The index is written after
every split's manifest, so its presence means every split is complete.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from ._manifest import MANIFEST_NAME, write_json_atomic
from ._strict_json import JsonProblem, load_strict

SPLITS_NAME = "splits.json"
SPLIT_FOLDERS = ("train", "val")  # where a dataset root with splits keeps them
MAX_SPLITS_BYTES = 16 << 20  # an index of a few splits; per-class counts of 100,000 classes take about 6 MB
MAX_NAME_CHARS = 255  # a split's name and its directory's


def write_splits(root: Path, splits: dict[str, dict[str, Any]], provenance: dict[str, Any]) -> None:
    """Write ``ROOT/splits.json``: split name -> {path, samples, sources, class_counts}."""
    write_json_atomic(root / SPLITS_NAME, {"format": "fastload-splits", "splits": splits,
                                           "provenance": provenance})


def read_splits(root: str | os.PathLike, check_dirs: bool = True) -> dict[str, dict[str, Any]] | None:
    """Return the splits of a dataset root, or None when ``root`` has no ``splits.json``.

    ``check_dirs=False`` leaves out the check that each split's directory exists (a remote root's
    index, read from a copy: there each split's manifest is fetched next).

    The index is untrusted input, read as strictly as the manifest: every problem is a
    DatasetError naming ``splits.json`` and the key (``splits['val'].path: ...``).
    """
    path = Path(root) / SPLITS_NAME
    try:
        if not path.exists():
            return None
    except OSError as err:  # e.g. a root that cannot be searched
        raise DatasetError(f"{path}: unreadable splits index: {err}") from None
    doc = load_strict(path, MAX_SPLITS_BYTES, "splits index")
    try:
        return _check_splits(doc, Path(root), check_dirs)
    except JsonProblem as err:
        raise DatasetError(f"{path}: invalid splits index: {err}") from None


def _check_splits(doc: Any, root: Path, check_dirs: bool = True) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("format") != "fastload-splits":
        raise JsonProblem("format", "not a fastload splits index (format 'fastload-splits')")
    splits = doc.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise JsonProblem("splits", "expected an object naming at least one split")
    if "provenance" in doc and not isinstance(doc["provenance"], dict):
        raise JsonProblem("provenance", "expected an object")
    seen: dict[str, str] = {}
    for name, entry in splits.items():
        where = f"splits[{name[:40]!r}]"
        if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
            raise JsonProblem(where, f"a split name is 1 to {MAX_NAME_CHARS} printable characters")
        if not isinstance(entry, dict):
            raise JsonProblem(where, f"expected an object, not {type(entry).__name__}")
        sub = entry.get("path")
        if not isinstance(sub, str):
            raise JsonProblem(f"{where}.path", f"expected a directory name, not {type(sub).__name__}")
        if ("/" in sub or "\\" in sub or sub in ("", ".", "..") or len(sub) > MAX_NAME_CHARS
                or not sub.isprintable()):
            raise JsonProblem(f"{where}.path", f"{sub[:40]!r} must be a plain directory name")
        if sub in seen:
            raise JsonProblem(f"{where}.path", f"{sub!r} is also split {seen[sub]!r}'s directory")
        seen[sub] = name
        if check_dirs and not (root / sub).is_dir():
            raise JsonProblem(f"{where}.path", f"{sub!r} is not a directory in {root}")
        for key in ("samples", "sources"):
            value = entry.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise JsonProblem(f"{where}.{key}", f"{str(value)[:40]} is not a count")
        counts = entry.get("class_counts")
        if counts is not None and not (isinstance(counts, dict) and all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 for n in counts.values())):
            raise JsonProblem(f"{where}.class_counts", "expected null or an object of class name to count")
    return splits


def split_dirs(root: str | os.PathLike) -> dict[str, Path] | None:
    """Return split name -> dataset directory for a root with ``splits.json`` (None for a plain dataset)."""
    splits = read_splits(root)
    if splits is None:
        return None
    return {name: Path(root) / entry["path"] for name, entry in splits.items()}


def resolve_dataset_path(path: str | os.PathLike, split: str | None) -> Path:
    """Return the dataset directory meant by ``path`` and ``split``; raise DatasetError when unclear.

    A root with splits needs ``split``; a plain dataset refuses one.
    """
    root = Path(path)
    dirs = split_dirs(root)
    if dirs is None:
        if split is None:
            if not (root / MANIFEST_NAME).exists():
                found = [d.name for d in (root / "train", root / "val") if (d / MANIFEST_NAME).exists()]
                if found:
                    raise DatasetError(f"{root}: holds splits {found} but no {SPLITS_NAME} (an interrupted "
                                       f"--val-fraction run? continue it with --resume); or open "
                                       f"{root / found[0]} directly")
            return root
        raise DatasetError(f"{root}: split={split!r} given, but this is not a dataset root with splits "
                           f"(no {SPLITS_NAME})")
    if split is None:
        names = ", ".join(repr(n) for n in dirs)
        raise DatasetError(f"{root}: a dataset root with splits {names}; pass split= one of them "
                           f"(e.g. split={next(iter(dirs))!r})")
    if split not in dirs:
        raise DatasetError(f"{root}: no split {split!r}; the splits are {list(dirs)}")
    return dirs[split]
