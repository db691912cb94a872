"""The parts of a ``preprocess_tiles`` run that scenes with targets and inputs add (docs/dense.md).

Options checked before anything is read, sources paired with their partner files, the
partners planned into fields, the tiles ``--min-labelled`` keeps counted, and each split's
``scenes`` (sizes, partner files, georeferencing) for its manifest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .._progress import Progress
from ..errors import PreprocessError
from ._cli_options import UsageError
from ._encode import EncodeSettings, count_tiles
from ._images import ImageInfo
from ._label_csv import read_csv_text
from ._parallel import ordered_map
from ._partner_plan import parse_num_classes
from ._partners import Partner, pair_by_csv, pair_by_stem
from ._preprocess_plan import SplitPlan, listed
from ._scene_tiles import DenseSpec
from ._sources import Source


def check_dense_options(args: argparse.Namespace) -> None:
    """Raise UsageError for a scene option that would be ignored, or out of range, before anything is read."""
    inputs, targets = getattr(args, "inputs", []) or [], getattr(args, "targets", []) or []
    if not inputs and not targets:
        for flag, name in (("--pairs", "pairs"), ("--field-codec", "field_codec")):
            if getattr(args, name, None):
                raise UsageError(f"{flag} needs --inputs or --targets")
    if not targets:
        for flag, name in (("--num-classes", "num_classes"), ("--ignore-index", "ignore_index"),
                           ("--min-labelled", "min_labelled")):
            if getattr(args, name, None) not in (None, []):
                raise UsageError(f"{flag} needs --targets")
    if (inputs or targets) and getattr(args, "h5_dataset", None):
        raise UsageError("--inputs/--targets pair raster files; --h5-dataset reads stacks of samples: drop one")
    fraction = getattr(args, "min_labelled", None)
    if fraction is not None and getattr(args, "ignore_index", None) is None:
        raise UsageError("--min-labelled counts the pixels that are not --ignore-index: pass --ignore-index VALUE "
                         "(the value of unlabelled pixels in the targets)")
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise UsageError(f"--min-labelled must be a fraction in (0, 1], not {fraction}")
    if targets and (args.edge or "drop") == "pad" and getattr(args, "ignore_index", None) is None:
        raise UsageError("--edge pad pads targets too, and a padded 0 would read as a label: pass --ignore-index "
                         "VALUE, the value that padding takes (and that losses and class counts ignore)")


def outside_partners(relpaths: list[str], data_dir: Path | str, partners: Any) -> list[str]:
    """Return the images of ``data_dir`` that are not in a partner folder inside it (masks are no scenes)."""
    if isinstance(data_dir, str):
        return relpaths
    inside = []
    for partner in partners or ():
        if partner.remote is None:
            try:
                inside.append(Path(partner.data_dir).resolve().relative_to(Path(data_dir).resolve()).as_posix())
            except ValueError:
                continue
    if "." in inside:
        raise UsageError(f"a --inputs/--targets folder is --data-dir itself ({data_dir}); put the partner files in "
                         "a folder of their own")
    return [r for r in relpaths if not any(r.startswith(d + "/") for d in inside)]


def pair_sources(args: argparse.Namespace, sources: list[Source]) -> tuple[list[Source], list[dict]]:
    """Return (every source, with its partner files where it has them all; those lacking one, as bad files).

    The sources lacking a partner (kept without partners, skipped by the run: ``--skip-bad``) stay
    in the list, so that the train/val split does not depend on them. Raises PreprocessError
    listing every source that lacks a partner, unless ``--skip-bad``.
    """
    partners: list[Partner] = getattr(args, "partners", [])
    if not partners:
        return sources, []
    if getattr(args, "pairs", None):
        pairs = args.pairs
        text = read_csv_text(pairs, getattr(args, "storage_options", None))
        paired, missing = pair_by_csv(sources, partners, text, str(pairs))
    else:
        paired, missing = pair_by_stem(sources, partners)
    if missing and not args.skip_bad:
        raise PreprocessError(f"{len(missing)} image(s) without their partner file(s); add them, or pass --skip-bad "
                              f"to skip those scenes:{listed([m['path'] + ': ' + m['error'] for m in missing])}")
    for m in missing:
        print(f"skipping {m['path']}: {m['error']}", file=sys.stderr)
    if not paired:
        raise PreprocessError("no image has all its partner files")
    with_partners = {s.relpath: s for s in paired}
    return [with_partners.get(s.relpath, s) for s in sources], missing


def dense_spec(args: argparse.Namespace, partner_infos: list[ImageInfo]) -> DenseSpec:
    """Return the run's DenseSpec from its options and the partners' infos (of the first scene)."""
    partners: list[Partner] = getattr(args, "partners", [])
    classes = parse_num_classes(getattr(args, "num_classes", []) or [], partners, partner_infos)
    targets = [p.name for p in partners if p.role == "target"]
    labelled = next(iter(classes), targets[0] if targets else None)
    fraction = getattr(args, "min_labelled", None)
    if fraction is not None and labelled is not None:
        info = partner_infos[[p.name for p in partners].index(labelled)]
        if info.channels != 1:
            raise UsageError(f"--min-labelled looks at target {labelled!r}, which has {info.channels} bands; it needs "
                             "a one-band target")
    return DenseSpec(tuple(partners), windows=args.tile_size is not None, classes=tuple(classes.items()),
                     ignore_index=getattr(args, "ignore_index", None), min_labelled=fraction,
                     labelled_target=labelled if fraction is not None else None)


def kept_tile_counts(settings: EncodeSettings, sources: list[Source], workers: int, client: Any,
                     progress: bool = False) -> dict[str, int]:
    """Return source path -> tiles that ``--min-labelled`` keeps, reading each scene's target once.

    With ``progress``, the scenes read are counted as a step ``min-labelled`` (``_progress``).
    """
    remote = settings.remote is not None or any(p.remote is not None for p in settings.dense.partners)
    outcomes = ordered_map(count_tiles, ((settings, s) for s in sources), workers, client=client,
                           fresh_workers=remote)
    counts = {}
    with Progress("min-labelled", len(sources), unit="scenes", enabled=progress, leave=False) as bar:
        for src, (count, err) in zip(sources, outcomes):
            if err is not None:
                raise PreprocessError(str(err)) from err
            counts[src.relpath] = int(count or 0)
            bar.update(1)
    return counts


def scenes_doc(plan: SplitPlan, info_of: dict[str, ImageInfo], partners: list[Partner]) -> list[dict[str, Any]]:
    """Return the manifest's ``scenes`` of a split: per source, its size, tiles, partner files and georeferencing."""
    scenes = []
    for src, tiles in zip(plan.sources, plan.tile_counts):
        info = info_of[src.relpath]
        scene: dict[str, Any] = {"path": src.relpath, "height": info.height, "width": info.width, "tiles": tiles}
        if partners:
            scene["files"] = {p.name: rel for p, rel in zip(partners, src.partners)}
        if info.georef:
            scene["georef"] = info.georef
        scenes.append(scene)
    return scenes

