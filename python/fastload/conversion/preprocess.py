r"""``preprocess_tiles``: turn a folder of images or rasters into LMDB shard datasets.

Example::

    preprocess_tiles --data-dir scenes/ --output-dir shards/ --tile-size 256 --stride 256 \
        --codec zstd --val-fraction 0.1 --seed 0 --workers 4
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .._progress import lines_to_stderr
from ..errors import ArgumentError, ClusterError, DatasetError, _unwinding_ctrl_c
from ..format._codecs import (
    CODECS,
    IMAGE_CODECS,
    JPEG_DEFAULT_SUBSAMPLING,
    JPEG_QUALITY,
    JPEG_SUBSAMPLING,
    default_options,
)
from ..format._dtypes import NUMPY_DTYPES, dtype_name
from ..format._manifest import MANIFEST_NAME, load_manifest
from ..format._record import Field
from ..format._splits import SPLIT_FOLDERS, SPLITS_NAME, write_splits
from ..storage import RemoteFolder, is_remote, redact
from ._auto import PREFERENCES, Choice, choose_codec, sample_indices
from ._cli_options import HelpFormatter, UsageError, check_options, parse_hw, parse_size
from ._dask_map import CONNECT_TIMEOUT_S, check_client, connect, describe
from ._dataset_writer import PreprocessError, ShardLimits, WriteJob, WriteResult, write_dataset
from ._dense_run import (
    check_dense_options,
    dense_spec,
    kept_tile_counts,
    outside_partners,
    pair_sources,
    scenes_doc,
)
from ._encode import EncodeSettings, TileSpec, source_samples
from ._hdf5 import StackInfo, StackSettings
from ._images import PILLOW_MODES, ImageInfo, ImageReadError
from ._journal import PROGRESS_NAME, drop_finished_journal
from ._label_csv import labels_from_csv
from ._output_dir import foreign_entry, leftovers_only, records_a_run
from ._partner_plan import (
    check_ignore_index,
    check_partners_consistent,
    dense_fields,
    parse_field_codecs,
    probe_partners,
)
from ._partners import Partner, partners_of
from ._preprocess_h5 import probe_stacks, stack_fields, stack_job, stack_plan
from ._preprocess_plan import (
    SplitPlan,
    check_consistent,
    check_not_empty,
    class_counts,
    plan_split,
    probe_all,
    warn_lopsided_classes,
    warn_no_tiles,
)
from ._remote_output import (
    begin_staged_run,
    check_complete_at,
    check_resume_options_at,
    direct_target,
    publish_output,
    stage_output,
)
from ._run_record import check_resume_options
from ._sources import (
    Source,
    SourceError,
    classes_without_val,
    find_images,
    labels_from_dirs,
    sort_images,
    split_by_source,
)
from ._write_order import DEFAULT_ORDER, GROUP_BYTES, ORDERS

__all__ = ["UsageError", "build_parser", "main", "parse_hw", "parse_size", "run"]

DEFAULT_SHARD_BYTES = 256 * 10**6
AUTO_SOURCES = 16  # --codec auto samples tiles of this many source images
_DENSE_OPTIONS = ("inputs", "targets", "pairs", "field_codec", "num_classes", "ignore_index", "min_labelled")
_OPTIONS_IN_PROVENANCE = ("labels", "labels_from_dirs", "label_column", "path_column", "tile_size", "stride", "edge",
                          "layout", "dtype", "npy_layout", "mode", "val_fraction", "seed", "stratify", "order",
                          "samples_per_shard", "shard_size", "codec", "level",
                          "quality", "subsampling", "prefer", "lossy_ok", "skip_bad", "h5_dataset", "h5_labels")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``preprocess_tiles``."""
    p = argparse.ArgumentParser(prog="preprocess_tiles", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--data-dir", "--data_dir", dest="data_dir", required=True, type=_location,
                   help="folder of .png/.jpg/.tif/.npy files, searched recursively; or a URL of object storage "
                        "(s3://, gs://, az://, https://; needs fastload[remote], credentials from the environment), "
                        "each file read through a local copy")
    p.add_argument("--output-dir", "--output_dir", dest="output_dir", required=True, type=_location,
                   help="a directory, or a URL of object storage (s3://, gs://, az://; needs fastload[remote], "
                        "credentials from the environment): written in a staging directory, then published")
    labels = p.add_mutually_exclusive_group()
    labels.add_argument("--labels", type=_location, help="CSV of 'relative path,label' rows (a header row is "
                        "detected); a file, or a URL of object storage (read as --data-dir's files are)")
    labels.add_argument("--labels-from-dirs", action="store_true", help="one sub-folder per class")
    p.add_argument("--label-column", help="name of the label column in the --labels CSV's header")
    p.add_argument("--path-column", help="name of the path column in the --labels CSV's header")
    p.add_argument("--tile-size", type=parse_hw, help="cut images into HxW tiles")
    p.add_argument("--stride", type=parse_hw, help="tile stride (default: the tile size)")
    p.add_argument("--edge", choices=("drop", "pad"), help="partial tiles at the edges (default: drop)")
    p.add_argument("--layout", choices=("chw", "hwc"), help="layout of image samples (default: chw)")
    p.add_argument("--dtype", choices=sorted(NUMPY_DTYPES), help="cast images (refusing casts that change values)")
    p.add_argument("--npy-layout", choices=("auto", "hwc", "chw"), default="auto",
                   help="how 3-D .npy/.h5 arrays are laid out; auto: a small leading axis is bands-first")
    p.add_argument("--mode", choices=PILLOW_MODES, default="keep", help="convert PNG/JPEG images to this Pillow mode")
    p.add_argument("--h5-dataset", help="in .h5/.hdf5 files, the dataset of stacked samples, shape (N, ...)")
    p.add_argument("--h5-labels", help="in .h5/.hdf5 files, the dataset of labels, shape (N,)")
    dense = p.add_argument_group("scenes with targets and co-registered inputs (docs/dense.md)")
    dense.add_argument("--targets", nargs="+", action="extend", default=[], metavar="NAME=DIR",
                       help="masks or per-pixel targets, one file per scene, paired with each image by its path "
                            "relative to DIR (same sub-folder and stem); each becomes a field NAME cut on the "
                            "image's grid (one band: a 2-D field); lossless (zstd unless --field-codec)")
    dense.add_argument("--inputs", nargs="+", action="extend", default=[], metavar="NAME=DIR",
                       help="extra co-registered inputs (other sensors, a DEM), paired as --targets; each a field "
                            "NAME of its own bands and dtype, beside image; --codec (zstd when auto) unless "
                            "--field-codec")
    dense.add_argument("--pairs", type=_location, metavar="CSV",
                       help="pair by this CSV instead of by stem: a header 'image,NAME,...' and one row per scene, "
                            "paths relative to each folder")
    dense.add_argument("--field-codec", nargs="+", action="extend", default=[], metavar="NAME=CODEC",
                       help="the codec of an --inputs or --targets field (jpeg refused for targets)")
    dense.add_argument("--num-classes", nargs="+", action="extend", default=[], metavar="K|NAME=K",
                       help="record per tile the pixels of each class 0..K-1 of the one-band integer targets (or "
                            "of target NAME) in a field NAME_class_pixels (int32[K]), for "
                            "fastload.weights.from_mask_classes; another value is an error")
    dense.add_argument("--ignore-index", type=float, metavar="VALUE",
                       help="the target value that is no label: not counted, and the padding of targets "
                            "(needed with --edge pad)")
    dense.add_argument("--min-labelled", type=float, metavar="FRACTION",
                       help="drop tiles whose labelled pixels (inside the scene, not --ignore-index) of the first "
                            "counted target (else the first target) are fewer than FRACTION of the tile")
    p.add_argument("--val-fraction", type=float, help="write train/ and val/, split by source image")
    p.add_argument("--seed", type=int, help="seed of the train/val split and of the shuffled order (default: 0)")
    p.add_argument("--stratify", action=argparse.BooleanOptionalAction, default=None,
                   help="split by source image within each class (default: on when there are labels)")
    p.add_argument("--order", choices=ORDERS, default=DEFAULT_ORDER,
                   help="shuffled: write the samples (tiles) in a seeded random order across the shards, so every "
                        "shard mixes classes and sources (the train/val split is by source first); source: one "
                        "source after another, as found (sorted paths: one class after another with "
                        "--labels-from-dirs)")
    p.add_argument("--samples-per-shard", type=int, metavar="N",
                   help="close a shard after N samples (with --shard-size: at whichever limit comes first; "
                        "alone: the only limit). A fixed count lets the shards be planned before encoding, so that "
                        "the Dask workers (or 4 or more --workers) write them instead of this process "
                        "(docs/dask.md, \"Who writes the shards\")")
    p.add_argument("--shard-size", type=parse_size,
                   help="target shard size, e.g. 512MB (default: 256MB, none with --samples-per-shard alone); two "
                        "shards are held in memory")
    p.add_argument("--codec", choices=[*CODECS, "auto"], default="raw",
                   help="auto: try the codecs that fit on a sample of the tiles and pick by --prefer")
    p.add_argument("--prefer", choices=PREFERENCES, default="balanced",
                   help="--codec auto's rule: smallest output (size), smallest among codecs decoding at least 5%% "
                        "(balanced) or 50%% (speed) of raw's speed")
    p.add_argument("--lossy-ok", action="store_true", help="--codec auto may pick jpeg")
    p.add_argument("--level", type=int, help="compression level: zstd 1-22, lz4 0-12 (0: fast, 1-12: LZ4HC), png "
                   "zlib 0-9 (default: zstd 3, lz4 0, png 6)")
    p.add_argument("--quality", type=int, help=f"jpeg quality, 1-100 (default: {JPEG_QUALITY})")
    p.add_argument("--subsampling", choices=JPEG_SUBSAMPLING,
                   help=f"jpeg chroma subsampling of 3-channel images (default: {JPEG_DEFAULT_SUBSAMPLING})")
    p.add_argument("--workers", type=int, default=1, help="encoding processes; output is identical for any value")
    p.add_argument("--scheduler", metavar="ADDRESS_OR_FILE",
                   help="encode on this Dask cluster instead of local processes: a scheduler address "
                        "(tcp://host:8786) or scheduler file (JSON); needs the extra fastload[dask]; identical output")
    p.add_argument("--scheduler-timeout", type=float, metavar="SECONDS",
                   help=f"how long to wait for the --scheduler to answer (default: {CONNECT_TIMEOUT_S:g})")
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable images, listing them in the manifest")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    mode.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true",
                   help="report no progress: no bar on a terminal, no progress lines on stderr without one "
                        "(docs/conversion.md, \"Progress\")")
    p.add_argument("--absolute-source-root", action="store_true",
                   help="record the absolute path of --data-dir in the manifests (default: relative to the dataset)")
    return p


