"""``fastload upgrade``: rewrite a v1, v2 or v3 dataset in place as format v4, safely.

Records keep their payloads and checksums byte for byte; only their headers change (version 4, the
key, the binding fingerprint) and the shards pack them into blocks (format/_blocks.py). The whole
dataset is checked first (``fastload verify``): damage is refused, never laundered into freshly bound
records. Everything new is written under ``DIR/.upgrade/`` and checked again before a commit marker
is written there; then the old manifest moves out of the way (readers refuse the dataset as
incomplete until the end, never reading a mix of old and new), each new shard replaces its old one,
and the new manifest moves into place. A rerun after an interruption at any point finishes a
committed upgrade or discards an uncommitted one and starts over (docs/upgrading.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from .._progress import Progress
from ..errors import ArgumentError, DatasetError
from ..format._blocks import BLOCK_VERSION, BlockError
from ..format._lmdb_check import validate_shard
from ..format._manifest import (
    MANIFEST_NAME,
    UPGRADE_COMMIT,
    UPGRADE_DIR,
    Manifest,
    ShardInfo,
    file_hash,
    fsync_dir,
    load_manifest,
    write_json_atomic,
)
from ..format._page_cache import copy_hashed
from ..format._record import RECORD_MAGIC, schema_fingerprint
from ..format._shard_files import record_key
from ..format._splits import split_dirs
from ..format._strict_json import load_strict
from ..format._verify import verify_dataset
from ..storage._urls import is_remote, redact
from ._shard_writer import dataset_id, write_shard

COMMIT_NAME = UPGRADE_COMMIT  # in UPGRADE_DIR (the staging directory): the new dataset is complete and checked
OLD_MANIFEST_NAME = "manifest.old.json"  # where the old manifest goes once committed
_COMMIT_FORMAT = "fastload-upgrade"
_SHOWN_PROBLEMS = 20


@dataclass
class UpgradedDataset:
    """One dataset's outcome: the version it had, and its shards, records and bytes before and after."""

    directory: Path
    from_version: int  # BLOCK_VERSION (4) or more: it was current, nothing was done
    shards: int = 0
    records: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    resumed: bool = False  # an interrupted upgrade of it was finished

    @property
    def upgraded(self) -> bool:
        """Return whether this dataset was rewritten (False: it already had format 4)."""
        return self.from_version < BLOCK_VERSION

    def summary(self) -> str:
        """Return one line saying what happened to this dataset."""
        if not self.upgraded:
            return f"{self.directory}: format {self.from_version} already; nothing to do"
        how = " (an interrupted upgrade finished)" if self.resumed else ""
        return (f"{self.directory}: format {self.from_version} -> {BLOCK_VERSION}{how}: {self.shards} shards, "
                f"{self.records} records, {self.bytes_before} -> {self.bytes_after} bytes")


@dataclass
class UpgradeReport:
    """What :func:`upgrade_dataset` did: one entry per dataset (each split of a root with splits)."""

    datasets: list[UpgradedDataset] = field(default_factory=list)

    @property
    def upgraded(self) -> bool:
        """Return whether any dataset was rewritten."""
        return any(d.upgraded for d in self.datasets)

    def summary(self) -> str:
        """Return one line per dataset."""
        return "\n".join(d.summary() for d in self.datasets)


