"""Strict, bounded JSON for the files of a dataset directory (``manifest.json``, ``splits.json``).

Both are untrusted input, so reading one costs a small constant times its size
and never recurses: the file is read up to a size bound, then one pass over its
bytes in fixed-size chunks (numpy, no regular expression: a regex over a long
string costs about 120 bytes per byte) finds the brackets outside strings and
refuses nesting deeper than ``MAX_DEPTH`` or more than ``MAX_CONTAINERS``
arrays and objects before ``json`` builds anything. The raw bytes are dropped
before parsing, which refuses duplicate keys, NaN, Infinity, numbers that
overflow to infinity (``1e999999``) and numbers of more than 40 digits.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError

MAX_DEPTH = 64
MAX_CONTAINERS = 4_000_000  # arrays and objects: a real 256 MiB manifest has under 3 million
MAX_NUMBER_CHARS = 40
_CHUNK = 1 << 18  # bytes scanned at once: the scan's memory is about 60 times this, whatever the file's size
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENERS, _CLOSERS = np.array([ord("["), ord("{")], np.uint8), np.array([ord("]"), ord("}")], np.uint8)


class JsonProblem(Exception):
    """A problem at a key (``where``, empty for the whole document); the caller adds the file."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


def load_strict(path: Path, max_bytes: int, noun: str) -> Any:
    """Read, scan and parse the JSON file at ``path`` (``noun`` names it in errors, e.g. "manifest").

    Raises DatasetError naming ``path`` for a file that is not a regular file, larger than
    ``max_bytes``, unreadable, not UTF-8 or not JSON, or breaks a bound above.
    """
    try:
        if not path.is_file():
            raise DatasetError(f"{path}: the {noun} is not a regular file")
        with open(path, "rb") as f:
            want = min(os.fstat(f.fileno()).st_size, max_bytes) + 1  # a buffer of the file's size, not the bound's
            raw = f.read(want)
            if len(raw) == want <= max_bytes:  # grew since fstat
                raw += f.read(max_bytes + 1 - want)
    except OSError as err:
        raise DatasetError(f"{path}: unreadable {noun}: {err}") from None
    if len(raw) > max_bytes:
        raise DatasetError(f"{path}: the {noun} is larger than {max_bytes} bytes")
    try:
        check_nesting(raw)
        text = raw.decode("utf-8")
        del raw  # parsing holds the text and what it builds, not the bytes too
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_int=_bounded_int, parse_float=_finite_float)
    except JsonProblem as err:
        raise DatasetError(f"{path}: invalid {noun}: {err}") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DatasetError(f"{path}: unreadable {noun}: {err}") from None


def check_nesting(raw: bytes) -> None:
    """Raise JsonProblem when ``raw`` nests arrays and objects deeper than MAX_DEPTH, or holds too many.

    Brackets inside strings do not count: a quote opens or closes a string unless an odd run
    of backslashes precedes it. Invalid JSON may be misread after its first error, where the
    parser stops anyway. Iterative, in chunks: memory does not grow with the file.
    """
    in_string, escaping, depth, containers = 0, 0, 0, 0  # carried from one chunk to the next
    for start in range(0, len(raw), _CHUNK):
        codes = np.frombuffer(raw, np.uint8, min(_CHUNK, len(raw) - start), start)
        n = codes.size
        slash = codes == _BACKSLASH
        # Position of the last non-backslash at or before each byte; a run carried in counts from before 0.
        last = np.maximum.accumulate(np.where(slash, -1 - escaping, np.arange(n)))
        run = np.empty(n, np.int64)  # the backslashes just before each byte
        run[0] = escaping
        run[1:] = np.arange(n - 1) - last[:-1]
        quotes = (codes == _QUOTE) & (run % 2 == 0)
        inside = (np.cumsum(quotes, dtype=np.int64) + in_string) % 2 == 1  # a closing quote reads as outside
        steps = np.isin(codes, _OPENERS).astype(np.int8) - np.isin(codes, _CLOSERS).astype(np.int8)
        steps[inside] = 0
        levels = np.cumsum(steps, dtype=np.int64) + depth
        if int(levels.max()) > MAX_DEPTH:
            raise JsonProblem("", f"nested deeper than {MAX_DEPTH} levels")
        containers += int(np.count_nonzero(steps == 1))
        if containers > MAX_CONTAINERS:
            raise JsonProblem("", f"more than {MAX_CONTAINERS} arrays and objects")
        depth = int(levels[-1])
        in_string = int(inside[-1])
        escaping = int((n - 1 - last[-1]) % 2)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonProblem("", f"duplicate key {key[:40]!r}")
        out[key] = value
    return out


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_CHARS:
        raise JsonProblem("", f"an integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise JsonProblem("", f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise JsonProblem("", f"{text} is not a finite number (no NaN or Infinity)")
    return value


def _no_constant(name: str) -> Any:
    raise JsonProblem("", f"{name} is not a JSON number")
