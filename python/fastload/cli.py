"""The ``fastload`` command: ``fastload verify DIR``, ``fastload info [DIR]``, ``fastload bench DIR``."""

from __future__ import annotations

import argparse
import sys

from ._info import describe_dataset, describe_installation
from ._verify import find_problems
from .errors import FastloadError


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fastload`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="fastload", description="Inspect and check fastload shard datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", help="check the manifest, shard hashes and every record's checksum")
    verify.add_argument("directory")
    info = sub.add_parser("info", help="describe a dataset, or this installation when no directory is given")
    info.add_argument("directory", nargs="?")
    bench = sub.add_parser("bench", help="sweep thread counts over a dataset and recommend one")
    bench.add_argument("directory")
    bench.add_argument("--batch-size", type=int, default=256)
    bench.add_argument("--max-batches", type=int, help="stop each pass after this many batches")
    bench.add_argument("--threads", type=int, nargs="+", help="thread counts to try (default: 1 to the CPU count)")
    args = parser.parse_args(argv)

    if args.command == "bench":
        from ._bench import format_sweep, sweep  # imports torch, which verify and info do not need

        try:
            rows = sweep(args.directory, args.batch_size, args.max_batches, args.threads)
        except (FastloadError, ValueError) as err:
            print(f"fastload: error: {err}", file=sys.stderr)
            return 1
        print(format_sweep(rows))
        return 0

    if args.command == "verify":
        problems = 0
        for line in find_problems(args.directory):
            print(line)
            problems += 1
        if problems:
            print(f"{args.directory}: {problems} problem(s)", file=sys.stderr)
            return 1
        print(f"{args.directory}: OK")
        return 0
    try:
        print(describe_dataset(args.directory) if args.directory else describe_installation())
    except FastloadError as err:
        print(f"fastload: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
