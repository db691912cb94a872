"""Whether an output directory is a conversion's own: what ``overwrite`` may delete and ``resume`` continue.

A run writes shards (``shard-*.lmdb``), shards being built (``.shard-*.build``, ``.compact``,
``.tmp``), the tasks' staged shards (``.tasks/``), its journal (``.progress.json``), its manifest
and, with splits, ``train/`` and ``val/`` folders and ``splits.json``; a Ctrl-C between writing a
JSON file's temporary copy and renaming it leaves the copy. A folder holding anything else is the
user's: every writer refuses to delete it.
"""

from __future__ import annotations

from pathlib import Path

from ..format._manifest import MANIFEST_NAME, json_temp_path
from ..format._splits import SPLITS_NAME
from ._journal import PROGRESS_NAME
from ._shard_targets import TASKS_DIR

SPLIT_FOLDERS = ("train", "val")
_JSON_TEMPS = frozenset(json_temp_path(Path(name)).name for name in (PROGRESS_NAME, MANIFEST_NAME, SPLITS_NAME))


def records_a_run(out: Path) -> bool:
    """Return whether ``out`` holds a run's journal, manifest or ``splits.json`` (or a split folder's)."""
    files = [out / MANIFEST_NAME, out / PROGRESS_NAME, out / SPLITS_NAME,
             *(out / split / name for split in SPLIT_FOLDERS for name in (MANIFEST_NAME, PROGRESS_NAME))]
    return any(p.exists() for p in files)


def run_files_only(out: Path, root: bool = True) -> bool:
    """Return whether ``out`` holds only files that a run writes (at the root, split folders of them too)."""
    for path in out.iterdir():
        if root and path.name in SPLIT_FOLDERS and path.is_dir() and not path.is_symlink():
            if not run_files_only(path, root=False):
                return False
        elif not (path.name.startswith(("shard-", ".shard-")) or path.name == TASKS_DIR
                  or path.name in _JSON_TEMPS):
            return False
    return True


def is_run_output(out: Path) -> bool:
    """Return whether ``out`` is a run's output, finished or not: what ``overwrite`` may delete."""
    return records_a_run(out) or run_files_only(out)


def leftovers_only(out: Path) -> bool:
    """Return whether ``out`` holds only what a run leaves before its first shard: split folders, partial shards.

    Shards that worker tasks staged (``.tasks/``) and nobody committed are leftovers too: a run
    interrupted between making that folder and deleting it leaves it behind.
    """
    for path in out.iterdir():
        if path.is_dir() and not path.is_symlink() and path.name == TASKS_DIR:
            continue
        if path.is_dir() and path.name in SPLIT_FOLDERS:
            if not leftovers_only(path):
                return False
        elif not (path.is_file() and path.name.startswith(".shard-")
                  and path.name.endswith((".build", ".compact", ".tmp"))):
            return False
    return True
