"""Writing one dataset directory: shards in order, a resumable journal, the manifest last."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .._progress import Progress
from ..errors import FastloadError, ImageReadError, PreprocessError
from ..format._manifest import MANIFEST_NAME, Manifest, write_json_atomic
from ..format._record import FORMAT_VERSION
from ._encode import encode_picked, encode_source
from ._images import undecodable_error
from ._journal import Journal
from ._output_dir import JSON_TEMPS, is_shard_file_name
from ._parallel import ordered_map
from ._picks import each_error
from ._planned_writer import write_first_planned, write_planned
from ._shard_labels import label_histogram, shard_labels_doc
from ._shard_plan import shard_capacity
from ._shard_targets import LocalShards, ShardTarget
from ._shard_writer import dataset_id
from ._source_files import source_stat
from ._sources import Source
from ._write_order import READS_NOTE_FROM, check_order, order_doc, picks_of, shuffled_job, write_order

_log = logging.getLogger("fastload.conversion")  # a library prints nothing itself: logging's last resort, or the
# application's handlers, show its note

_DELAY_ENV = "FASTLOAD_TEST_SHARD_DELAY"  # tests: seconds to sleep after each shard
# From this many local worker processes on, the workers write the shards (when they can be planned): the
# driver's one writer thread (LMDB, compacting copy, hash: about 130 MB/s of raw tiles here) no longer keeps
# up with them. With 2, on 2 cores, either way ran at the same rate.
POOL_TASKS_WRITE_FROM = 4


@dataclass
class ShardLimits:
    """When a shard is full: a sample count, a byte size, or both."""

    samples: int | None = None
    bytes: int | None = None


# A task: (source index, first sample of that source, arguments of the encode function).
Task = tuple[int, int, tuple]


@dataclass
class WriteJob:
    """One dataset to write: where, from which sources, with which settings.

    By default each source is an image file encoded whole by ``encode_source``.
    Other inputs (HDF5 stacks, torch or HuggingFace datasets) give their own
    ``tasks`` (source index, first sample, encode arguments), their ``encode``
    function, and a ``stamp`` identifying their content for ``--resume``;
    ``tile_counts`` is None when the number of samples is unknown (an
    iterable dataset). ``piece(source, first, stop)`` gives the encode
    arguments for exactly those samples of one source: a job that has it can
    have its shards written by tasks on a cluster (image sources have it by
    default); a task encodes at most ``piece_samples`` of them for the first
    shard (None: a whole piece of a source). ``target``: where the shards go (default: ``out_dir``, which
    always holds the journal and the manifest).

    ``order``: ``"source"`` writes the samples in the sources' order; ``"shuffled"`` in the seeded
    permutation of ``seed`` across shards (``_write_order``), which needs ``tile_counts`` and
    ``gather(sources, samples)``, the encode arguments of those source-order samples for
    ``gather_encode`` (image sources have both by default). ``whole_sources``: each source's
    samples are written together, so a file that fails to decode can be skipped whole (false for
    the job a shuffled write plans: ``_write_order.shuffled_job``). ``sample_sources``: each
    sample is read on its own (a map-style dataset read by index), so the shuffled order treats
    every sample as a source of its own (``_write_groups``). ``complete(manifest)``: called once the
    shards are written, before the manifest is: it may add to the manifest's ``extra`` (from the shards in
    ``out_dir``) or raise, leaving the shards and the journal without a manifest.
    """

    out_dir: Path
    settings: Any
    sources: list[Source]
    tile_counts: list[int] | None
    probe_skipped: list[dict]
    limits: ShardLimits
    provenance: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    tasks: Callable[[tuple[int, int]], Iterator[Task]] | None = None
    encode: Callable[..., list[bytes]] = encode_source
    stamp: str | None = None
    worker_init: tuple[Callable[..., None], tuple] | None = None
    source_files: list[Source] | None = None  # the files a shuffled job's tasks read (``sources`` is one name then)
    unit: str = "tile"
    piece: Callable[[int, int, int], tuple] | None = None
    piece_samples: int | None = None
    target: ShardTarget | None = None
    order: str = "source"
    seed: int = 0
    gather: Callable[[np.ndarray, np.ndarray], tuple] | None = None
    gather_encode: Callable[..., list[bytes]] | None = None
    whole_sources: bool = True
    sample_sources: bool = False
    complete: Callable[[Manifest], None] | None = None

    def __post_init__(self) -> None:
        check_order(self.order)
        if self.tasks is None and self.piece is None:
            self.piece = self._image_piece
        if self.tasks is None and self.gather is None:
            self.gather, self.gather_encode = self._image_gather, encode_picked

    @property
    def lists_bad_files(self) -> bool:
        """Whether a file that fails to decode is listed with every other one (images) rather than ending the run."""
        return self.tasks is None or not self.whole_sources

    def _image_gather(self, sources: np.ndarray, samples: np.ndarray) -> tuple:
        return (self.settings, picks_of(self.sources, sources, samples), len(sources))

    def _image_piece(self, source: int, first: int, stop: int) -> tuple:
        return (self.settings, self.sources[source], source, first, stop)

    def run_tasks(self, fn: Callable[..., Any], arg_tuples: Iterable[tuple], workers: int,
                  client: Any) -> Iterator[tuple[Any, BaseException | None]]:
        """Run ``fn`` over ``arg_tuples`` as ``_parallel.ordered_map`` does, with this job's worker initializer.

        The workers are fresh interpreters when they would read object storage: the store's runtime does
        not survive a fork. When every source file in object storage has its copy in the run's spool
        (its probe downloaded it), the workers make no request and are forks of this process: fresh
        interpreters cost about half a second each to start and import the conversion (measured:
        a bucket's conversion at 0.64 of the local one's rate with them).
        """
        initializer, initargs = self.worker_init if self.worker_init is not None else (None, ())
        return ordered_map(fn, arg_tuples, workers, initializer, initargs, client=client,
                           fresh_workers=_remote_sources(self.settings) and not _all_spooled(self))


@dataclass
class WriteResult:
    """What a write produced, for the summary."""

    manifest: Manifest
    source_bytes: int
    decoded_bytes: int


def _remote_sources(settings: Any) -> bool:
    """Return whether an image job reads a folder in object storage (its source folder or a partner's)."""
    dense = getattr(settings, "dense", None)
    return getattr(settings, "remote", None) is not None or any(p.remote is not None for p in
                                                                 (dense.partners if dense is not None else ()))


def _all_spooled(job: WriteJob) -> bool:
    """Return whether every file of ``job``'s sources in object storage (partners' too) is in the run's spool."""
    remote = getattr(job.settings, "remote", None)
    dense = getattr(job.settings, "dense", None)
    partners = dense.partners if dense is not None else ()
    for source in job.source_files if job.source_files is not None else job.sources:
        if remote is not None and not remote.spooled(source.relpath):
            return False
        for partner, relpath in zip(partners, source.partners):
            if partner.remote is not None and not partner.remote.spooled(relpath):
                return False
    return True


def _identity(job: WriteJob) -> str:
    """Return what identifies the dataset's inputs for its id: options, and image sources' names, labels and sizes.

    Jobs with their own tasks (``write_dataset``) add nothing to their options: a map-style
    dataset and the same samples streamed write the same shards, so they get one id; their
    content enters the id through the first shard's records.
    """
    lines = [json.dumps(job.provenance.get("options", {}), sort_keys=True)]
    if job.stamp is None:
        for s in job.sources:
            size, _ = source_stat(job.settings, s.relpath)
            lines.append(f"{s.relpath}|{s.label}|{size}" + _partner_line(job, s, versions=False))
    return "\n".join(lines)


def _fingerprint(job: WriteJob) -> str:
    h = xxhash.xxh3_128()
    h.update(f"format {FORMAT_VERSION}\n".encode())  # shards of another format version are not resumed
    h.update(json.dumps(job.provenance.get("options", {}), sort_keys=True).encode())
    h.update(json.dumps([f.to_json() for f in job.settings.fields], sort_keys=True).encode())
    if job.stamp is not None:
        h.update(job.stamp.encode())
        return h.hexdigest()
    for s in job.sources:
        size, version = source_stat(job.settings, s.relpath)
        h.update(f"{s.relpath}|{s.label}|{size}|{version}{_partner_line(job, s, versions=True)}\n".encode())
    return h.hexdigest()


def _partner_line(job: WriteJob, source: Source, versions: bool) -> str:
    """Return what identifies a scene's partner files (paths, sizes, versions): empty without partners."""
    dense = getattr(job.settings, "dense", None)
    if dense is None or not source.partners:
        return ""
    parts = []
    for partner, relpath in zip(dense.partners, source.partners):
        size, version = source_stat(partner, relpath)  # a Partner has data_dir and remote too
        parts.append(f"|{partner.name}={relpath}|{size}" + (f"|{version}" if versions else ""))
    return "".join(parts)


def _clean_partial_files(out_dir: Path, keep: set[str]) -> None:
    for path in out_dir.iterdir():
        name = path.name
        ours = is_shard_file_name(name) or name in JSON_TEMPS
        if path.is_file() and not path.is_symlink() and ours and name not in keep:
            path.unlink()


def _image_tasks(job: WriteJob, start: tuple[int, int]) -> Iterator[Task]:
    for i in range(start[0], len(job.sources)):
        src = job.sources[i]
        first = start[1] if i == start[0] else 0
        yield (i, first, (job.settings, src, i, first))


def write_dataset(job: WriteJob, workers: int, skip_bad: bool, resume: bool, progress: bool = True,
                  client: Any = None) -> WriteResult:
    """Write the dataset of ``job`` (shards, then the manifest in ``job.out_dir``) and return what was written.

    The encode tasks run in ``workers`` processes, or on the Dask cluster of
    ``client`` when one is given. Shards go to ``job.target`` (default: a
    directory ``job.out_dir``). This process writes them in order as records
    arrive, except on a cluster or with at least ``POOL_TASKS_WRITE_FROM``
    local workers when their boundaries can be planned up front
    (``_shard_plan``; the job gives ``piece``): then this process writes the
    first and each further shard is a task that writes it
    (``_planned_writer``), which this process checks, commits and journals.
    The bytes are the same either way. With ``job.order == "shuffled"`` the
    writers see one source whose samples are in the shuffled order
    (``_write_order.shuffled_job``), planned by position the same way; the driver's tasks are
    the order's groups.

    Raises PreprocessError on a bad source image unless ``skip_bad``; the
    shards completed so far stay on disk with the journal, and no manifest.
    """
    out_dir = job.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # Absolute: tasks on a cluster resolve the directory in their own working directory.
    target = job.target if job.target is not None else LocalShards(out_dir.absolute())
    journal = Journal(out_dir, _fingerprint(job), job.provenance.get("options"))
    if resume and journal.path.exists():
        journal.load_valid_prefix(target)
    _clean_partial_files(out_dir, {e["file"] for e in journal.entries})
    target.clean_staged()
    delay = float(os.environ.get(_DELAY_ENV, "0") or 0)
    identity = _identity(job) if journal.dataset_id is None else ""  # only the first shard needs it
    planned = job
    group_samples = 1
    if job.order == "shuffled":
        order = write_order(job)
        group_samples = order.group
        planned = shuffled_job(job, order)
        reads = order.reads_per_source()
        if reads >= READS_NOTE_FROM:
            _log.warning("note: %s: the shuffled order reads each source file about %.0f times (once per group of %d "
                         "samples it spans); --order source reads each once (docs/conversion.md, \"Write order\")",
                         out_dir.name, reads, order.group)
    counts = planned.tile_counts
    capacity = None
    by_tasks = client is not None or workers >= POOL_TASKS_WRITE_FROM
    if by_tasks and counts is not None and planned.piece is not None:
        capacity = shard_capacity(job.limits.samples, job.limits.bytes, job.settings.fields)
    if client is not None and capacity is None and progress:
        print(f"dask: {out_dir.name}: the driver writes the shards ({_why_not_planned(planned)})")
    bar = Progress(out_dir.name, sum(counts) if counts is not None else None, unit=job.unit,
                   initial=sum(e["count"] for e in journal.entries), enabled=progress)
    completed = False
    try:
        if capacity is not None and journal.dataset_id is None:
            assert counts is not None
            if not write_first_planned(planned, journal, target, counts, capacity, skip_bad, workers, client, bar,
                                       identity):
                capacity = None  # a bad file, not skipped: named with every other one as in a one-machine run
        if capacity is None:
            _write_in_order(planned, journal, target, workers, skip_bad, client, bar, delay, identity)
        elif journal.dataset_id is not None:  # else every source was skipped: an empty dataset
            assert counts is not None
            write_planned(planned, journal, target, counts, capacity, skip_bad, workers, client, bar, delay)
        completed = True
    except BaseException:
        if isinstance(target, LocalShards):  # what tasks staged is of no use; a bucket's waits for the next run
            with contextlib.suppress(PreprocessError):  # the error that ended the run is the one to raise
                target.clean_staged()
        raise
    finally:
        bar.close(completed)
    return _finish(job, journal, target, group_samples)


def _why_not_planned(job: WriteJob) -> str:
    """Say why the shards of ``job`` cannot be planned up front and written by tasks."""
    if job.tile_counts is None:
        return "an iterable dataset: its length is unknown until it ends"
    if job.piece is None:
        return "HDF5 stacks are read in row chunks that must fail as in a one-machine run"
    return ("their boundaries depend on the compressed sizes under the shard size; to have the workers write them, "
            "give a sample count per shard (--samples-per-shard, samples_per_shard=) whose records cannot reach it")


def _write_in_order(job: WriteJob, journal: Journal, target: ShardTarget, workers: int, skip_bad: bool,
                    client: Any, bar: Progress, delay: float, identity: str) -> None:
    """Encode from the journal's position on and write the shards here, in order (``identity``: see ``_identity``)."""
    start = journal.position()
    counts = job.tile_counts
    current: list[bytes] = []
    current_size = 0

    # Shards are written (LMDB, compacting copy, hash, journal) by one writer
    # thread while this thread gathers the next shard's records: at most one
    # shard is being written and one being filled, always in order.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastload-shard-writer")
    pending: Future[None] | None = None
    shard_index = len(journal.entries)

    def write_and_record(index: int, records: list[bytes], next_source: int, next_tile: int,
                         skipped: list[dict[str, Any]]) -> None:
        assert journal.dataset_id is not None
        journal.record(target.write(index, records, (job.settings.fields, journal.dataset_id)), next_source,
                       next_tile, skipped, label_histogram(job.settings.fields, records))
        if delay:
            time.sleep(delay)

    def flush(next_source: int, next_tile: int) -> None:
        nonlocal current, current_size, pending, shard_index
        if pending is not None:
            pending.result()  # re-raises the previous shard's error
        if journal.dataset_id is None:  # the first shard: its records fix the dataset's id
            journal.dataset_id = dataset_id(job.settings.fields, identity, current)
        pending = writer.submit(write_and_record, shard_index, current, next_source, next_tile,
                                list(journal.skipped))
        shard_index += 1
        current, current_size = [], 0

    def after(index: int, t: int) -> tuple[int, int]:  # the position after sample t of source index
        return (index + 1, 0) if counts is not None and t + 1 == counts[index] else (index, t + 1)

    outcomes: Iterator[tuple[list[bytes] | None, BaseException | None]] = iter(())
    try:
        tasks, metas = itertools.tee((job.tasks or (lambda p: _image_tasks(job, p)))(start))
        outcomes = job.run_tasks(job.encode, (args for _, _, args in tasks), workers, client)
        skipping = -1
        failures: list[str] = []
        for (index, first_tile, _), (records, error) in zip(metas, outcomes):
            src = job.sources[index]
            if index == skipping:
                continue
            if error is not None:
                if isinstance(error, FastloadError) and not isinstance(error, ImageReadError):
                    # a typed error (a schema mismatch) travels as it is; an unreadable image is handled below
                    raise error
                if not isinstance(error, ImageReadError):
                    raise PreprocessError(f"{src.relpath}: {type(error).__name__}: {error}") from error
                whole = first_tile == (start[1] if index == start[0] else 0)
                if counts is None or not (skip_bad and whole and job.whole_sources):
                    if not job.lists_bad_files:
                        raise PreprocessError(str(error)) from error
                    failures += [str(e) for e in each_error(error)]  # keep decoding, writing nothing more, to list
                    # every bad image
                    continue
                bar.write(f"skipping {src.relpath}: {error.reason}")
                journal.skipped.append({"index": index, "path": src.relpath, "error": error.reason})
                bar.update(counts[index] - first_tile)
                skipping = index
                continue
            assert records is not None
            if failures:
                continue
            for t, record in enumerate(records, start=first_tile):
                if job.limits.bytes and current and current_size + len(record) > job.limits.bytes:
                    flush(index, t)
                current.append(record)
                current_size += len(record)
                if job.limits.samples and len(current) == job.limits.samples:
                    flush(*after(index, t))
            bar.update(len(records))
        if failures:
            if pending is not None:
                pending.result()
            raise undecodable_error(failures, job.whole_sources)
        if current:
            flush(len(job.sources), 0)
        if pending is not None:
            pending.result()
    finally:
        try:
            close = getattr(outcomes, "close", None)
            if close is not None:
                close()  # shuts the worker pool down now, also on an error (a second Ctrl-C may end it)
        finally:
            writer.shutdown(wait=True)  # a shard already being written finishes and stays journaled


def _finish(job: WriteJob, journal: Journal, target: ShardTarget, group_samples: int) -> WriteResult:
    """Write the manifest of the shards the journal lists, delete the journal, and return what was written.

    ``group_samples``: the samples per group of a shuffled order, for the manifest's ``order``.
    """
    out_dir, counts = job.out_dir, job.tile_counts
    record_bytes = sum(f.nbytes for f in job.settings.fields)
    skipped_paths = {s["path"] for s in journal.skipped}
    extra = {**job.extra}
    shards = journal.shards()
    total = sum(s.count for s in shards)
    if counts is not None:
        sources_doc, first = [], 0
        for src, tiles in zip(job.sources, counts):
            if src.relpath in skipped_paths:
                continue
            sources_doc.append({"path": src.relpath, "first_sample": first, "samples": tiles})
            first += tiles
        if total != first:
            raise PreprocessError(f"{out_dir}: wrote {total} samples but the sources add up to {first}")
        extra["sources"] = sources_doc
    if "scenes" in extra:  # a scene skipped at encoding gave no tiles
        extra["scenes"] = [{**scene, "tiles": 0} if scene["path"] in skipped_paths else scene
                           for scene in extra["scenes"]]
    extra["skipped"] = job.probe_skipped + [{"path": s["path"], "error": s["error"]} for s in journal.skipped]
    extra["order"] = order_doc(job.order, job.seed, group_samples)
    labels = shard_labels_doc([e.get("labels") for e in journal.entries])
    if labels is not None:
        extra["shard_labels"] = labels
    ident = journal.dataset_id or dataset_id(job.settings.fields, _identity(job), [])
    manifest = Manifest(fields=list(job.settings.fields), shards=shards, provenance=job.provenance, extra=extra,
                        dataset_id=ident)
    if job.complete is not None:
        job.complete(manifest)
    target.clean_staged()  # a task's attempt that Dask ran again, or one given up on a replan
    write_json_atomic(out_dir / MANIFEST_NAME, manifest.to_json())
    journal.path.unlink(missing_ok=True)
    used = [src for src in job.sources if src.relpath not in skipped_paths]
    files = hasattr(job.settings, "data_dir")  # image sources (not a dataset's samples)
    source_bytes = sum(source_stat(job.settings, s.relpath)[0] for s in used) if files else 0
    return WriteResult(manifest, source_bytes, manifest.total * record_bytes)
