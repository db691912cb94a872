"""Whether an output directory is a conversion's own: what ``overwrite`` may delete and ``resume`` continue.

A run writes shards (``shard-NNNNN.lmdb``), shards being built (``.shard-NNNNN.lmdb.build``,
``.compact``, ``.tmp``), the tasks' staged shards (``.tasks/<attempt>/``), its journal
(``.progress.json``), its manifest and, with splits, ``train/`` and ``val/`` folders and
``splits.json``; a Ctrl-C between writing a JSON file's temporary copy and renaming it leaves the
copy; ``fastload upgrade`` stages in ``.upgrade/`` and keeps ``manifest.old.json``. Each is known by
its exact name and kind (a regular file, a real directory), never a link. A folder holding
anything else is the user's: every writer refuses to delete it, naming what it holds.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..format._manifest import MANIFEST_NAME, UPGRADE_DIR, json_temp_path
from ..format._manifest_check import SHARD_FILE
from ..format._splits import SPLIT_FOLDERS, SPLITS_NAME
from ._journal import PROGRESS_NAME
from ._shard_targets import TASKS_DIR

_SHARD = re.compile(SHARD_FILE.pattern + "(-lock)?")  # LMDB's lock file, where a tool opened a shard with locking
_PARTIAL = re.compile(r"\." + SHARD_FILE.pattern + r"\.(build|compact|tmp)")
_RECORDS = (MANIFEST_NAME, PROGRESS_NAME, "manifest.old.json")
JSON_TEMPS = frozenset(json_temp_path(Path(name)).name for name in (PROGRESS_NAME, MANIFEST_NAME, SPLITS_NAME))


def _regular_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def is_shard_file_name(name: str) -> bool:
    """Return whether ``name`` is a shard's (``shard-NNNNN.lmdb``) or a shard being built's."""
    return _SHARD.fullmatch(name) is not None or _PARTIAL.fullmatch(name) is not None


def records_a_run(out: Path) -> bool:
    """Return whether ``out`` holds a run's journal, manifest or ``splits.json`` (or a split folder's)."""
    files = [out / MANIFEST_NAME, out / PROGRESS_NAME, out / SPLITS_NAME,
             *(out / split / name for split in SPLIT_FOLDERS for name in (MANIFEST_NAME, PROGRESS_NAME)
               if _real_dir(out / split))]
    return any(_regular_file(p) for p in files)


def foreign_entry(out: Path, root: bool = True) -> Path | None:
    """Return the first entry of ``out`` that no run writes, or None when it holds only a run's files."""
    for path in sorted(out.iterdir()):
        name = path.name
        if _real_dir(path):
            if root and name in SPLIT_FOLDERS:
                found = foreign_entry(path, root=False)
            elif name == TASKS_DIR:
                found = next((p for attempt in sorted(path.iterdir()) for p in _attempt_foreign(attempt)), None)
            elif name == UPGRADE_DIR:
                found = next((p for p in sorted(path.iterdir()) if not _regular_file(p)), None)
            else:
                found = path
            if found is not None:
                return found
        elif not (_regular_file(path) and (is_shard_file_name(name) or name in _RECORDS or name in JSON_TEMPS
                                           or (root and name == SPLITS_NAME))):
            return path
    return None


def _attempt_foreign(attempt: Path) -> list[Path]:
    """Return what in a task's attempt folder (``.tasks/<hex>/``) is not a shard or a shard being built."""
    if not _real_dir(attempt):
        return [attempt]
    return [p for p in attempt.iterdir() if not (_regular_file(p) and is_shard_file_name(p.name))]


def is_run_output(out: Path) -> bool:
    """Return whether ``out`` holds only a run's files, finished or not: what ``overwrite`` may delete."""
    return foreign_entry(out) is None


def leftovers_only(out: Path) -> bool:
    """Return whether ``out`` holds only what a run leaves before its first shard: split folders, partial shards.

    Shards that worker tasks staged (``.tasks/``) and nobody committed are leftovers too: a run
    interrupted between making that folder and deleting it leaves it behind.
    """
    for path in out.iterdir():
        if _real_dir(path) and path.name == TASKS_DIR:
            continue
        if _real_dir(path) and path.name in SPLIT_FOLDERS:
            if not leftovers_only(path):
                return False
        elif not (_regular_file(path) and _PARTIAL.fullmatch(path.name)):
            return False
    return True
