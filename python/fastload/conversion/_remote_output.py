"""A conversion's output in object storage: where it is staged, and its publication (``storage/_publish.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..format._splits import SPLIT_FOLDERS, SPLITS_NAME
from ..storage import RemoteSpec, redact
from ..storage._client import StorageOptions
from ..storage._publish import (
    checked_staging_dir,
    clear_staging,
    finish_publish,
    first_object,
    is_staged,
    mark_started,
    publish,
    read_remote_json,
    read_remote_manifest,
    remote_dataset_exists,
    remove_staging,
)
from ..storage._urls import join_url
from ._run_record import RECORDING_FILES, check_options_match, recorded_options_of
from ._shard_targets import RemoteShards


def stage_output(url: str, storage_options: Mapping[str, Any] | None, cache_dir: str | os.PathLike | None,
                 overwrite: bool, resume: bool) -> tuple[Path | None, Any]:
    """Check the output ``url`` and return (the staging directory to write into, its storage options).

    As for a local directory (FileExistsError): a URL holding a dataset is refused unless
    ``overwrite``, and so is a conversion staged for it and interrupted, unless ``resume`` (which
    continues it) or ``overwrite`` (which starts again). With ``resume``, a URL holding a dataset and
    nothing staged is complete: the staging directory returned is None.
    """
    spec = RemoteSpec.build(storage_options, cache_dir, None)
    staging = checked_staging_dir(spec.cache_dir, url)
    staged = is_staged(staging)
    if not staged and os.path.lexists(staging):  # empty: a publish ended while deleting it
        remove_staging(staging)
    if not overwrite:
        if staged and not resume:
            raise FileExistsError(f"{redact(url)}: an interrupted conversion to it is staged in {staging} (pass "
                                  "resume=True / --resume to continue it, or overwrite=True / --overwrite to start "
                                  "again)")
        if not staged and remote_dataset_exists(url, spec.storage_options):
            if resume:
                return None, spec.storage_options
            raise FileExistsError(f"{redact(url)}: holds a dataset (pass overwrite=True / --overwrite to replace "
                                  "it)")
        other = None if staged else first_object(url, spec.storage_options)
        if other is not None:  # as a directory that is not empty: another dataset in a folder of it, files
            raise FileExistsError(f"{redact(url)}: is not empty and holds no dataset ({other} is there); pass "
                                  "another URL, or overwrite=True / --overwrite to write the dataset beside what "
                                  "is there (a dataset's own files are the only ones ever replaced or deleted)")
    return staging, spec.storage_options


def begin_staged_run(staging: Path, overwrite: bool) -> None:
    """Mark the conversion into ``staging`` started, and with ``overwrite`` delete an earlier one staged there.

    Called once the call's arguments are checked, before anything is written (where a local
    ``overwrite`` deletes the old directory): a call refused for its arguments changes nothing,
    and from here a ``resume`` continues this run, never taking the URL's old dataset for it.
    """
    mark_started(staging)
    if overwrite:
        clear_staging(staging)


def check_resume_options_at(url: str, storage: StorageOptions, options: dict[str, Any]) -> None:
    """Raise UsageError when ``options`` differ from those the complete dataset at ``url`` records.

    What ``check_resume_options`` checks for a local directory, for ``resume`` of a URL that holds
    its finished dataset and nothing staged (nothing recorded there: no check).
    """
    for name in RECORDING_FILES:  # as for a directory: the first that records options
        recorded = recorded_options_of(read_remote_json(url, storage, name))
        if recorded is not None:
            check_options_match(redact(url), name, recorded, options)
            return


def check_complete_at(url: str, storage: StorageOptions) -> None:
    """Read the manifests of the finished dataset at ``url`` (its own, or its splits'), as a reader would.

    DatasetError names one that is damaged or missing: a resume does not call such a dataset complete.
    """
    if read_remote_json(url, storage, SPLITS_NAME) is None:
        read_remote_manifest(url, storage)
        return
    for split in SPLIT_FOLDERS:
        read_remote_manifest(join_url(url, split), storage)


def direct_target(url: str, storage: StorageOptions, client: Any, split: str = "") -> RemoteShards | None:
    """Return where the tasks on ``client``'s cluster upload the shards of ``url`` (of its ``split``); None without.

    Without a cluster the driver writes the shards into the staging directory and publishes them.
    """
    if client is None:
        return None
    return RemoteShards(join_url(url, split) if split else url, url, storage)


def publish_output(staging: Path, url: str, storage: Any, progress: bool, summary: bool | None = None) -> None:
    """Publish the dataset written in ``staging`` to ``url`` (shards, then manifests) and delete the staging.

    ``progress``: report the upload as it goes (``_progress``); ``summary`` (default: ``progress``):
    print one line with the bytes sent and the rate at the end.
    """
    start = time.perf_counter()
    sent = publish(staging, url, storage, progress)
    if progress if summary is None else summary:
        seconds = max(time.perf_counter() - start, 1e-9)
        print(f"published {redact(url)}: {sent / 1e6:.1f} MB in {seconds:.1f} s ({sent / 1e6 / seconds:.1f} MB/s)")
    finish_publish(staging)
