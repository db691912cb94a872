"""Rasters that go with each source image: ``--inputs NAME=DIR`` and ``--targets NAME=DIR``.

A partner folder holds one file per scene, paired with the image by its path relative to
each folder: the same sub-folder and the same stem, any raster suffix (``scenes/x/a.tif``
pairs with ``labels/x/a.png``), or by a CSV mapping (``--pairs``: a header row ``image,NAME,...``,
paths relative to each folder). Each partner becomes a field of its own, cut on the image's grid.
"""

from __future__ import annotations

import csv
import io
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..storage import RemoteFolder, is_remote
from ._cli_options import UsageError
from ._source_files import source_name
from ._sources import Source, find_images, sort_images

ROLES = ("input", "target")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED = ("image", "label", "scene", "window")


@dataclass(frozen=True)
class Partner:
    """One partner folder: the field it becomes, its role and where its files are; picklable."""

    name: str
    role: str  # "input" (an extra input, cut like the image) or "target" (a mask or a per-pixel target)
    data_dir: str  # a local directory, or the URL of ``remote``
    remote: RemoteFolder | None = None

    def where(self, relpath: str) -> str:
        """Return how messages name the partner file ``relpath``: its path, or its URL."""
        return source_name(self.data_dir, self.remote, relpath)


def parse_partner(text: str, role: str) -> tuple[str, str]:
    """Parse ``NAME=DIR`` of ``--inputs``/``--targets``; raise UsageError naming the problem."""
    flag = f"--{role}s"
    name, sep, folder = text.partition("=")
    if not sep or not folder:
        raise UsageError(f"{flag} {text!r}: expected NAME=DIR, e.g. {flag} masks=labels/")
    if not _NAME.fullmatch(name):
        raise UsageError(f"{flag} {text!r}: the field name {name!r} must be a letter or _ then letters, digits or _ "
                         "(at most 64)")
    if name in RESERVED or name.endswith("_class_pixels"):
        raise UsageError(f"{flag} {text!r}: {name!r} is a field name preprocess_tiles writes itself; pick another")
    return name, folder


def partners_of(inputs: Sequence[str], targets: Sequence[str],
                storage_options: Any = None) -> list[Partner]:
    """Return the partners of ``--inputs`` then ``--targets`` (folders checked, nothing listed yet)."""
    partners: list[Partner] = []
    for role, texts in (("input", inputs), ("target", targets)):
        for text in texts:
            name, folder = parse_partner(text, role)
            if any(p.name == name for p in partners):
                raise UsageError(f"--inputs/--targets name the field {name!r} twice")
            if is_remote(folder):
                remote = RemoteFolder(folder, storage_options)
                remote.root  # noqa: B018 (checks the URL and the options, requests nothing)
                partners.append(Partner(name, role, folder, remote))
            else:
                path = Path(folder)
                if not path.is_dir():
                    raise UsageError(f"--{role}s {text!r}: {folder}: no such directory")
                partners.append(Partner(name, role, str(path.resolve())))
    return partners


def _listing(partner: Partner) -> list[str]:
    if partner.remote is not None:
        return sort_images(partner.remote.list())[0]
    return find_images(Path(partner.data_dir))[0]


def _stem_key(relpath: str) -> str:
    folder, name = posixpath.split(relpath)
    return posixpath.join(folder, name.rsplit(".", 1)[0] if "." in name else name)


def pair_by_stem(sources: Sequence[Source], partners: Sequence[Partner]) -> tuple[list[Source], list[dict]]:
    """Return (sources with their partners' paths, the sources lacking one) by the same relative stem.

    Raises UsageError when a partner folder holds two files of one stem (``a.png`` and ``a.tif``):
    which one pairs would be a guess.
    """
    by_partner = []
    for partner in partners:
        keyed: dict[str, list[str]] = {}
        for rel in _listing(partner):
            keyed.setdefault(_stem_key(rel), []).append(rel)
        twice = sorted(f"{partner.where(v[0])} and {posixpath.basename(v[1])}" for v in keyed.values() if len(v) > 1)
        if twice:
            raise UsageError(f"--{partner.role}s {partner.name}: {len(twice)} stem(s) with two files, so pairing by "
                             f"stem is ambiguous (rename one, or pass --pairs CSV): {', '.join(twice[:10])}")
        by_partner.append({k: v[0] for k, v in keyed.items()})
    paired, missing = [], []
    for src in sources:
        key = _stem_key(src.relpath)
        found = [keyed.get(key) for keyed in by_partner]
        lacking = [p for p, rel in zip(partners, found) if rel is None]
        if lacking:
            missing.append({"path": src.relpath, "error": "no partner file " + ", ".join(
                f"{p.name} ({p.where(key)}.*)" for p in lacking)})
        else:
            paired.append(replace(src, partners=tuple(str(r) for r in found)))
    return paired, missing


def pair_by_csv(sources: Sequence[Source], partners: Sequence[Partner], text: str,
                where: str) -> tuple[list[Source], list[dict]]:
    """Return (paired sources, the sources the CSV gives no row) from a ``--pairs`` CSV's ``text``.

    The header names ``image`` and every partner field; other columns are refused. A row naming an
    image that is not among the sources, or a partner file that is not in its folder, is an error.
    """
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise UsageError(f"--pairs {where}: empty")
    header = [h.strip() for h in rows[0]]
    wanted = ["image", *(p.name for p in partners)]
    if sorted(header) != sorted(wanted):
        raise UsageError(f"--pairs {where}: the header must name the columns {wanted} (in any order), not {header}")
    column = {name: header.index(name) for name in wanted}
    listed = [set(_listing(p)) for p in partners]
    known = {s.relpath for s in sources}
    mapping: dict[str, tuple[str, ...]] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UsageError(f"--pairs {where}: line {number} has {len(row)} columns, the header {len(header)}")
        image = row[column["image"]].strip()
        if image not in known:
            raise UsageError(f"--pairs {where}: line {number}: image {image!r} is not a source image of --data-dir")
        if image in mapping:
            raise UsageError(f"--pairs {where}: line {number}: image {image!r} is paired twice")
        files = tuple(row[column[p.name]].strip() for p in partners)
        for partner, rel, names in zip(partners, files, listed):
            if rel not in names:
                raise UsageError(f"--pairs {where}: line {number}: {partner.name} file {rel!r} is not in "
                                 f"{partner.data_dir}")
        mapping[image] = files
    paired = [replace(s, partners=mapping[s.relpath]) for s in sources if s.relpath in mapping]
    missing = [{"path": s.relpath, "error": f"no row in --pairs {where}"} for s in sources if s.relpath not in mapping]
    return paired, missing
