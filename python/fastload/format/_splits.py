"""Dataset roots with splits: ``splits.json`` beside ``train/`` and ``val/``.

A ``--val-fraction`` run writes one dataset per split and, last, a small root
index naming them, so ``fastload info ROOT``, ``fastload verify ROOT`` and
``ShardDataset(ROOT, split="train")`` find them. The index is written after
every split's manifest, so its presence means every split is complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from ._manifest import MANIFEST_NAME, write_json_atomic

SPLITS_NAME = "splits.json"


def write_splits(root: Path, splits: dict[str, dict[str, Any]], provenance: dict[str, Any]) -> None:
    """Write ``ROOT/splits.json``: split name -> {path, samples, sources, class_counts}."""
    write_json_atomic(root / SPLITS_NAME, {"format": "fastload-splits", "splits": splits,
                                           "provenance": provenance})


def read_splits(root: str | os.PathLike) -> dict[str, dict[str, Any]] | None:
    """Return the splits of a dataset root, or None when ``root`` has no ``splits.json``."""
    path = Path(root) / SPLITS_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        splits = doc["splits"]
        if doc.get("format") != "fastload-splits" or not isinstance(splits, dict):
            raise ValueError("not a fastload splits index")
        for name, entry in splits.items():
            sub = str(entry["path"])
            if "/" in sub or "\\" in sub or sub in ("", ".", ".."):
                raise ValueError(f"split {name!r} path {sub!r} must be a plain directory name")
        return splits
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{path}: invalid splits index: {err}") from None


def split_dirs(root: str | os.PathLike) -> dict[str, Path] | None:
    """Return split name -> dataset directory for a root with ``splits.json`` (None for a plain dataset)."""
    splits = read_splits(root)
    if splits is None:
        return None
    return {name: Path(root) / str(entry["path"]) for name, entry in splits.items()}


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