def _prepare_output(out: Path, overwrite: bool, resume: bool, argv: list[str] | None = None) -> None:
    if not out.exists() or not any(out.iterdir()):
        return
    recorded = records_a_run(out)
    foreign = foreign_entry(out)
    if resume:
        if not recorded and leftovers_only(out):  # interrupted before its first shard: nothing to keep
            print(f"{out}: nothing completed yet: starting the run")
        elif not recorded and foreign is not None:
            raise UsageError(f"{out}: not a fastload output (no {PROGRESS_NAME} or {MANIFEST_NAME}, and "
                             f"{foreign.relative_to(out)}, which no run writes); pass another --output-dir: "
                             f"{_rerun(argv, '--resume', other_output=True)}")
        return
    if not overwrite:
        if not recorded and leftovers_only(out):
            raise UsageError(f"{out}: holds a run interrupted before its first shard (no completed shard); "
                             f"start it with: {_rerun(argv, '--resume')}")
        raise UsageError(f"{out}: exists and is not empty; replace it with: {_rerun(argv, '--overwrite')}\n"
                         f"or continue an interrupted run with: {_rerun(argv, '--resume')}")
    if foreign is not None:
        raise UsageError(f"{out}: not a fastload output directory ({foreign.relative_to(out)} is not a file a run "
                         f"writes); refusing to delete it with --overwrite; pass another --output-dir: "
                         f"{_rerun(argv, '--overwrite', other_output=True)}")
    shutil.rmtree(out)


