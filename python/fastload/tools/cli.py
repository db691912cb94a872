"""The ``fastload`` command: ``verify DIR``, ``info [DIR]``, ``bench DIR``, ``upgrade DIR``.

DIR may be a URL of object storage (``s3://...``, needs ``fastload[remote]``): ``info`` fetches the
manifests only, ``verify`` downloads the dataset into the cache and checks it there.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from .._progress import lines_to_stderr
from ..conversion._cli_options import HelpFormatter
from ..conversion._upgrade import upgrade_dataset
from ..errors import FastloadError, _unwinding_ctrl_c
from ..format._splits import split_dirs
from ..format._verify import VerifyReport, verify_dataset
from ..storage import CachedDataset, RemoteSpec, is_remote, open_remote, redact, remote_splits
from ._info import describe_dataset, describe_installation

_NO_PROGRESS = ("report no progress: no bar on a terminal, no progress lines on stderr without one "
                "(docs/conversion.md, \"Progress\")")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``fastload`` command and its sub-commands."""
    parser = argparse.ArgumentParser(prog="fastload", description="Inspect and check fastload shard datasets.",
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", help="check the manifest, shard hashes and every record's checksum",
                            formatter_class=HelpFormatter)
    verify.add_argument("directory", help="a dataset, or a root with splits.json (every split is checked)")
    verify.add_argument("--jobs", type=int, default=1, help="shards checked in parallel (threads)")
    verify.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    verify.add_argument("--allow-external-shards", action="store_true",
                        help="read shards whose real path (a symbolic link) leaves the dataset directory")
    info = sub.add_parser("info", help="describe a dataset, or this installation when no directory is given",
                          formatter_class=HelpFormatter)
    info.add_argument("directory", nargs="?", help="a dataset or a root with splits.json; a URL fetches its "
                                                   "manifests only")
    bench = sub.add_parser("bench", help="sweep thread counts over a dataset and recommend one",
                           formatter_class=HelpFormatter)
    bench.add_argument("directory", help="a dataset")
    bench.add_argument("--batch-size", type=int, default=256, help="samples per batch")
    bench.add_argument("--max-batches", type=int, help="stop each pass after this many batches")
    bench.add_argument("--threads", type=int, nargs="+", help="thread counts to try (default: 1 to the CPU count)")
    bench.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    upgrade = sub.add_parser("upgrade", help="rewrite a format 1, 2 or 3 dataset in place as format 4 (safe to "
                                             "interrupt: run it again to finish)", formatter_class=HelpFormatter)
    upgrade.add_argument("directory", help="a local dataset, or a root with splits.json (every split is upgraded)")
    upgrade.add_argument("--no-progress", action="store_true", help=f"{_NO_PROGRESS}; no line per shard")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fastload`` command; returns the exit status."""
    args = build_parser().parse_args(argv)

    if args.command == "bench":
        from ._bench import format_sweep, sweep  # imports torch, which verify and info do not need

        try:
            with lines_to_stderr("fastload") if not args.no_progress else contextlib.nullcontext():
                rows = sweep(args.directory, args.batch_size, args.max_batches, args.threads, not args.no_progress)
        except (FastloadError, ValueError) as err:
            print(f"fastload: error: {err}", file=sys.stderr)
            return 1
        print(format_sweep(rows))
        return 0

    if args.command in ("verify", "upgrade"):
        with lines_to_stderr("fastload") if not args.no_progress else contextlib.nullcontext():
            if args.command == "verify":
                return _verify(args.directory, args.jobs, not args.no_progress, args.allow_external_shards)
            return _upgrade(args.directory, not args.no_progress)
    try:
        print(describe_dataset(args.directory) if args.directory else describe_installation())
    except FastloadError as err:
        print(f"fastload: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a bug or an unforeseen failure: still one line and a failing status
        _raise_if_ctrl_c(err)
        shown = redact(args.directory) if is_remote(args.directory) else args.directory
        print(f"fastload: error: {shown}: info stopped: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


def _verify(directory: str, jobs: int, progress: bool, allow_external_shards: bool = False) -> int:
    """Verify a dataset or every split of a root: one line per problem, then a summary; return the exit status."""
    if jobs < 1:
        print(f"fastload: error: --jobs must be at least 1, not {jobs}", file=sys.stderr)
        return 2
    remote: dict[str, Path] | None = None
    held: list[CachedDataset] = []  # the downloaded copies, kept from eviction until verify is done
    try:
        splits = None if is_remote(directory) else split_dirs(directory)
        if is_remote(directory):
            remote = _download_remote(directory, held, progress)
            directory = redact(directory)
    except FastloadError as err:
        print(err)
        return 1
    except Exception as err:  # a bug or an unforeseen failure: still one line and a failing status
        _raise_if_ctrl_c(err)
        shown = redact(directory) if is_remote(directory) else directory
        print(f"{shown}: verify stopped: {type(err).__name__}: {err}")
        return 1
    targets = {directory: Path(directory)} if splits is None else {f"{directory} [{n}]": d for n, d in splits.items()}
    if remote is not None:
        targets = remote
    total = VerifyReport()
    for name, path in targets.items():
        try:
            report = verify_dataset(path, jobs, progress, on_problem=print, allow_external_shards=allow_external_shards,
                                    name=name if remote is not None else None)
        except Exception as err:  # a bug or an unforeseen failure: still one line and a failing status
            _raise_if_ctrl_c(err)
            print(f"{path}: verify stopped: {type(err).__name__}: {err}")
            report = VerifyReport(problems=[str(err)])
        for note in report.notes:
            print(f"note: {note}")
        if len(targets) > 1:
            print(report.summary(name))
        for attr in ("shards", "records", "bytes", "seconds"):
            setattr(total, attr, getattr(total, attr) + getattr(report, attr))
        total.problems += report.problems
    print(total.summary(directory))
    return 0 if total.ok else 1


def _upgrade(directory: str, progress: bool) -> int:
    """Upgrade a dataset or every split of a root to format 4; print what was done; return the exit status."""
    try:
        report = upgrade_dataset(directory, progress=progress)
    except FastloadError as err:
        print(f"fastload: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a bug or an unforeseen failure (a full disk): one line and a failing status
        _raise_if_ctrl_c(err)
        shown = redact(directory) if is_remote(directory) else directory
        print(f"fastload: error: {shown}: upgrade stopped: {type(err).__name__}: {err} (run it again to finish "
              "or restart it)", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def _download_remote(url: str, held: list[CachedDataset], progress: bool = False) -> dict[str, Path]:
    """Download a remote dataset (every split of a root) into the cache; return name -> cached directory.

    The downloads are checked against the manifests' hashes as they arrive; verify then checks every record.
    """
    spec = RemoteSpec.build(None, None, None)
    splits = remote_splits(url, spec)
    targets = {redact(url): url} if splits is None else {f"{redact(url)} [{n}]": u for n, u in splits.items()}
    held.extend(open_remote(split_url, None, spec, shards=True, progress=progress) for split_url in targets.values())
    return {name: cached.path for name, cached in zip(targets, held)}


def _raise_if_ctrl_c(err: Exception) -> None:
    """Raise KeyboardInterrupt when ``err`` replaced one (a cleanup interrupted by Ctrl-C failed in turn).

    Else a Ctrl-C would read as a failure of the dataset, and ``verify`` would go on to the next split.
    """
    if _unwinding_ctrl_c(err):
        raise KeyboardInterrupt from err


if __name__ == "__main__":
    sys.exit(main())
