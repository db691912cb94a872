"""Parsing and checking ``preprocess_tiles`` options before any image is read.

Every option that would be ignored or misread is an error here, so a run
never starts (and never exits 0) on a misunderstanding: a bare ``--shard-size
512`` (bytes? megabytes?), a ``--level`` the codec does not have, ``--stride``
without ``--tile-size``.
"""

from __future__ import annotations

import argparse

ZSTD_LEVELS = (1, 22)  # zstd's range; negative "fast" levels are not exposed
LEVELS = {"lz4": (0, 12), "lz4-shuffle": (0, 12), "png": (0, 9)}  # lz4: 0 fast, 1-12 LZ4HC; png: zlib's
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default said once: ``(default: X)`` added only where the help says none.

    argparse's ArgumentDefaultsHelpFormatter appends ``(default: %(default)s)`` to every option,
    which printed ``(default: drop) (default: None)`` where the help already named the effective
    default of an option whose parsed default is None (it depends on other options). Nothing is
    added for a default of None, False or an empty list either: they say nothing to the reader.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


class UsageError(Exception):
    """The command line asks for something impossible; exit status 2."""


def parse_size(text: str) -> int:
    """Parse a byte size with its unit, such as ``512MB``, ``1.5GiB`` or ``4096B``.

    A bare number is refused: ``--shard-size 512`` meaning 512 bytes wrote
    hundreds of one-sample shards without a word.
    """
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGTIB")
    unit = stripped[len(number):]
    if not unit:
        raise argparse.ArgumentTypeError(f"{text!r} has no unit; write e.g. {text.strip()}MB, {text.strip()}KiB "
                                         f"or {text.strip()}B")
    try:
        value = float(number) * _UNITS[unit]
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


def check_options(args: argparse.Namespace) -> None:
    """Raise UsageError for an out-of-range value or a combination that would be silently ignored."""
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, not {args.workers}")
    if getattr(args, "scheduler", None) and args.workers != 1:
        raise UsageError(f"--workers {args.workers} with --scheduler: the Dask cluster's workers encode; drop "
                         "--workers (it counts local processes)")
    timeout = getattr(args, "scheduler_timeout", None)
    if timeout is not None and not timeout > 0:
        raise UsageError(f"--scheduler-timeout must be positive, not {timeout}")
    if args.samples_per_shard is not None and args.samples_per_shard < 1:
        raise UsageError(f"--samples-per-shard must be at least 1, not {args.samples_per_shard}")
    if args.level is not None:
        if args.codec in ("raw", "jpeg"):
            raise UsageError(f"--level {args.level} has no effect with --codec {args.codec}; pass --codec zstd, "
                             "zstd-shuffle, lz4, lz4-shuffle or png, or drop --level")
        lo, hi = LEVELS.get(args.codec, ZSTD_LEVELS)
        if not lo <= args.level <= hi:
            raise UsageError(f"--level {args.level} is out of range for --codec {args.codec}: use {lo} to {hi}")
    if (args.quality is not None or args.subsampling is not None) and args.codec != "jpeg":
        raise UsageError("--quality and --subsampling are jpeg's; pass --codec jpeg or drop them")
    if args.quality is not None and not 1 <= args.quality <= 100:
        raise UsageError(f"--quality must be 1 to 100, not {args.quality}")
    if args.val_fraction is not None and not 0.0 < args.val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be between 0 and 1 (exclusive), not {args.val_fraction}")
    needs = [("stride", "--stride", "tile_size", "--tile-size"),
             ("edge", "--edge", "tile_size", "--tile-size"),
             ("stratify", "--stratify/--no-stratify", "val_fraction", "--val-fraction"),
             ("label_column", "--label-column", "labels", "--labels"),
             ("path_column", "--path-column", "labels", "--labels"),
             ("h5_labels", "--h5-labels", "h5_dataset", "--h5-dataset"),
             ("scheduler_timeout", "--scheduler-timeout", "scheduler", "--scheduler")]
    for option, flag, required, required_flag in needs:
        if getattr(args, option, None) is not None and getattr(args, required, None) is None:
            raise UsageError(f"{flag} needs {required_flag}")
    if args.seed is not None and args.val_fraction is None and getattr(args, "order", "shuffled") != "shuffled":
        raise UsageError("--seed needs --val-fraction or --order shuffled (it seeds the split and the shuffled order)")
    if args.seed is not None and not -(2**63) <= args.seed < 2**64:
        raise UsageError(f"--seed must be in [-2**63, 2**64), not {args.seed}")
    if args.stratify and not (args.labels or args.labels_from_dirs):
        raise UsageError("--stratify needs one label per source file (--labels or --labels-from-dirs)")
    if getattr(args, "h5_dataset", None) and args.tile_size:
        raise UsageError("--h5-dataset reads samples that are already cut; it cannot be combined with --tile-size "
                         "(drop --h5-dataset to tile HDF5 rasters)")
    if getattr(args, "h5_dataset", None) and (args.layout or args.mode != "keep"):
        raise UsageError("--h5-dataset stores samples as they are in the HDF5 file; --layout and --mode do not "
                         "apply")
    if getattr(args, "h5_labels", None) and (args.labels or args.labels_from_dirs):
        raise UsageError("--h5-labels cannot be combined with --labels or --labels-from-dirs")