def upgrade_dataset(path: str | os.PathLike, *, progress: bool = False) -> UpgradeReport:
    """Rewrite the dataset at ``path`` (or each split of a root with ``splits.json``) in place as format 4.

    A v1, v2 or v3 dataset is checked as ``fastload verify`` checks it (any problem: a
    :class:`~fastload.errors.DatasetError` listing them, and nothing is changed), then rewritten:
    every record keeps its payloads and checksums, gets the v4 header (its key, and the binding to
    the dataset and its shard), and the shards pack the records into blocks. A v3 dataset keeps its
    ``dataset_id``; a v1 or v2 dataset gets one computed from its schema, its shards' hashes and its
    first shard (two copies upgrade to identical bytes). The manifest's other keys are kept.
    A v4 dataset is left as it is.

    It is safe to interrupt: the new files are written and checked under ``DIR/.upgrade/`` first,
    and calling this again after an interruption at any point finishes or restarts the upgrade.
    While the old shards are replaced the dataset has no ``manifest.json``, so readers refuse it
    rather than read a mix. It needs free space for one more copy of the dataset. ``progress``
    prints a line per shard (to stderr), shows a bar on a terminal and logs the progress of the
    checks and the rewrite as INFO records of the ``fastload.upgrade`` and ``fastload.verify``
    loggers (docs/conversion.md, "Progress"). Remote URLs are refused: upgrade a local copy, then
    upload it.
    """
    if is_remote(path):
        raise ArgumentError(f"{redact(str(path))}: fastload upgrade rewrites a dataset in place and works on local "
                            "directories only: download it, upgrade the local copy, then upload it")
    root = Path(path)
    splits = split_dirs(root)
    targets = [root] if splits is None else list(splits.values())
    report = UpgradeReport()
    with contextlib.ExitStack() as locks:
        for directory in targets:
            locks.enter_context(_exclusive(directory))
        finished = {d: _recover(d, progress) for d in targets}  # interrupted upgrades: finish or discard
        todo: list[tuple[Path, Manifest]] = []
        problems: list[str] = []
        for directory in targets:
            done = finished[directory]
            if done is not None:
                report.datasets.append(done)
                continue
            manifest = load_manifest(directory)
            if manifest.format_version >= BLOCK_VERSION:
                report.datasets.append(UpgradedDataset(directory, manifest.format_version, len(manifest.shards),
                                                       manifest.total, _size(manifest), _size(manifest)))
                continue
            links = [directory / s.file for s in manifest.shards if (directory / s.file).is_symlink()]
            if links:  # replacing a link by the new file would leave its target behind, unreferenced
                problems += [f"{link}: a symbolic link (to {os.readlink(link)}): upgrade the dataset where its "
                             "shard files are, or put the files in place of the links" for link in links]
                continue
            checked = verify_dataset(directory, jobs=_jobs(), progress=progress)
            problems += checked.problems
            todo.append((directory, manifest))
        if problems:
            raise DatasetError(_refusal(root, problems))
        for directory, manifest in todo:
            try:
                report.datasets.append(_upgrade(directory, manifest, progress))
            except (OSError, lmdb.Error, BlockError) as err:  # a full disk, permissions: typed, naming the dataset
                raise DatasetError(f"{directory}: the upgrade failed: {type(err).__name__}: {err} (run "
                                   "`fastload upgrade` again once the cause is fixed: it finishes or restarts "
                                   "the upgrade)") from err
    return report


def _refusal(root: Path, problems: Sequence[str]) -> str:
    shown = "".join(f"\n  {line}" for line in problems[:_SHOWN_PROBLEMS])
    more = f"\n  ... and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
    return (f"{root}: not upgraded (nothing was changed): fastload verify finds {len(problems)} problem(s); "
            f"repair or convert it again first:{shown}{more}")


