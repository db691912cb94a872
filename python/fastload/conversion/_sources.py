"""Finding the source images, their labels, and the train/val split by source image."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..errors import SourceError
from ._images import is_image_file


@dataclass(frozen=True)
class Source:
    """One source image: its path relative to the data directory and its label (or None)."""

    relpath: str
    label: int | None = None


def find_images(data_dir: Path) -> tuple[list[str], list[str]]:
    """Return (image paths, other files) under ``data_dir``, relative, in sorted POSIX order."""
    if not data_dir.exists():
        raise SourceError(f"{data_dir}: no such directory")
    if not data_dir.is_dir():
        raise SourceError(f"{data_dir}: not a directory")
    images: list[str] = []
    others: list[str] = []
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            rel = Path(root, name).relative_to(data_dir).as_posix()
            (images if is_image_file(name) else others).append(rel)
    return sorted(images), sorted(others)


def labels_from_dirs(relpaths: list[str]) -> tuple[list[Source], list[str]]:
    """Label each image by its first folder under the data directory; return sources and class names."""
    loose = [p for p in relpaths if "/" not in p]
    if loose:
        raise SourceError(f"--labels-from-dirs: images outside a class folder: {_some(loose)}")
    classes = sorted({p.split("/", 1)[0] for p in relpaths})
    index = {c: i for i, c in enumerate(classes)}
    return [Source(p, index[p.split("/", 1)[0]]) for p in relpaths], classes


def split_by_source(sources: list[Source], val_fraction: float, seed: int,
                    stratify: bool = False) -> tuple[list[Source], list[Source]]:
    """Split whole source images into (train, val), deterministic in the seed.

    Images are ranked by XXH3-64 of ``"{seed}:{relative path}"``; the first
    ``round(val_fraction * n)`` go to val. With ``stratify`` this is done within
    each label separately, so every class is split in the same proportion (a
    class of one image stays whole; the caller warns). Both lists keep sorted
    path order. A split may come out empty: the caller refuses that.
    """
    if not 0.0 < val_fraction < 1.0:
        raise SourceError(f"--val-fraction must be between 0 and 1, not {val_fraction}")
    groups: dict[int | None, list[Source]] = {}
    for s in sources:
        groups.setdefault(s.label if stratify else None, []).append(s)
    val_paths: set[str] = set()
    for members in groups.values():
        n_val = round(val_fraction * len(members))
        ranked = sorted(members, key=lambda s: (xxhash.xxh3_64_intdigest(f"{seed}:{s.relpath}".encode()), s.relpath))
        val_paths.update(s.relpath for s in ranked[:n_val])
    return [s for s in sources if s.relpath not in val_paths], [s for s in sources if s.relpath in val_paths]


def _some(items: list[str], limit: int = 10) -> str:
    text = ", ".join(items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")
