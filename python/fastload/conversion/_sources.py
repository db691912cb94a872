"""Finding the source images, their labels, and the train/val split by source image."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import xxhash

from ..errors import SourceError
from ._images import is_image_file


@dataclass(frozen=True)
class Source:
    """One source image: its path relative to the data directory, its label (or None), and its partners' paths.

    ``partners``: the path of each ``--inputs``/``--targets`` file of this scene, relative to its
    folder, in the order of the run's partners (``_partners.py``); empty without partners.
    """

    relpath: str
    label: int | None = None
    partners: tuple[str, ...] = ()


def find_images(data_dir: Path) -> tuple[list[str], list[str]]:
    """Return (image paths, other files) under ``data_dir``, relative, in sorted POSIX order."""
    if not data_dir.exists():
        raise SourceError(f"{data_dir}: no such directory")
    if not data_dir.is_dir():
        raise SourceError(f"{data_dir}: not a directory")
    found: list[str] = []
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, name).relative_to(data_dir).as_posix() for name in files]
    return sort_images(found)


def sort_images(relpaths: Iterable[str]) -> tuple[list[str], list[str]]:
    """Return (image paths, other files) of a folder's relative ``/``-separated file paths, in sorted order.

    Files and folders whose names start with ``.`` are left out, as ``find_images`` leaves them.
    """
    images: list[str] = []
    others: list[str] = []
    for rel in relpaths:
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        (images if is_image_file(rel) else others).append(rel)
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

    ``round(val_fraction * n)`` of the ``n`` images go to val. Images are
    ranked by XXH3-64 of ``"{seed}:{relative path}"`` and the first ones go to
    val. With ``stratify`` this is done within each label: each class gets
    the whole part of its share (``val_fraction * its size``) and the images
    left to reach the overall count go one each to the classes with the
    largest remainders (ties by a seeded hash of the label), never taking a
    class's last train image. So small classes still give the requested
    fraction overall; some get no val image (``classes_without_val`` names
    them). Both lists keep sorted path order. Raises SourceError, naming the
    option that helps, when no split is possible.
    """
    if not 0.0 < val_fraction < 1.0:
        raise SourceError(f"--val-fraction must be between 0 and 1, not {val_fraction}")
    n = len(sources)
    total = round(val_fraction * n)
    if total == 0 or total == n:
        side = "val" if total == 0 else "train"
        hint = ((f" ({_at_least(1 / n)} or more gives val one image)" if total == 0 else
                 f" ({_at_most(1 - 1 / n)} or less leaves train one image)") if n >= 2 else "")
        raise SourceError(f"split {side!r} would hold 0 samples: no source image falls into it (--val-fraction "
                          f"{val_fraction} of {n} source images rounds to {total} val images); change "
                          f"--val-fraction{hint} or add images")
    groups: dict[int | None, list[Source]] = {}
    for s in sources:
        groups.setdefault(s.label if stratify else None, []).append(s)
    counts: dict[int | None, int] = {None: total}
    if stratify:
        counts = _stratified_counts({k: len(v) for k, v in groups.items()}, val_fraction, total, seed)
    if not any(counts.values()):
        raise SourceError(f"a stratified split keeps one image of each class in train, and every class has a single "
                          f"image ({n} images): pass --no-stratify to split regardless of class")
    val_paths: set[str] = set()
    for key, members in groups.items():
        ranked = sorted(members, key=lambda s: (xxhash.xxh3_64_intdigest(f"{seed}:{s.relpath}".encode()), s.relpath))
        val_paths.update(s.relpath for s in ranked[:counts[key]])
    return [s for s in sources if s.relpath not in val_paths], [s for s in sources if s.relpath in val_paths]


def _stratified_counts(sizes: dict[int | None, int], val_fraction: float, total: int, seed: int) -> dict[Any, int]:
    """Return val images per class: the shares rounded to ``total`` by largest remainder, one train image kept."""
    fraction = Fraction(str(val_fraction))  # exact shares: 0.1 * 30 is 3, not 3.0000000000000004
    shares = {k: fraction * n for k, n in sizes.items()}
    counts = {k: min(int(q), sizes[k] - 1) for k, q in shares.items()}
    order = sorted(sizes, key=lambda k: (-(shares[k] - int(shares[k])),
                                         xxhash.xxh3_64_intdigest(f"{seed}:class:{k}".encode())))
    left = total - sum(counts.values())
    while left > 0:  # one more image each, largest remainder first; classes at their cap are passed over
        grown = False
        for k in order:
            if left > 0 and counts[k] < sizes[k] - 1:
                counts[k] += 1
                left -= 1
                grown = True
        if not grown:
            break
    return counts


def classes_without_val(sources: list[Source], val: list[Source]) -> dict[int, int]:
    """Return label -> images of each class that has no image in ``val``."""
    in_val = {s.label for s in val}
    missing: dict[int, int] = {}
    for s in sources:
        if s.label is not None and s.label not in in_val:
            missing[s.label] = missing.get(s.label, 0) + 1
    return missing


def _at_least(x: float) -> str:
    """Return ``x`` rounded up to two decimals, as an option value."""
    return f"{math.ceil(x * 100 - 1e-9) / 100:g}"


def _at_most(x: float) -> str:
    """Return ``x`` rounded down to two decimals, as an option value."""
    return f"{math.floor(x * 100 + 1e-9) / 100:g}"


def _some(items: list[str], limit: int = 10) -> str:
    text = ", ".join(items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")