def _jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _size(manifest: Manifest) -> int:
    return sum(s.bytes for s in manifest.shards)


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """Hold an advisory lock on ``directory`` (POSIX flock on the directory itself) while it is upgraded."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; two upgrades of one directory at once are the user's to avoid
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not a directory or missing: load_manifest names the problem
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetError(f"{directory}: another fastload upgrade is running on it") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _staging(directory: Path) -> Path | None:
    """Return ``DIR/.upgrade`` when it exists (a real directory), None when it does not."""
    staging = directory / UPGRADE_DIR
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        raise DatasetError(f"{staging}: not a directory; fastload upgrade stages its files there: remove it")
    return staging if staging.exists() else None


def _recover(directory: Path, progress: bool) -> UpgradedDataset | None:
    """Finish a committed upgrade of ``directory`` (return its outcome) or discard an uncommitted one (None)."""
    staging = _staging(directory)
    if staging is None:
        return None
    marker = staging / COMMIT_NAME
    if not marker.exists():  # interrupted before the commit: the dataset itself was not touched yet
        _say(progress, f"{directory}: discarding an interrupted upgrade that had not committed; starting over")
        shutil.rmtree(staging)
        fsync_dir(directory)
        return None
    _say(progress, f"{directory}: finishing an interrupted upgrade")
    commit = _read_commit(marker)
    done = _finish(directory, staging, commit, progress)
    done.resumed = True
    return done


def _read_commit(marker: Path) -> dict[str, Any]:
    doc = load_strict(marker, 16 << 20, "upgrade commit marker")
    ok = (isinstance(doc, dict) and doc.get("format") == _COMMIT_FORMAT
          and isinstance(doc.get("from_version"), int) and isinstance(doc.get("shards"), list)
          and all(isinstance(s, dict) and isinstance(s.get("file"), str) and isinstance(s.get("bytes"), int)
                  for s in doc["shards"])
          and all(isinstance(doc.get(k), str) for k in ("old_manifest", "new_manifest"))
          and all(isinstance(doc.get(k), int) for k in ("records", "bytes_before")))
    if not ok:
        raise DatasetError(f"{marker}: not a fastload upgrade commit marker (damaged?); the upgrade cannot finish")
    for s in doc["shards"]:
        if Path(s["file"]).name != s["file"] or not s["file"].startswith("shard-"):
            raise DatasetError(f"{marker}: names {s['file']!r}, not a shard file of the dataset")
    return doc


def _upgrade(directory: Path, manifest: Manifest, progress: bool) -> UpgradedDataset:
    """Write the v4 dataset under ``DIR/.upgrade``, check it, commit, and put it in place."""
    staging = directory / UPGRADE_DIR
    _check_room(directory, manifest)
    staging.mkdir()
    fsync_dir(directory)
    try:
        commit = _stage(directory, staging, manifest, progress)
    except Exception:  # refused or failed before the commit: the dataset is as it was; leave no staging behind
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
            fsync_dir(directory)
        raise
    write_json_atomic(staging / COMMIT_NAME, commit)  # the commit: from here on a rerun finishes the upgrade
    return _finish(directory, staging, commit, progress)


def _stage(directory: Path, staging: Path, manifest: Manifest, progress: bool) -> dict[str, Any]:
    """Write and check the new shards and manifest in ``staging``; return the commit marker's content."""
    version = manifest.format_version
    fields = manifest.fields
    schema = schema_fingerprint(fields).to_bytes(8, "little")
    new_id = manifest.dataset_id
    shards: list[ShardInfo] = []
    with Progress(f"upgrade {directory.name}", manifest.total, enabled=progress, logger="fastload.upgrade") as bar:
        for index, old in enumerate(manifest.shards):
            records = [_as_v4(r, version, schema) for r in _read_records(directory / old.file, old, version, staging)]
            if new_id is None:  # v1, v2: an id from what the dataset holds, the same for every copy of it
                identity = f"upgraded from format {version}\n" + "".join(
                    f"{s.file} {s.count} {s.bytes} {s.hash}\n" for s in manifest.shards)
                new_id = dataset_id(fields, identity, records)
            info = write_shard(staging, index, records, binding=(fields, new_id))
            shards.append(info)
            if progress:
                bar.write(f"{directory}: shard {index + 1}/{len(manifest.shards)} {old.file}: {old.count} records, "
                          f"{old.bytes} -> {info.bytes} bytes", file=sys.stderr)
            bar.update(old.count)
    if new_id is None:  # an empty v1 or v2 dataset
        new_id = dataset_id(fields, f"upgraded from format {version}\n", [])
    new = Manifest(fields, shards, dict(manifest.provenance), dict(manifest.extra), BLOCK_VERSION, new_id)
    # The former fingerprint, which loader states saved before carry, and the content it stands for.
    new.extra["upgraded_from"] = {"format_version": version, "fingerprint": manifest.fingerprint,
                                  "content": new.content_fingerprint}
    write_json_atomic(staging / MANIFEST_NAME, new.to_json())
    checked = verify_dataset(staging, jobs=_jobs(), progress=progress)  # what readers will read, before committing
    if not checked.ok:
        shown = "".join(f"\n  {line}" for line in checked.problems[:_SHOWN_PROBLEMS])
        raise DatasetError(f"{directory}: not upgraded (nothing was changed): the upgraded copy fails its check "
                           f"(did the dataset change while it was read?):{shown}")
    return {"format": _COMMIT_FORMAT, "from_version": version,
            "old_manifest": file_hash(directory / MANIFEST_NAME), "new_manifest": file_hash(staging / MANIFEST_NAME),
            "records": manifest.total, "bytes_before": _size(manifest),
            "shards": [{"file": s.file, "bytes": s.bytes} for s in shards]}