def _rerun(argv: list[str] | None, flag: str, other_output: bool = False) -> str:
    """Return the command line of this run with ``flag`` (and without --resume/--overwrite)."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept = [a for a in args if a not in ("--resume", "--overwrite")]
    if other_output and "--output-dir" in kept and kept.index("--output-dir") + 1 < len(kept):
        kept[kept.index("--output-dir") + 1] = "NEW_DIR"
    return shlex.join(["preprocess_tiles", *kept, *([] if other_output and flag == "--resume" else [flag])])


def _sources_and_classes(args: argparse.Namespace, data_dir: Path | str,
                         remote: RemoteFolder | None) -> tuple[list[Source], list[str] | None]:
    if remote is None:
        assert isinstance(data_dir, Path)
        relpaths, others = find_images(data_dir)
        is_file = None
    else:
        listing = remote.list()
        relpaths, others = sort_images(listing)
        is_file = listing.__contains__
    if not relpaths:
        raise SourceError(f"{data_dir}: no images found (.png, .jpg, .jpeg, .tif, .tiff, .npy, .h5, .hdf5)")
    if others:
        print(f"ignoring {len(others)} file(s) that are not images: {', '.join(others[:5])}"
              + (" ..." if len(others) > 5 else ""), file=sys.stderr)
    relpaths = outside_partners(relpaths, data_dir, getattr(args, "partners", ()))
    if args.labels_from_dirs:
        return labels_from_dirs(relpaths)
    if args.labels:
        return labels_from_csv(args.labels, data_dir, relpaths, args.path_column, args.label_column, is_file,
                               remote.options if remote is not None else getattr(args, "storage_options", None))
    return [Source(p) for p in relpaths], None


def _option_doc(args: argparse.Namespace) -> dict[str, Any]:
    doc = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k in _OPTIONS_IN_PROVENANCE}
    doc["labels"] = (redact(args.labels) if is_remote(args.labels) else str(args.labels)) if args.labels else None
    for name in _DENSE_OPTIONS:  # recorded when given: a run without them records what it always did
        value = getattr(args, name, None)
        if value in (None, []):
            continue
        if name in ("inputs", "targets"):  # the fields, not where their folders are (provenance.partner_roots):
            value = [text.partition("=")[0] for text in value]  # the options make the dataset id, as --data-dir
        elif name == "pairs":  # the pairing enters the id through the partner files, not the CSV's location
            value = True
        doc[name] = value
    # Effective values, so that spelling out a default does not count as a change on --resume.
    labelled = bool(args.labels or args.labels_from_dirs)
    if not args.h5_dataset:
        doc["layout"] = args.layout or "chw"
    if args.tile_size:
        doc["edge"] = args.edge or "drop"
    if args.val_fraction is not None or args.order == "shuffled":
        doc["seed"] = 0 if args.seed is None else args.seed
    if args.order == "shuffled":
        doc["order_group_bytes"] = GROUP_BYTES  # fixes the groups (_write_groups): a resume reproduces them
    else:  # recorded as runs before --order were: an interrupted one of those resumes with --order source
        doc.pop("order", None)
    if args.val_fraction is not None:
        doc["stratify"] = labelled if args.stratify is None else args.stratify
    if args.codec != "raw":  # the encoder settings of the codec (docs/FORMAT.md)
        options = default_options(args.codec, args.level, None, args.quality, args.subsampling)
        doc.update({k: options[k] for k in ("level", "quality", "subsampling") if k in options})
    return doc


def _location(text: str) -> Path | str:
    """Return --data-dir or --output-dir as a Path, or as the URL it is (a Path would fold its ``//``)."""
    return text if is_remote(text) else Path(text)


def _input_folder(args: argparse.Namespace) -> RemoteFolder | None:
    """Return the folder in object storage --data-dir names (its URL checked, nothing requested), or None.

    Python callers may set ``args.storage_options`` (as ``ShardLoader`` takes them); the command line
    takes credentials and endpoints from the environment only.
    """
    if isinstance(args.data_dir, str) and not is_remote(args.data_dir):
        args.data_dir = Path(args.data_dir)  # a Python caller's path given as a string
    if not isinstance(args.data_dir, str):
        return None
    if args.h5_dataset:
        raise UsageError("--h5-dataset reads HDF5 stacks in place, which object storage does not allow; copy the "
                         "files to a local or shared folder and pass that as --data-dir")
    folder = RemoteFolder(args.data_dir, getattr(args, "storage_options", None))
    try:
        folder.root  # noqa: B018 (opens the store: checks the URL and the options, requests nothing)
    except ArgumentError as err:
        raise UsageError(f"--data-dir {err}") from None
    folder.scratch = tempfile.mkdtemp(prefix="fastload-sources-")  # deleted by run() at the end
    return folder


def run(args: argparse.Namespace, client: Any = None) -> list[WriteResult]:
    """Run preprocess_tiles for parsed arguments; return one result per written dataset.

    Every option is checked before any image is read; every image is probed
    before anything is written; a plan with an empty output or split is refused.
    The probes and encode tasks run on a Dask cluster with ``client`` (a
    ``distributed.Client``) or ``args.scheduler`` (connected here, closed at the
    end), otherwise in ``args.workers`` local processes; the output is the same.
    Raises ClusterError when Dask's ``distributed`` is missing or the scheduler
    does not answer.
    """
    if isinstance(args.output_dir, str):  # a URL: written in a staging directory, then published
        return _run_to_url(args, client, args.output_dir)
    check_options(args)
    check_dense_options(args)
    remote = _input_folder(args)
    args.partners = partners_of(getattr(args, "inputs", []), getattr(args, "targets", []),
                                getattr(args, "storage_options", None))
    for partner in args.partners:
        if partner.remote is not None:  # its copies (and the spool of its probes) go there; deleted at the end
            partner.remote.scratch = tempfile.mkdtemp(prefix="fastload-sources-")
    try:
        data_dir: Path | str = args.data_dir
        if remote is None and args.data_dir.exists():
            data_dir = args.data_dir.resolve()
        option_doc = _option_doc(args)
        if args.resume:
            check_resume_options(args.output_dir, option_doc)
        sources, classes = _sources_and_classes(args, data_dir, remote)
        sources, args.pair_missing = pair_sources(args, sources)
        return _run_with_client(args, client, data_dir, option_doc, sources, classes, remote)
    finally:
        for folder in [remote, *(p.remote for p in args.partners)]:
            if folder is not None and folder.scratch is not None:
                shutil.rmtree(folder.scratch, ignore_errors=True)


def _run_with_client(args: argparse.Namespace, client: Any, data_dir: Path | str, option_doc: dict[str, Any],
                     sources: list[Source], classes: list[str] | None,
                     remote: RemoteFolder | None) -> list[WriteResult]:
    """Run with ``client``, or with the Dask client of ``args.scheduler`` (connected here, closed at the end)."""
    own_client = None
    if client is None and getattr(args, "scheduler", None):
        timeout = args.scheduler_timeout if args.scheduler_timeout is not None else CONNECT_TIMEOUT_S
        client = own_client = connect(args.scheduler, timeout)
    try:
        if client is not None:
            check_client(client)
            print(describe(client))
        return _run(args, client, data_dir, option_doc, sources, classes, remote)
    finally:
        if own_client is not None:
            own_client.close()


def _run_to_url(args: argparse.Namespace, client: Any, url: str) -> list[WriteResult]:
    """Run into the staging directory of ``url`` and publish it there (``conversion/_remote_output.py``).

    The manifests record --data-dir as an absolute path: relative to a staging directory it would
    mean nothing at the URL.
    """
    try:
        staging, storage = stage_output(url, getattr(args, "storage_options", None), None, args.overwrite,
                                        args.resume)
    except FileExistsError as err:
        raise UsageError(str(err)) from None
    if staging is None:  # --resume, and the URL holds the finished dataset: with the options it records?
        check_options(args)
        check_dense_options(args)
        check_resume_options_at(url, storage, _option_doc(args))
        check_complete_at(url, storage)
        print(f"{redact(url)}: complete already; nothing to do")
        return []
    overwrite, saved = args.overwrite, args.absolute_source_root
    args.output_dir, args.overwrite, args.absolute_source_root, args.publish_to = staging, False, True, (url, storage)
    args.begin_staged = functools.partial(begin_staged_run, staging, overwrite)  # by _run, once options are checked
    try:
        results = run(args, client)
    finally:
        args.output_dir, args.overwrite, args.absolute_source_root, args.publish_to = url, overwrite, saved, None
        args.begin_staged = None
    publish_output(staging, url, storage, progress=not args.no_progress, summary=True)
    return results


def _run(args: argparse.Namespace, client: Any, data_dir: Path | str, option_doc: dict[str, Any],
         sources: list[Source], classes: list[str] | None, remote: RemoteFolder | None) -> list[WriteResult]:
    begin = getattr(args, "begin_staged", None)
    if begin is not None:
        begin()
    _prepare_output(args.output_dir, args.overwrite, args.resume, getattr(args, "argv", None))

    labelled = bool(args.labels or args.labels_from_dirs or args.h5_labels)
    scenes: dict[str, list[dict[str, Any]]] = {}
    stacks: dict[str, StackInfo] | None = None
    choice: Choice | None = None
    if args.h5_dataset:
        if args.codec == "auto":
            raise UsageError("--codec auto works on images; name a codec with --h5-dataset")
        assert isinstance(data_dir, Path)  # refused in object storage (_input_folder)
        stacks, probe_bad = probe_stacks(data_dir, sources, args.h5_dataset, args.h5_labels, args.workers,
                                         args.skip_bad, client)
        options = default_options(args.codec, args.level, None, args.quality, args.subsampling)
        try:
            fields = stack_fields(next(iter(stacks.values())), args.dtype, args.codec, options, labelled)
        except ValueError as err:  # the codec cannot hold the stack's samples (SchemaMismatchError)
            raise UsageError(f"--codec {args.codec}: {err}") from None
        settings: Any = StackSettings(str(data_dir), fields, args.h5_dataset, args.h5_labels)
        tiles = TileSpec()
        parts = _split(args, sources, option_doc, classes)
        plans = [stack_plan(name, part, stacks) for name, part in parts]
    else:
        good, infos, probe_bad = probe_all(data_dir, sources, args.npy_layout, args.mode, args.workers,
                                           args.skip_bad, client, remote, progress=not args.no_progress)
        if not good:
            raise PreprocessError(f"{data_dir}: every image was unreadable")
        info_of = {s.relpath: i for s, i in zip(good, infos)}
        partners = args.partners
        partner_infos: list[ImageInfo] = []
        if partners:
            good = [s for s in good if s.partners]  # the others lack a partner file (skipped: --skip-bad)
            good, pair_infos, pair_bad = probe_partners(partners, good, info_of, args.npy_layout, args.workers,
                                                        args.skip_bad, client, progress=not args.no_progress)
            probe_bad += args.pair_missing + pair_bad
            if not good:
                raise PreprocessError(f"{data_dir}: no scene has all its partner rasters readable and of its size")
            infos = [info_of[s.relpath] for s in good]
            partner_infos = check_partners_consistent(partners, good, pair_infos)
            check_ignore_index(args.ignore_index, partners, partner_infos)
        ref = check_consistent(good, infos, args.tile_size is not None, args.dtype)
        tiles = TileSpec(args.tile_size, args.stride or args.tile_size, args.edge or "drop")
        info_of = {s.relpath: i for s, i in zip(good, infos)}
        parts = _split(args, sources, option_doc, classes)
        plans = [plan_split(name, part, info_of, tiles) for name, part in parts]
        height, width = args.tile_size or (ref.height, ref.width)
        layout = args.layout or "chw"
        shape = (ref.channels, height, width) if layout == "chw" else (height, width, ref.channels)
        image_dtype = args.dtype or dtype_name(np.dtype(ref.dtype))
        if args.codec == "auto":
            choice = _choose_codec(args, data_dir, good, Field("image", image_dtype, shape), tiles, layout, remote)
            fields = (choice.field,)
        else:
            options = default_options(args.codec, args.level, layout if args.codec in IMAGE_CODECS else None,
                                      args.quality, args.subsampling)
            try:
                fields = (Field("image", image_dtype, shape, args.codec, options),)
            except ValueError as err:  # the codec cannot hold the images (SchemaMismatchError)
                raise UsageError(f"--codec {args.codec}: {err}") from None
        spec = dense_spec(args, partner_infos)
        fields += dense_fields(partners, partner_infos, layout, args.codec,
                               parse_field_codecs(args.field_codec, partners), spec, (height, width))
        if labelled:
            fields += (Field("label", "int64", ()),)
        settings = EncodeSettings(str(data_dir), fields, tiles, layout, args.npy_layout, args.mode, remote, spec)
        if spec.min_labelled is not None:
            kept = kept_tile_counts(settings, [s for p in plans for s in p.sources], args.workers, client,
                                    progress=not args.no_progress)
            for plan in plans:
                plan.tile_counts = [kept[s.relpath] for s in plan.sources]
        if spec.windows:
            scenes = {plan.name: scenes_doc(plan, info_of, partners) for plan in plans}
    for plan in plans:
        check_not_empty(plan, tiles, data_dir)
    for plan in plans:
        warn_no_tiles(plan, tiles)
    if len(plans) > 1 and labelled and not args.h5_labels:
        no_val = {_class_name(label, classes) for label in classes_without_val(sources, parts[1][1])}
        warn_lopsided_classes(plans, classes, expected={"val": no_val} if option_doc.get("stratify") else None)

    limits = ShardLimits(args.samples_per_shard, args.shard_size)
    if limits.samples is None and limits.bytes is None:
        limits.bytes = DEFAULT_SHARD_BYTES
    results = []
    for plan in plans:
        out = args.output_dir / plan.name if plan.name else args.output_dir
        if args.resume and (out / MANIFEST_NAME).exists():
            load_manifest(out)  # a damaged one is named (DatasetError), and the journal kept
            drop_finished_journal(out)
            print(f"{out}: already complete")
            continue
        provenance = _provenance(option_doc, data_dir, plan.name, out, args.absolute_source_root, args.partners)
        if choice is not None:
            provenance["codec_choice"] = {"image": choice.to_json()}
        bad = [b for b in probe_bad if b["path"] in plan.all_paths]
        extra: dict[str, Any] = {"classes": classes} if classes is not None else {}
        if plan.no_tiles:
            extra["no_tiles"] = plan.no_tiles
        if plan.name in scenes:
            extra["scenes"] = scenes[plan.name]
        for role in ("input", "target"):  # the loader resamples targets nearest (transforms), whatever their bands
            names = [p.name for p in args.partners if p.role == role]
            if names:
                extra[f"{role}s"] = names
        publish_to = getattr(args, "publish_to", None)  # (URL, storage options) of an output in object storage
        target = direct_target(publish_to[0], publish_to[1], client, plan.name) if publish_to is not None else None
        job = WriteJob(out, settings, plan.sources, plan.tile_counts, bad, limits, provenance, extra, target=target,
                       order=args.order, seed=option_doc.get("seed") or 0)
        if stacks is not None:
            job = stack_job(job, settings, stacks)
        results.append(write_dataset(job, args.workers, args.skip_bad, args.resume, not args.no_progress, client))
    if len(plans) > 1:
        per_class = labelled and not args.h5_labels
        index = {p.name: {"path": p.name, "samples": p.samples, "sources": len(p.sources),
                          "class_counts": class_counts(p, classes) if per_class else None} for p in plans}
        write_splits(args.output_dir, index, _provenance(option_doc, data_dir, None, args.output_dir,
                                                         args.absolute_source_root))
    _print_plans(plans, classes, labelled and not args.h5_labels)
    return results


def _split(args: argparse.Namespace, sources: list[Source], option_doc: dict[str, Any],
           classes: list[str] | None) -> list[tuple[str, list]]:
    if args.val_fraction is None:
        return [("", sources)]
    train, val = split_by_source(sources, args.val_fraction, option_doc["seed"], option_doc["stratify"])
    missing = classes_without_val(sources, val) if option_doc["stratify"] else {}
    if missing:  # expected with small classes: one line, not a warning per class
        names = ", ".join(f"{_class_name(label, classes)!r} ({n} image{'s' if n > 1 else ''})"
                          for label, n in sorted(missing.items()))
        print(f"stratified split: {len(val)} of {len(sources)} source images to val; {len(missing)} class(es) "
              f"got no val image (too few images for --val-fraction {args.val_fraction}): {names}. A larger "
              "--val-fraction, or --no-stratify (split regardless of class), changes that")
    return [("train", train), ("val", val)]


def _class_name(label: int, classes: list[str] | None) -> str:
    return classes[label] if classes and 0 <= label < len(classes) else str(label)


def _provenance(option_doc: dict[str, Any], data_dir: Path | str, split: str | None, out: Path,
                absolute: bool = False, partners: list[Partner] | None = None) -> dict[str, Any]:
    doc = {"tool": f"fastload preprocess_tiles {__version__}", "options": option_doc,
           "source_root": _source_root(data_dir, out, absolute), "split": split or None,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if partners:  # where the scenes' partner files are (their paths in ``scenes`` are relative to these)
        doc["partner_roots"] = {p.name: _source_root(p.data_dir if p.remote is not None else Path(p.data_dir), out,
                                                     absolute) for p in partners}
    return doc


def _source_root(data_dir: Path | str, out: Path, absolute: bool) -> str:
    """Return --data-dir as the manifest in ``out`` records it.

    Relative to ``out`` (a shared dataset names no user's home), or absolute
    when asked; from another drive (Windows), the folder's name only; a URL as
    it is, without user, password or query.
    """
    if isinstance(data_dir, str):
        return redact(data_dir)
    if absolute:
        return str(data_dir.resolve())
    try:
        return Path(os.path.relpath(data_dir.resolve(), out.resolve())).as_posix()
    except ValueError:
        return data_dir.name


def _print_plans(plans: list[SplitPlan], classes: list[str] | None, labelled: bool) -> None:
    for plan in plans:
        line = f"{plan.name or 'dataset'}: {plan.samples} samples from {len(plan.sources)} source images"
        if labelled:
            counts = class_counts(plan, classes)
            line += "; per class: " + ", ".join(f"{c} {n}" for c, n in counts.items())
        print(line)


def _choose_codec(args: argparse.Namespace, data_dir: Path | str, good: list[Source], raw_field: Field,
                  tiles: TileSpec, layout: str, remote: RemoteFolder | None) -> Choice:
    """Run --codec auto on tiles of up to AUTO_SOURCES images spread over the sorted sources."""
    settings = EncodeSettings(str(data_dir), (raw_field,), tiles, layout, args.npy_layout, args.mode, remote)
    picks = np.unique(np.linspace(0, len(good) - 1, min(len(good), AUTO_SOURCES)).astype(int))
    samples = []
    for i in picks:
        try:
            samples += source_samples(settings, good[i].relpath)
        except ImageReadError as err:
            if not args.skip_bad:
                raise PreprocessError(str(err)) from None
    if not samples:
        raise UsageError("--codec auto: the sampled images give no tiles")
    stack = np.stack(samples)
    stack = stack[sample_indices(len(stack), stack[0].nbytes)]
    choice = choose_codec("image", stack, layout if stack.ndim == 4 else None, args.prefer, args.lossy_ok)
    print(choice.summary())
    return choice

def _summary(results: list[WriteResult], elapsed: float) -> str:
    samples = sum(r.manifest.total for r in results)
    shards = sum(len(r.manifest.shards) for r in results)
    out_bytes = sum(s.bytes for r in results for s in r.manifest.shards)
    decoded = sum(r.decoded_bytes for r in results)
    source = sum(r.source_bytes for r in results)
    ratio = decoded / out_bytes if out_bytes else 0.0
    return (f"done: {samples} samples in {shards} shards; source files {source / 1e6:.1f} MB, "
            f"decoded {decoded / 1e6:.1f} MB, shards {out_bytes / 1e6:.1f} MB (ratio {ratio:.2f}x); "
            f"{elapsed:.2f} s, {samples / max(elapsed, 1e-9):.0f} samples/s, "
            f"{decoded / 1e6 / max(elapsed, 1e-9):.1f} MB/s decoded, "
            f"{source / 1e6 / max(elapsed, 1e-9):.1f} MB/s of source files")


def _output_complete(args: argparse.Namespace) -> bool:
    """Return whether the output is whole: its manifest, or with splits the root's splits.json (written last)."""
    if isinstance(args.output_dir, str):  # a URL: whether its publication ended is not known here
        return False
    if args.val_fraction is not None:
        return (args.output_dir / SPLITS_NAME).exists()
    return (args.output_dir / MANIFEST_NAME).exists()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``preprocess_tiles`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to name the command that works in messages
    start = time.perf_counter()
    try:
        with lines_to_stderr("preprocess_tiles") if not args.no_progress else contextlib.nullcontext():
            results = run(args)
    except UsageError as err:
        print(f"preprocess_tiles: error: {err}", file=sys.stderr)
        return 2
    except (SourceError, PreprocessError, DatasetError, ClusterError) as err:
        if _unwinding_ctrl_c(err):  # a cleanup that the Ctrl-C interrupted failed in turn
            return _interrupted(args)
        print(f"preprocess_tiles: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted(args)
    if results:
        print(_summary(results, time.perf_counter() - start))
    return 0


def _interrupted(args: argparse.Namespace) -> int:
    """Report a Ctrl-C and return the exit status: 130, or 0 when the output was complete before it."""
    if _output_complete(args):  # Ctrl-C after the last manifest was written: the run is done
        for folder in (args.output_dir, *(args.output_dir / split for split in SPLIT_FOLDERS)):
            if (folder / MANIFEST_NAME).exists():
                drop_finished_journal(folder)
        print("preprocess_tiles: done (Ctrl-C arrived after the dataset was complete)", file=sys.stderr)
        return 0
    print(f"preprocess_tiles: interrupted; completed shards are kept, continue with: "
          f"{_rerun(args.argv, '--resume')}", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
