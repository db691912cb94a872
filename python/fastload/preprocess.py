r"""``preprocess_tiles``: turn a folder of images or rasters into LMDB shard datasets.

Example::

    preprocess_tiles --data-dir scenes/ --output-dir shards/ --tile-size 256 --stride 256 \
        --codec zstd --val-fraction 0.1 --seed 0 --workers 4
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from ._dataset_writer import PROGRESS_NAME, PreprocessError, ShardLimits, WriteJob, WriteResult, write_dataset
from ._dtypes import NUMPY_DTYPES, dtype_name
from ._encode import EncodeSettings, TileSpec
from ._format import CODECS, DEFAULT_ZSTD_LEVEL, Field
from ._images import ImageInfo, ImageReadError, probe_image
from ._manifest import MANIFEST_NAME
from ._parallel import ordered_map
from ._sources import Source, SourceError, find_images, labels_from_csv, labels_from_dirs, split_by_source
from .errors import DatasetError

DEFAULT_SHARD_BYTES = 256 * 10**6
_OPTIONS_IN_PROVENANCE = ("labels", "labels_from_dirs", "tile_size", "stride", "edge", "layout", "dtype",
                          "npy_layout", "val_fraction", "seed", "samples_per_shard", "shard_size", "codec", "level",
                          "skip_bad")


class UsageError(Exception):
    """The command line asks for something impossible; exit status 2."""


def parse_size(text: str) -> int:
    """Parse a byte size such as ``512MB``, ``1.5GiB`` or ``4096``."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGTIB")
    unit = stripped[len(number):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512MB or 1GiB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value)