def _finish(directory: Path, staging: Path, commit: dict[str, Any], progress: bool) -> UpgradedDataset:
    """Move the committed new dataset of ``staging`` into ``directory``; each step may be repeated."""
    live, staged = directory / MANIFEST_NAME, staging / MANIFEST_NAME
    shards = commit["shards"]
    if staged.exists():
        _say(progress, f"{directory}: moving the {len(shards)} upgraded shards into place (readers refuse the "
                       "dataset until the new manifest follows)")
        if live.exists():  # the old manifest: out of the way first, so readers refuse the dataset meanwhile
            if file_hash(live) not in (commit["old_manifest"], commit["new_manifest"]):
                raise DatasetError(f"{live}: changed since the upgrade committed; {staging} holds the upgraded "
                                   "dataset, not finished: remove it to keep the dataset as it is now")
            os.replace(live, staging / OLD_MANIFEST_NAME)
            fsync_dir(directory)
            fsync_dir(staging)
        for shard in shards:
            if (staging / shard["file"]).exists():
                os.replace(staging / shard["file"], directory / shard["file"])
        fsync_dir(directory)
        for shard in shards:
            target = directory / shard["file"]
            size = target.stat().st_size if target.exists() else None
            if size != shard["bytes"]:
                raise DatasetError(f"{target}: {size} bytes where the upgrade put {shard['bytes']}: changed while "
                                   f"the upgrade was interrupted; the dataset cannot be completed (its old "
                                   f"manifest is {staging / OLD_MANIFEST_NAME})")
        if file_hash(staged) != commit["new_manifest"]:
            raise DatasetError(f"{staged}: differs from the manifest the upgrade committed; the dataset cannot be "
                               f"completed (its old manifest is {staging / OLD_MANIFEST_NAME})")
        os.replace(staged, live)  # the dataset is complete again, as format 4
        fsync_dir(directory)
    elif not live.exists():
        raise DatasetError(f"{directory}: an interrupted upgrade committed but its new {MANIFEST_NAME} is gone from "
                           f"{staging} and from the dataset; the dataset cannot be completed")
    (staging / COMMIT_NAME).unlink()
    fsync_dir(staging)
    shutil.rmtree(staging)
    fsync_dir(directory)
    return UpgradedDataset(directory, commit["from_version"], len(shards), commit["records"],
                           commit["bytes_before"], sum(s["bytes"] for s in shards))


def _check_room(directory: Path, manifest: Manifest) -> None:
    """Refuse before writing anything when the disk cannot hold the new copy (plus one shard's temporaries)."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    largest = max((s.bytes for s in manifest.shards), default=0)
    needed = _size(manifest) + 16 * manifest.total + 2 * largest + (1 << 20)
    if free < needed:
        raise DatasetError(f"{directory}: the upgrade writes a new copy of the dataset beside it first and needs "
                           f"about {needed} bytes free; {free} are")


def _read_records(path: Path, shard: ShardInfo, version: int, staging: Path) -> list[bytes]:
    """Return the records of a verified v1-v3 shard (one record per LMDB key), as verified.

    The records are read from a copy of the shard in ``staging`` whose content hash is checked against the
    manifest's first: the checks before ran on the shard as it was then, and a shard changed since (records
    swapped, rewritten) must not be bound afresh into a dataset that verifies. The copy's structure is
    validated again before LMDB opens it.
    """
    copy = staging / f".source-{shard.file}"
    try:
        if copy_hashed(path, copy) != shard.hash:
            raise DatasetError(f"{path}: its content changed after it was checked (the hash differs from the "
                               "manifest's); nothing was changed")
        validate_shard(str(copy), shard.count, packed=False)
        env = lmdb.open(str(copy), subdir=False, readonly=True, lock=False)
        try:
            with env.begin(buffers=False) as txn:
                records = [txn.get(record_key(key)) for key in range(shard.count)]
        finally:
            env.close()
    finally:
        copy.unlink(missing_ok=True)
    out: list[bytes] = []
    for key, record in enumerate(records):
        if (record is None or len(record) < 8 or record[:4] != RECORD_MAGIC
                or int.from_bytes(record[4:6], "little") != version):
            raise DatasetError(f"{path} record {key}: missing or not a version {version} record (the shard changed "
                               "after it was checked); nothing was changed")
        out.append(record)
    return out


def _as_v4(record: bytes, version: int, schema: bytes) -> bytes:
    """Return a v1-v3 record as a v4 one carrying the schema fingerprint (the shard writer binds it)."""
    v4 = BLOCK_VERSION.to_bytes(2, "little")
    if version == 1:  # no key or fingerprint: insert them after the 8-byte header
        return b"".join([record[:4], v4, record[6:8], bytes(8), schema, record[8:]])
    return b"".join([record[:4], v4, record[6:16], schema, record[24:]])
