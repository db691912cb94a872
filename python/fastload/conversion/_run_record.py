"""What a preprocess_tiles run records about its options, and the check ``--resume`` makes against it.

Every written file of a run (the journal ``.progress.json``, each split's
``manifest.json``, the root ``splits.json``) carries the options; ``--resume``
with other options, whether the run finished or not, is refused naming each
changed option with both values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..format._manifest import MANIFEST_NAME
from ..format._splits import SPLIT_FOLDERS, SPLITS_NAME
from ._cli_options import UsageError
from ._journal import PROGRESS_NAME

# A finished run's files that record its options, in the order they are looked at (a URL holds only these).
RECORDING_FILES = (SPLITS_NAME, MANIFEST_NAME, *(f"{split}/{MANIFEST_NAME}" for split in SPLIT_FOLDERS))


def _recorded_options(out: Path) -> tuple[Path, dict[str, Any]] | None:
    candidates = [out / SPLITS_NAME, out / MANIFEST_NAME, out / PROGRESS_NAME]
    candidates += [out / s / n for s in SPLIT_FOLDERS for n in (MANIFEST_NAME, PROGRESS_NAME)]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        options = doc.get("options") if path.name == PROGRESS_NAME else recorded_options_of(doc)
        if isinstance(options, dict):
            return path, options
    return None


# What a missing option means: a run records no --order when it writes in source order (as runs did before it).
_ABSENT = {"order": "source"}


def _show(value: Any) -> str:
    if value is None:
        return "(not given)"
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def recorded_options_of(doc: Any) -> dict[str, Any] | None:
    """Return the options a manifest or ``splits.json`` document records (``provenance.options``), or None."""
    provenance = doc.get("provenance") if isinstance(doc, dict) else None
    options = provenance.get("options") if isinstance(provenance, dict) else None
    return options if isinstance(options, dict) else None


def check_resume_options(out: Path, options: dict[str, Any]) -> None:
    """Raise UsageError when ``options`` differ from those recorded in ``out`` (nothing recorded: no check)."""
    found = _recorded_options(out)
    if found is not None:
        check_options_match(str(out), found[0].name, found[1], options)


def check_options_match(out: str, where: str, recorded: dict[str, Any], options: dict[str, Any]) -> None:
    """Raise UsageError when ``options`` differ from ``recorded`` (those of the run's file ``where`` in ``out``)."""
    now = json.loads(json.dumps(options))
    changed = [k for k in sorted(set(now) | set(recorded)) if now.get(k) != recorded.get(k)]
    if not changed:
        return
    lines = "\n  ".join(f"--{k.replace('_', '-')}: recorded {_show(recorded.get(k, _ABSENT.get(k)))}, "
                        f"now {_show(now.get(k, _ABSENT.get(k)))}" for k in changed)
    raise UsageError(f"{out}: --resume with options that differ from the recorded run ({where}):\n  {lines}\n"
                     "resume with the recorded options, or start again with --overwrite")
