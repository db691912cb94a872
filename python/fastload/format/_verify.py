"""Checking a dataset: the manifest, every shard's hash and every record's checksum.

Shards are checked by ``jobs`` threads (reading, hashing and zstd release the
GIL), reported in shard order; progress (``_progress``) counts bytes hashed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .._extension import require as native_core
from .._progress import Progress
from ..errors import (
    ArgumentError,
    CorruptRecordError,
    CorruptShardError,
    DatasetError,
    FastloadError,
    ShardNotFoundError,
)
from ._manifest import HASH_ALGORITHM, ShardInfo, load_manifest
from ._record import RECORD_VERSION, Field, max_sample_bytes, schema_fingerprint
from ._scenes import SCENE_FIELD, WINDOW_FIELD, Scene, scenes_of
from ._shard_files import check_shard_file

_CHUNK = 1 << 22
_DECODE_BYTES = 1 << 24  # decoded bytes per native call when checking records


@dataclass
class VerifyReport:
    """What a verification covered and found."""

    shards: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not problems: e.g. an old format's weaker guarantees

    @property
    def ok(self) -> bool:
        """Return whether no problem was found."""
        return not self.problems

    def summary(self, name: str) -> str:
        """Return the final line: shards, records, bytes, seconds and throughput."""
        rate = self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0
        status = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        return (f"{name}: {status}: {self.shards} shards, {self.records} records, {self.bytes / 1e9:.3f} GB "
                f"in {self.seconds:.2f} s ({rate:.2f} GB/s)")


def _hash_file(path: Path, advance: Callable[[int], None]) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            advance(len(chunk))
    return f"{HASH_ALGORITHM}:{h.hexdigest()}"


def check_shard(directory: Path, shard: ShardInfo, fields: list[Field],
                advance: Callable[[int], None] = lambda n: None, allow_external_shards: bool = False,
                version: int = RECORD_VERSION, fingerprint: int | None = None,
                scenes: list[Scene] | None = None) -> list[str]:
    """Return one line per problem of one shard: size, content hash, then every record's checksum.

    With ``scenes`` (the manifest's, validated), every record's ``scene`` and ``window`` must name a
    scene and lie inside it.

    The file is checked as ``ShardDataset`` checks it (a regular file inside ``directory`` unless
    ``allow_external_shards``) and its records are decoded by the native readers' decoders.
    ``version`` is the dataset's format version (v2 records are checked against their key and schema);
    ``fingerprint`` what this shard's records carry (``Manifest.record_fingerprints``: v3, the binding
    to the dataset and the shard's position; None: the schema's fingerprint, as in v2).
    """
    if fingerprint is None:
        fingerprint = schema_fingerprint(fields)
    path = directory / shard.file
    try:
        check_shard_file(directory, shard, allow_external_shards, check_size=False)
    except ShardNotFoundError:
        return [f"{path}: shard file not found"]
    except CorruptShardError as err:
        advance(shard.bytes)
        return [str(err)]
    problems = []
    try:
        size = path.stat().st_size
        if size != shard.bytes:
            problems.append(f"{path}: {size} bytes, the manifest says {shard.bytes}")
            advance(shard.bytes)
        elif _hash_file(path, advance) != shard.hash:
            problems.append(f"{path}: content hash differs from the manifest's")
    except OSError as err:
        return [*problems, f"{path}: unreadable: {err}"]
    try:
        records = native_core().ShardRecords(str(path), shard.count, [f.native_spec for f in fields], True, version,
                                       fingerprint, max_sample_bytes())
    except FastloadError as err:
        return [*problems, str(err)]
    problems.extend(check_records(records, fields, scenes))
    return problems


def check_records(records: Any, fields: list[Field], scenes: list[Scene] | None = None) -> list[str]:
    """Decode every record of one shard with the readers' native decoders; return one line per bad record.

    With ``scenes``, a record whose ``scene``/``window`` fields fall outside them is a bad record too.

    Records are decoded (and their checksums verified) in runs into scratch rows; a bad record is
    reported and the run goes on after it. A shard that changes while it is checked stops the check.
    """
    sample = max(1, sum(f.nbytes for f in fields))
    rows = max(1, min(256, _DECODE_BYTES // sample))
    out = [np.empty(rows * f.nbytes, np.uint8) for f in fields]
    problems: list[str] = []
    key, count = 0, len(records)
    while key < count:
        keys = np.arange(key, min(key + rows, count), dtype=np.uint64)
        try:
            records.decode_rows(keys, np.arange(len(keys), dtype=np.uint64), out)
            if scenes is not None:
                problems.extend(f"{records.path} record {key + i}: {why}"
                                for i, why in window_problems(fields, out, len(keys), scenes))
            key += len(keys)
        except CorruptRecordError as err:
            problems.append(f"{records.path} record {err.record}: {err.reason}")
            key = err.record + 1
        except CorruptShardError as err:
            problems.append(f"{err} (stopped reading this shard)")
            break
    return problems


def verify_dataset(directory: str | os.PathLike, jobs: int = 1, progress: bool = False,
                   on_problem: Callable[[str], None] = lambda line: None,
                   allow_external_shards: bool = False, name: str | None = None) -> VerifyReport:
    """Check one dataset directory with ``jobs`` threads; call ``on_problem`` per problem, in shard order.

    ``name``: what the progress calls the dataset (a remote dataset's redacted URL; default: the directory's name).
    """
    if jobs < 1:
        raise ArgumentError(f"jobs must be at least 1, not {jobs}")
    directory = Path(directory)
    report = VerifyReport()
    start = time.perf_counter()
    try:
        manifest = load_manifest(directory)
    except DatasetError as err:
        report.problems.append(str(err))
        on_problem(str(err))
        return report
    if manifest.format_version < 3:
        report.notes.append(f"{directory}: format version {manifest.format_version}: its shards are not bound to "
                            "the dataset or their positions (a shard swapped with its manifest entry, or copied "
                            "from another dataset, reads as valid); run `fastload upgrade` on it to get format 4")
    elif manifest.format_version == 3:
        report.notes.append(f"{directory}: format version 3 (a record per LMDB value): `fastload upgrade` rewrites "
                            "it as format 4, whose blocks of records take up to a third less space for small records")
    try:
        scenes = scenes_of(manifest, directory)
    except DatasetError as err:
        report.problems.append(str(err))
        on_problem(str(err))
        scenes = None
    fingerprints = manifest.record_fingerprints()
    total = sum(s.bytes for s in manifest.shards)
    shown = name if name is not None else (
        f"{directory.parent.name}/{directory.name}" if directory.name.startswith(".") else directory.name)
    bar = Progress(f"verify {shown}", total, unit="B", enabled=progress, logger="fastload.verify",
                   leave=False)
    completed = False
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fastload-verify") as pool:
            outcomes = pool.map(lambda s, fp: check_shard(directory, s, manifest.fields, bar.update,
                                                          allow_external_shards, manifest.format_version, fp,
                                                          scenes),
                                manifest.shards, fingerprints)
            for shard, problems in zip(manifest.shards, outcomes):
                report.shards += 1
                report.records += shard.count
                report.bytes += shard.bytes
                for line in problems:
                    report.problems.append(line)
                    on_problem(line)
        completed = True
    finally:
        bar.close(completed)
    report.seconds = time.perf_counter() - start
    return report


def window_problems(fields: list[Field], out: list[np.ndarray], n: int,
                    scenes: list[Scene]) -> list[tuple[int, str]]:
    """Return (row, why) for each of the first ``n`` decoded rows whose scene or window is out of its scenes."""
    names = [f.name for f in fields]
    if SCENE_FIELD not in names or WINDOW_FIELD not in names:
        return []
    scene = out[names.index(SCENE_FIELD)][:n * 8].view(np.int64)
    window = out[names.index(WINDOW_FIELD)][:n * 32].view(np.int64).reshape(n, 4)
    bad = []
    for row in range(n):
        index = int(scene[row])
        y, x, h, w = (int(v) for v in window[row])
        if not 0 <= index < len(scenes):
            bad.append((row, f"scene {index} is not one of the manifest's {len(scenes)} scenes"))
        elif not (0 <= y and 0 <= x and h > 0 and w > 0 and y + h <= scenes[index].height
                  and x + w <= scenes[index].width):
            bad.append((row, f"window (y={y}, x={x}, h={h}, w={w}) is not inside scene {index} "
                             f"({scenes[index].height}x{scenes[index].width})"))
    return bad


def find_problems(directory: str | os.PathLike, allow_external_shards: bool = False) -> Iterator[str]:
    """Yield one line per problem found in the dataset at ``directory`` (none when it is sound)."""
    yield from verify_dataset(directory, allow_external_shards=allow_external_shards).problems
