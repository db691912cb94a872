"""Planning a preprocess_tiles run before anything is written.

Probe every source (all unreadable files found in one pass), check they agree,
count each one's tiles, and refuse a plan that would write an empty dataset or
split: a converter that exits 0 with nothing in it is the worst kind of bug.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._progress import Progress
from ..storage import RemoteFolder
from ._dataset_writer import PreprocessError
from ._encode import TileSpec
from ._images import ImageInfo, ImageReadError, probe_image
from ._parallel import ordered_map, threaded_ordered_map
from ._source_files import readable_source, source_name
from ._sources import Source

_LIST = 20


def listed(items: list[str]) -> str:
    """Return up to 20 items, one per indented line, and how many more there are."""
    more = f"\n  ... and {len(items) - _LIST} more" if len(items) > _LIST else ""
    return "\n  " + "\n  ".join(items[:_LIST]) + more


def probe_source(data_dir: str, remote: RemoteFolder | None, relpath: str, npy_layout: str,
                 mode: str) -> ImageInfo:
    """Probe one source file (``probe_image``), read through a local copy when it is remote."""
    with readable_source(data_dir, remote, relpath, keep=True) as path:  # the encode reads the copy again
        return probe_image(path, npy_layout, mode)


PROBE_THREADS_PER_WORKER = 4  # probes of objects in a store: downloads mostly, overlapped in threads


def probe_map(args: Iterable[tuple], workers: int, client: Any, remote: bool) -> Iterator[tuple[Any, Any]]:
    """Run ``probe_source`` over ``args`` in order, yielding (info, error) per source.

    On the Dask ``client``; in threads of this process for objects in a store (each probe mostly
    waits on its download; no pool of fresh interpreters to start); else in ``workers`` processes.
    """
    if remote and client is None:
        return threaded_ordered_map(probe_source, args, max(1, workers) * PROBE_THREADS_PER_WORKER)
    return ordered_map(probe_source, args, workers, client=client, fresh_workers=remote)


def probe_all(data_dir: str | Path, sources: list[Source], npy_layout: str, mode: str, workers: int,
              skip_bad: bool, client: Any = None,
              remote: RemoteFolder | None = None,
              progress: bool = False) -> tuple[list[Source], list[ImageInfo], list[dict]]:
    """Probe every source; return (readable sources, their infos, the unreadable ones).

    The probes run in ``workers`` processes, or on a Dask ``client``'s cluster; with ``remote`` (the
    folder in object storage ``data_dir`` names) the local processes are fresh interpreters. With
    ``progress``, the files probed are counted as a step ``probe`` (``_progress``): in object
    storage each probe downloads its file, which can take minutes before the first shard.

    Raises PreprocessError listing every unreadable file unless ``skip_bad``.
    """
    good, infos, bad = [], [], []
    args = ((str(data_dir), remote, s.relpath, npy_layout, mode) for s in sources)
    outcomes = probe_map(args, workers, client, remote is not None)
    with Progress("probe", len(sources), unit="files", enabled=progress, leave=False) as bar:
        for src, (info, err) in zip(sources, outcomes):
            if err is None:
                assert info is not None
                good.append(src)
                infos.append(info)
            elif isinstance(err, ImageReadError):
                bad.append({"path": src.relpath, "error": err.reason})
            else:
                raise err
            bar.update(1)
    if bad and not skip_bad:
        lines = listed([f"{source_name(str(data_dir), remote, b['path'])}: {b['error']}" for b in bad])
        raise PreprocessError(f"{len(bad)} unreadable image(s); fix or remove them, or pass --skip-bad to skip "
                              f"them:{lines}")
    for b in bad:
        print(f"skipping {b['path']}: {b['error']}", file=sys.stderr)
    return good, infos, bad


def check_consistent(sources: list[Source], infos: list[ImageInfo], tiling: bool, cast: str | None) -> ImageInfo:
    """Return the first image's info; raise PreprocessError listing images that differ from it."""
    ref = infos[0]
    checks = [("channels", lambda i: i.channels)]
    if cast is None:
        checks.append(("dtype", lambda i: i.dtype))
    if not tiling:
        checks.append(("shape", lambda i: (i.height, i.width)))
    for what, key in checks:
        odd = [f"{s.relpath} ({key(i)})" for s, i in zip(sources, infos) if key(i) != key(ref)]
        if odd:
            hint = {"shape": " (use --tile-size to cut images of any size into tiles)",
                    "channels": " (for PNG/JPEG, --mode RGB, RGBA or L converts every image to one mode)",
                    "dtype": " (--dtype casts every image to one dtype, refusing lossy casts)"}[what]
            raise PreprocessError(f"images differ in {what}: {sources[0].relpath} has {key(ref)}, these differ"
                                  f"{hint}:{listed(odd)}")
    return ref