def parse_hw(text: str) -> tuple[int, int]:
    """Parse ``H`` or ``HxW`` into (height, width)."""
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H or HxW, not {text!r}") from None
    if len(values) not in (1, 2) or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive H or HxW, not {text!r}")
    return (values[0], values[-1])


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``preprocess_tiles``."""
    p = argparse.ArgumentParser(prog="preprocess_tiles", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", "--data_dir", dest="data_dir", required=True, type=Path,
                   help="folder of .png/.jpg/.tif/.npy files, searched recursively")
    p.add_argument("--output-dir", "--output_dir", dest="output_dir", required=True, type=Path)
    labels = p.add_mutually_exclusive_group()
    labels.add_argument("--labels", type=Path, help="CSV of 'relative path,label' rows")
    labels.add_argument("--labels-from-dirs", action="store_true", help="one sub-folder per class")
    p.add_argument("--tile-size", type=parse_hw, help="cut images into HxW tiles")
    p.add_argument("--stride", type=parse_hw, help="tile stride (default: the tile size)")
    p.add_argument("--edge", choices=("drop", "pad"), default="drop", help="partial tiles at the edges")
    p.add_argument("--layout", choices=("chw", "hwc"), default="chw")
    p.add_argument("--dtype", choices=sorted(NUMPY_DTYPES), help="cast images (refusing lossy integer casts)")
    p.add_argument("--npy-layout", choices=("hwc", "chw"), default="hwc", help="how 3-D .npy arrays are laid out")
    p.add_argument("--val-fraction", type=float, help="write train/ and val/, split by source image")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    p.add_argument("--samples-per-shard", type=int)
    p.add_argument("--shard-size", type=parse_size,
                   help="target shard size, e.g. 512MB (default 256MB); two shards are held in memory")
    p.add_argument("--codec", choices=list(CODECS), default="raw")
    p.add_argument("--level", type=int, default=DEFAULT_ZSTD_LEVEL, help="zstd level")
    p.add_argument("--workers", type=int, default=1, help="encoding processes; output is identical for any value")
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable images, listing them in the manifest")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    mode.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _prepare_output(out: Path, overwrite: bool, resume: bool) -> None:
    if not out.exists() or not any(out.iterdir()):
        return
    ours = [out / MANIFEST_NAME, out / PROGRESS_NAME, *(out / s / n for s in ("train", "val")
                                                         for n in (MANIFEST_NAME, PROGRESS_NAME))]
    looks_ours = any(p.exists() for p in ours) or all(p.name.startswith(("shard-", ".shard-")) for p in out.iterdir())
    if resume:
        if not looks_ours:
            raise UsageError(f"{out}: nothing to resume here (no {PROGRESS_NAME} or {MANIFEST_NAME})")
        return
    if not overwrite:
        raise UsageError(f"{out}: exists and is not empty; pass --overwrite to replace it or --resume to "
                         "continue an interrupted run")
    if not looks_ours:
        raise UsageError(f"{out}: not a fastload output directory; refusing to delete it with --overwrite")
    shutil.rmtree(out)


def _probe_all(data_dir: Path, sources: list[Source], npy_layout: str, workers: int,
               skip_bad: bool) -> tuple[list[Source], list[ImageInfo], list[dict]]:
    good, infos, bad = [], [], []
    args = ((data_dir / s.relpath, npy_layout) for s in sources)
    for src, (info, err) in zip(sources, ordered_map(probe_image, args, workers)):
        if err is None:
            assert info is not None
            good.append(src)
            infos.append(info)
        elif isinstance(err, ImageReadError):
            bad.append({"path": src.relpath, "error": err.reason})
        else:
            raise err
    if bad and not skip_bad:
        lines = "\n  ".join(f"{data_dir / b['path']}: {b['error']}" for b in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise PreprocessError(f"{len(bad)} unreadable image(s) (pass --skip-bad to skip them):\n  {lines}{more}")
    for b in bad:
        print(f"skipping {b['path']}: {b['error']}", file=sys.stderr)
    return good, infos, bad


def _check_consistent(sources: list[Source], infos: list[ImageInfo], tiling: bool, cast: str | None) -> ImageInfo:
    ref = infos[0]
    checks = [("channels", lambda i: i.channels)]
    if cast is None:
        checks.append(("dtype", lambda i: i.dtype))
    if not tiling:
        checks.append(("shape", lambda i: (i.height, i.width)))
    for what, key in checks:
        odd = [f"{s.relpath} ({key(i)})" for s, i in zip(sources, infos) if key(i) != key(ref)]
        if odd:
            listed = "\n  ".join(odd[:20]) + (f"\n  ... and {len(odd) - 20} more" if len(odd) > 20 else "")
            hint = " (use --tile-size to cut images of any size into tiles)" if what == "shape" else ""
            raise PreprocessError(f"images differ in {what}: {sources[0].relpath} has {key(ref)}, these differ{hint}:"
                                  f"\n  {listed}")
    return ref


def run(args: argparse.Namespace) -> list[WriteResult]:
    """Run preprocess_tiles for parsed arguments; return one result per written dataset."""
    data_dir: Path = args.data_dir.resolve() if args.data_dir.exists() else args.data_dir
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, not {args.workers}")
    if args.samples_per_shard is not None and args.samples_per_shard < 1:
        raise UsageError(f"--samples-per-shard must be at least 1, not {args.samples_per_shard}")
    if args.stride and not args.tile_size:
        raise UsageError("--stride needs --tile-size")
    relpaths, others = find_images(data_dir)
    if not relpaths:
        raise SourceError(f"{data_dir}: no images found (.png, .jpg, .jpeg, .tif, .tiff, .npy)")
    if others:
        print(f"ignoring {len(others)} file(s) that are not images: {', '.join(others[:5])}"
              + (" ..." if len(others) > 5 else ""), file=sys.stderr)
    classes = None
    if args.labels_from_dirs:
        sources, classes = labels_from_dirs(relpaths)
    elif args.labels:
        sources, classes = labels_from_csv(args.labels, data_dir, relpaths)
    else:
        sources = [Source(p) for p in relpaths]
    _prepare_output(args.output_dir, args.overwrite, args.resume)

    if args.val_fraction is not None:
        splits = dict(zip(("train", "val"), split_by_source(sources, args.val_fraction, args.seed)))
    else:
        splits = {"": sources}
    good, infos, probe_bad = _probe_all(data_dir, sources, args.npy_layout, args.workers, args.skip_bad)
    if not good:
        raise PreprocessError(f"{data_dir}: every image was unreadable")
    ref = _check_consistent(good, infos, args.tile_size is not None, args.dtype)
    tiles = TileSpec(args.tile_size, args.stride or args.tile_size, args.edge)
    height, width = args.tile_size or (ref.height, ref.width)
    shape = (ref.channels, height, width) if args.layout == "chw" else (height, width, ref.channels)
    image_dtype = args.dtype or dtype_name(np.dtype(ref.dtype))
    options = {"level": args.level} if args.codec != "raw" else {}
    fields = [Field("image", image_dtype, shape, args.codec, options)]
    if args.labels or args.labels_from_dirs:
        fields.append(Field("label", "int64", ()))
    settings = EncodeSettings(str(data_dir), tuple(fields), tiles, args.layout, args.npy_layout)
    info_of = {s.relpath: i for s, i in zip(good, infos)}

    limits = ShardLimits(args.samples_per_shard, args.shard_size)
    if limits.samples is None and limits.bytes is None:
        limits.bytes = DEFAULT_SHARD_BYTES
    option_doc = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                  if k in _OPTIONS_IN_PROVENANCE}
    option_doc["labels"] = str(args.labels) if args.labels else None
    extra: dict[str, Any] = {"classes": classes} if classes is not None else {}
    results = []
    for split, split_sources in splits.items():
        out = args.output_dir / split if split else args.output_dir
        if args.resume and (out / MANIFEST_NAME).exists():
            print(f"{out}: already complete")
            continue
        provenance = {"tool": f"fastload preprocess_tiles {__version__}", "options": option_doc,
                      "source_root": str(data_dir), "split": split or None,
                      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        usable = [s for s in split_sources if s.relpath in info_of]
        in_split = {s.relpath for s in split_sources}
        counts = [len(tiles.grid(info_of[s.relpath].height, info_of[s.relpath].width)) for s in usable]
        bad = [b for b in probe_bad if b["path"] in in_split]
        job = WriteJob(out, settings, usable, counts, bad, limits, provenance, extra)
        results.append(write_dataset(job, args.workers, args.skip_bad, args.resume, not args.no_progress))
    return results


def _summary(results: list[WriteResult], elapsed: float) -> str:
    samples = sum(r.manifest.total for r in results)
    shards = sum(len(r.manifest.shards) for r in results)
    out_bytes = sum(s.bytes for r in results for s in r.manifest.shards)
    decoded = sum(r.decoded_bytes for r in results)
    source = sum(r.source_bytes for r in results)
    ratio = decoded / out_bytes if out_bytes else 0.0
    return (f"done: {samples} samples in {shards} shards; source files {source / 1e6:.1f} MB, "
            f"decoded {decoded / 1e6:.1f} MB, shards {out_bytes / 1e6:.1f} MB (ratio {ratio:.2f}x); "
            f"{elapsed:.2f} s, {decoded / 1e6 / max(elapsed, 1e-9):.1f} MB/s decoded, "
            f"{source / 1e6 / max(elapsed, 1e-9):.1f} MB/s of source files")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``preprocess_tiles`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    try:
        results = run(args)
    except UsageError as err:
        print(f"preprocess_tiles: error: {err}", file=sys.stderr)
        return 2
    except (SourceError, PreprocessError, DatasetError) as err:
        print(f"preprocess_tiles: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("preprocess_tiles: interrupted; completed shards are kept, continue with --resume", file=sys.stderr)
        return 130
    if results:
        print(_summary(results, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
