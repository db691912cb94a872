"""Reading a label CSV: header detection, columns by name, integer labels or class names.

A CSV is read as its user means it or refused: ``filename,split,label`` once
silently took ``split`` as the label. The rules:

- The first row is a header when ``--path-column``/``--label-column`` is given,
  or when its path cell names no file while the second row's does.
- With a header, the path column is ``--path-column`` or one of the usual names
  (path, file, filename, ...), else the first column; the label column is
  ``--label-column``, else the single column named label/class/target, else the
  other column of a two-column file. More than two columns and no label column
  found is an error listing the columns.
- Without a header, a row is ``path,label``; more columns are an error.
- Labels that are all integers are kept; otherwise every label is a class name,
  class ``i`` being the i-th name in sorted order (the class list is saved).

The CSV may be a URL of object storage (``s3://bucket/labels.csv``, ``gs://``,
``az://``, ``https://``), read whole through the storage layer (at most
``MAX_LABEL_BYTES``) with the storage options of ``--data-dir``; messages name
the URL, never a credential.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO, Union
from urllib.parse import urlsplit

from ..errors import ArgumentError, RemoteNotFoundError
from ..storage import is_remote, redact
from ..storage._client import RemoteRoot, StorageOptions
from ..storage._urls import check_dataset_url
from ._sources import Source, SourceError, _some

# A label file in object storage is read whole into memory: at most this many bytes (about ten million rows).
MAX_LABEL_BYTES = 1 << 30

# Storage options of a label file in object storage: a mapping as ShardLoader takes them, or StorageOptions.
LabelStorage = Union[Mapping[str, Any], StorageOptions, None]

_PATH_NAMES = ("path", "file", "filename", "file_name", "relative_path", "relpath", "image", "image_path", "img")
_LABEL_NAMES = ("label", "class", "target", "category", "class_name", "y")


def _read_rows(csv_path: Path | str, storage_options: LabelStorage = None) -> list[tuple[int, list[str]]]:
    return _rows(io.StringIO(read_csv_text(csv_path, storage_options, "label file"), newline=""))


def _rows(lines: TextIO) -> list[tuple[int, list[str]]]:
    """Return (line number, stripped cells) of each non-blank CSV row of ``lines`` (an open text file)."""
    return [(n, [c.strip() for c in row]) for n, row in enumerate(csv.reader(lines), start=1)
            if row and any(c.strip() for c in row)]


def _remote_text(url: str, storage_options: LabelStorage) -> str:
    """Return the label file at ``url`` (object storage) as text; errors are typed and name the URL only."""
    base, _, name = url.rstrip("/").rpartition("/")
    try:
        check_dataset_url(url)  # no user, query or fragment: credentials and tokens go in the storage options
        if not urlsplit(url).path.strip("/"):
            raise SourceError(f"{redact(url)}: --labels names a bucket, not a CSV file")
        options = (storage_options if isinstance(storage_options, StorageOptions)
                   else StorageOptions.build(storage_options))
        root = RemoteRoot(base, options)
        data = root.read_bytes(name, MAX_LABEL_BYTES)
    except RemoteNotFoundError:
        raise SourceError(f"{redact(url)}: label file not found") from None
    except ArgumentError as err:  # a URL with a user, a query or a fragment; bad storage options
        raise SourceError(f"--labels {err}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SourceError(f"{redact(url)}: not UTF-8 text (byte {err.start}); a label file is a UTF-8 CSV") from None


def _pick(header: list[str], wanted: str | None, names: tuple[str, ...], what: str, flag: str,
          csv_path: Path | str) -> int | None:
    lowered = [h.lower() for h in header]
    if wanted is not None:
        if wanted not in header and wanted.lower() not in lowered:
            raise SourceError(f"{csv_path}: no column {wanted!r} for {flag}; the header has {header}")
        return header.index(wanted) if wanted in header else lowered.index(wanted.lower())
    found = [i for i, h in enumerate(lowered) if h in names]
    if len(found) > 1:
        raise SourceError(f"{csv_path}: several columns could be the {what} ({[header[i] for i in found]}); "
                          f"pass {flag}")
    return found[0] if found else None


def _columns(csv_path: Path | str, header: list[str] | None, width: int, path_column: str | None,
             label_column: str | None) -> tuple[int, int]:
    if header is None:
        if width > 2:
            raise SourceError(f"{csv_path}: {width} columns and no header naming the label column; add a header "
                              "row and pass --label-column NAME (and --path-column NAME)")
        return 0, 1
    path_i = _pick(header, path_column, _PATH_NAMES, "path", "--path-column", csv_path)
    label_i = _pick(header, label_column, _LABEL_NAMES, "label", "--label-column", csv_path)
    if path_i is None:
        path_i = 0 if label_i != 0 else 1
    if label_i is None:
        if len(header) != 2:
            raise SourceError(f"{csv_path}: {len(header)} columns {header} and none is named as the label; "
                              "pass --label-column NAME")
        label_i = 1 - path_i
    if path_i == label_i:
        raise SourceError(f"{csv_path}: the path and label columns are both {header[path_i]!r}")
    return path_i, label_i


def labels_from_csv(csv_path: Path | str, data_dir: Path | str, relpaths: list[str], path_column: str | None = None,
                    label_column: str | None = None, is_file: Callable[[str], bool] | None = None,
                    storage_options: LabelStorage = None) -> tuple[list[Source], list[str] | None]:
    """Return one labelled Source per image in ``relpaths`` and the class names (None for integer labels).

    ``is_file(relpath)`` says whether the data folder holds a file (default: a file under the local
    ``data_dir``; a folder in object storage passes its listing's). ``csv_path`` may be a URL of
    object storage, read with ``storage_options`` (those of ``--data-dir``; None: from the environment).
    """
    if is_file is None:
        folder = Path(data_dir)

        def is_file(relpath: str) -> bool:
            return (folder / relpath).is_file()
    rows = _read_rows(csv_path, storage_options)
    if is_remote(csv_path):
        csv_path = redact(str(csv_path))  # messages name the URL without user or query
    if not rows:
        raise SourceError(f"{csv_path}: empty label file")
    first = rows[0][1]
    named = path_column is not None or label_column is not None
    first_is_file = bool(first) and is_file(first[0].replace("\\", "/"))
    second_is_file = len(rows) > 1 and bool(rows[1][1]) and is_file(rows[1][1][0].replace("\\", "/"))
    header = first if named or (not first_is_file and (second_is_file or len(rows) == 1)) else None
    body = rows[1:] if header is not None else rows
    path_i, label_i = _columns(csv_path, header, max(len(r) for _, r in rows), path_column, label_column)
    labels: dict[str, str] = {}
    for line_no, row in body:
        if len(row) <= max(path_i, label_i):
            raise SourceError(f"{csv_path} line {line_no}: {len(row)} column(s), expected at least "
                              f"{max(path_i, label_i) + 1}")
        path, label = row[path_i].replace("\\", "/"), row[label_i]
        if path in labels:
            raise SourceError(f"{csv_path} line {line_no}: {path} is labelled twice")
        if not is_file(path):
            raise SourceError(f"{csv_path} line {line_no}: {path} names a file missing from {data_dir}")
        if not label:
            raise SourceError(f"{csv_path} line {line_no}: {path} has an empty label")
        labels[path] = label
    unlabelled = [p for p in relpaths if p not in labels]
    if unlabelled:
        raise SourceError(f"{csv_path}: no label for {len(unlabelled)} image(s): {_some(unlabelled)}")
    values = [labels[p] for p in relpaths]
    try:
        return [Source(p, int(v)) for p, v in zip(relpaths, values)], None
    except ValueError:
        classes = sorted(set(values))
        index = {c: i for i, c in enumerate(classes)}
        return [Source(p, index[v]) for p, v in zip(relpaths, values)], classes


def read_csv_text(csv_path: Path | str, storage_options: LabelStorage = None, what: str = "file") -> str:
    """Return a CSV file (a local path, or a URL of object storage) as text; SourceError naming it when missing."""
    if is_remote(csv_path):
        assert isinstance(csv_path, str)
        return _remote_text(csv_path, storage_options)
    if not Path(csv_path).is_file():
        raise SourceError(f"{csv_path}: {what} not found")
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        return f.read()