@dataclass
class SplitPlan:
    """The sources of one output dataset and the tiles each gives."""

    name: str
    sources: list[Source]
    tile_counts: list[int]
    no_tiles: list[dict]
    all_paths: set[str]

    @property
    def samples(self) -> int:
        """Return the number of samples the split will hold."""
        return sum(self.tile_counts)


def plan_split(name: str, sources: list[Source], info_of: dict[str, ImageInfo], tiles: TileSpec) -> SplitPlan:
    """Count the tiles of each readable source of a split; note the sources that give none."""
    usable = [s for s in sources if s.relpath in info_of]
    counts = [len(tiles.grid(info_of[s.relpath].height, info_of[s.relpath].width)) for s in usable]
    no_tiles = [{"path": s.relpath, "height": info_of[s.relpath].height, "width": info_of[s.relpath].width}
                for s, c in zip(usable, counts) if c == 0]
    return SplitPlan(name, usable, counts, no_tiles, {s.relpath for s in sources})


def check_not_empty(plan: SplitPlan, tiles: TileSpec, data_dir: str | Path) -> None:
    """Raise PreprocessError when the split would hold no samples, naming the images smaller than the tile."""
    what = f"split {plan.name!r}" if plan.name else "the output"
    if plan.samples:
        return
    if not plan.all_paths:
        raise PreprocessError(f"{what} would hold 0 samples: no source image falls into it (the split is by whole "
                              "image, rounded); change --val-fraction or add images")
    if not plan.sources or tiles.tile is None:
        raise PreprocessError(f"{what} would hold 0 samples: none of its {len(plan.all_paths)} source file(s) is "
                              f"readable (under {data_dir})")
    th, tw = tiles.tile
    small = [f"{d['path']} ({d['height']}x{d['width']})" for d in plan.no_tiles]
    raise PreprocessError(f"{what} would hold 0 samples: its {len(small)} image(s) are smaller than --tile-size "
                          f"{th}x{tw}:{listed(small)}\npass --edge pad to keep partial tiles (zero-padded), "
                          "or a smaller --tile-size")


def warn_no_tiles(plan: SplitPlan, tiles: TileSpec) -> None:
    """Print a warning listing the images that give no tile (they are also listed in the manifest)."""
    if not plan.no_tiles or tiles.tile is None:
        return
    th, tw = tiles.tile
    small = [f"{d['path']} ({d['height']}x{d['width']})" for d in plan.no_tiles]
    where = f" in split {plan.name!r}" if plan.name else ""
    print(f"warning: {len(small)} image(s){where} are smaller than --tile-size {th}x{tw} and give no tiles "
          f"(--edge pad keeps partial tiles); listed as no_tiles in the manifest:{listed(small)}", file=sys.stderr)


def class_counts(plan: SplitPlan, classes: list[str] | None) -> dict[str, int]:
    """Return samples per class name (or per integer label) in the split, in label order."""
    counts: Counter[int] = Counter()
    for src, n in zip(plan.sources, plan.tile_counts):
        if src.label is not None:
            counts[src.label] += n
    labels = range(len(classes)) if classes else sorted(counts)
    return {(classes[i] if classes else str(i)): counts.get(i, 0) for i in labels}


def warn_lopsided_classes(plans: list[SplitPlan], classes: list[str] | None,
                          expected: dict[str, set[str]] | None = None) -> None:
    """Warn about every class that ends up with no samples in one of the splits.

    ``expected`` names, per split, the classes the split itself left without
    images there (already reported on one line): they get no warning.
    """
    per_split = {p.name: class_counts(p, classes) for p in plans}
    for name in dict.fromkeys(c for counts in per_split.values() for c in counts):
        empty = [split for split, counts in per_split.items() if counts.get(name, 0) == 0
                 and name not in (expected or {}).get(split, set())]
        if empty:
            have = {split: counts.get(name, 0) for split, counts in per_split.items()}
            print(f"warning: class {name!r} has no {' or '.join(empty)} samples ({have}); "
                  "more images of this class, or another --val-fraction/--seed (or --no-stratify), would fix it",
                  file=sys.stderr)
