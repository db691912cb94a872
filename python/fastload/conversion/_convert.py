"""``write_dataset``: any dataset (torch, HuggingFace, an iterable of samples) into shards.

It goes through the writer of ``preprocess_tiles`` (``_dataset_writer``): the
same shards, journal, ``resume`` and manifest, byte-identical for any number
of workers. Samples are taken in fixed chunks (about 8 MB each, whatever the
worker count), so memory stays bounded: ``4 * workers`` chunks in flight, one
shard filling and one being written.

- A map-style dataset (``__len__`` and ``__getitem__``: a torch ``Dataset``,
  ``datasets.Dataset``) is handed once to each worker process (forked, so it
  need not pickle), which reads, converts, checks and encodes its chunks.
- An iterable (a torch ``IterableDataset``, ``datasets.IterableDataset``, a
  generator) is read in this process, in order; workers encode the chunks.
  Resuming one re-reads it from the start and skips what is written, so its
  order must be the same on every pass.

With ``client`` (a Dask ``distributed.Client``) the chunks are encoded on its
cluster instead of local processes (``_dask_map``): a map-style dataset is
pickled (cloudpickle) and held by one task that every task depends on; this process still
writes every shard, so the bytes are the same.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError, SchemaMismatchError
from ..format._codecs import default_options
from ..format._manifest import MANIFEST_NAME, Manifest
from ..format._record import Field, RecordEncoder
from ..format._scenes import (
    SCENE_FIELD,
    SCENES_KEY,
    build_scenes,
    check_scene_indices,
    check_windows,
    read_scene_fields,
    scene_items,
)
from ..storage import is_remote
from ..storage._publish import read_remote_manifest
from ._array_writer import check_codecs, plan_field
from ._auto import MAX_SAMPLES, PREFERENCES, Choice, sample_indices
from ._cli_options import ZSTD_LEVELS, UsageError, parse_size
from ._dask_map import check_client, describe
from ._dataset_writer import ShardLimits, Task, WriteJob
from ._dataset_writer import write_dataset as write_job
from ._journal import PROGRESS_NAME, drop_finished_journal
from ._output_dir import foreign_entry, records_a_run
from ._remote_output import begin_staged_run, check_resume_options_at, direct_target, publish_output, stage_output
from ._run_record import check_resume_options
from ._samples import check_names, check_sample, check_sample_bytes, sample_arrays
from ._shard_targets import RemoteShards
from ._sources import Source
from ._write_order import GROUP_BYTES, check_order, check_seed

CHUNK_BYTES = 8 << 20
_worker: dict[str, Any] = {}  # per worker process: the map-style dataset and its schema

MAX_WORKERS = 1024  # the most encoding processes write_dataset starts


@dataclass(frozen=True)
class _Settings:
    fields: tuple[Field, ...]
    names: tuple[str, ...] | None


def _init_worker(dataset: Any, settings: _Settings) -> None:
    _worker["dataset"], _worker["settings"] = dataset, settings


def _encode_range(start: int, stop: int) -> list[bytes]:
    dataset, settings = _worker["dataset"], _worker["settings"]
    encoder = RecordEncoder(settings.fields)
    return [encoder.encode(check_sample(sample_arrays(dataset[i], i, settings.names), settings.fields, i))
            for i in range(start, stop)]


def _encode_indices(indices: list[int]) -> list[bytes]:
    """Return the records of samples ``indices`` of the worker's map-style dataset, in that order (a shuffled write)."""
    dataset, settings = _worker["dataset"], _worker["settings"]
    encoder = RecordEncoder(settings.fields)
    return [encoder.encode(check_sample(sample_arrays(dataset[i], i, settings.names), settings.fields, i))
            for i in indices]


def _gather_indices(sources: np.ndarray, samples: np.ndarray) -> tuple[list[int]]:
    """Return the arguments of ``_encode_indices`` for source-order samples (a map-style dataset is one source)."""
    return (samples.tolist(),)


def _range_piece(source: int, first: int, stop: int) -> tuple[int, int]:
    """Return the arguments of ``_encode_range`` for samples ``first:stop`` (a map-style dataset is one source)."""
    return (first, stop)


def _encode_arrays(fields: tuple[Field, ...], samples: list[dict]) -> list[bytes]:
    encoder = RecordEncoder(fields)
    return [encoder.encode(s) for s in samples]


def _is_map_style(source: Any) -> bool:
    if "torch" in sys.modules:
        import torch

        if isinstance(source, torch.utils.data.IterableDataset):
            return False
    if type(source).__name__ == "IterableDataset":  # datasets.IterableDataset, without importing datasets
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, (dict, str))


def _prepare(out: Path, overwrite: bool, resume: bool) -> None:
    if not out.exists() or not any(out.iterdir()):
        return
    foreign = foreign_entry(out)
    if resume:
        if foreign is not None and not records_a_run(out):
            raise FileExistsError(f"{out}: not a fastload dataset (no {MANIFEST_NAME} or {PROGRESS_NAME}, and "
                                  f"{foreign.relative_to(out)}, which no run writes); refusing to resume into it")
        return
    if not overwrite:
        raise FileExistsError(f"{out}: exists and is not empty (pass overwrite=True, or resume=True to continue)")
    if foreign is not None:
        raise FileExistsError(f"{out}: not a fastload dataset ({foreign.relative_to(out)} is not a file a run "
                              "writes); refusing to overwrite it")
    shutil.rmtree(out)


def write_dataset(source: Any, out_dir: str | os.PathLike, *, codec: str | Mapping[str, str] = "raw",
                  level: int | None = None, samples_per_shard: int | None = None, shard_size: str | None = "256MB",
                  workers: int = 1, resume: bool = False, overwrite: bool = False,
                  names: Sequence[str] | None = None, progress: bool = True, layout: str | None = None,
                  quality: int | None = None, subsampling: str | None = None, prefer: str = "balanced",
                  lossy_ok: bool = False, client: Any = None, storage_options: Mapping[str, Any] | None = None,
                  cache_dir: str | os.PathLike | None = None, order: str | None = None, seed: int = 0,
                  scenes: Sequence[Mapping[str, Any] | str | os.PathLike[str]] | None = None) -> Manifest:
    """Write every sample of ``source`` as a shard dataset in ``out_dir`` and return its manifest.

    ``out_dir`` may be a URL of object storage (``s3://``, ``gs://``, ``az://``; needs
    ``fastload[remote]``): the dataset is written into a staging directory under ``cache_dir``
    (default: fastload's cache) and then published, shards first and the manifest last, so a
    reader never sees it half written (docs/remote.md, "Writing to object storage").
    ``storage_options`` as for ``ShardLoader``. A URL that already holds a dataset needs
    ``overwrite=True`` (or ``resume=True``).

    ``source``: a map-style or iterable torch ``Dataset``, a HuggingFace
    ``datasets.Dataset`` or ``IterableDataset``, or any iterable of samples. A
    sample is a dict or a tuple (fields ``"0"``, ``"1"``, ... or ``names``) of
    numpy arrays, tensors, PIL images or scalars. The schema comes from the
    first sample; a later sample that differs raises SchemaMismatchError
    naming its index and field. Shards close at ``samples_per_shard`` samples
    and/or ``shard_size`` bytes (``"512MB"``). Codecs as ``write_arrays``
    and ``preprocess_tiles``: ``codec`` is one codec for every array (scalars
    stay raw) or a mapping per field (fields not named are raw); ``level``
    (zstd, lz4, png), ``layout`` ('chw' or 'hwc': 3-D fields under png or
    jpeg, guessed when only one reading has 1 to 4 channels), ``quality`` and
    ``subsampling`` (jpeg); ``"auto"`` tries the codecs that fit on up to 64
    samples spread over the dataset (the first ones of an iterable), picks by
    ``prefer``, jpeg only with ``lossy_ok``, prints its choice (with
    ``progress``) and records it in the manifest's ``provenance.codec_choice``.
    The output is byte-identical for any
    ``workers``; ``resume=True`` continues an interrupted write (ValueError
    when the options differ from the recorded ones).

    ``order``: ``"shuffled"`` writes the samples in a seeded random order across the shards
    (``seed``; a pure function of ``seed`` and the length, recorded in the manifest's ``order``),
    so every shard mixes the whole dataset and ``ShardLoader(shuffle_window=...)`` sees every
    class in a window; ``"source"`` writes them in the dataset's own order. The default (None)
    is ``"shuffled"`` for a map-style dataset and ``"source"`` for an iterable, which can only be
    read in its order (``order="shuffled"`` with one raises ArgumentError: shuffle it first, e.g.
    ``datasets.IterableDataset.shuffle``). A shuffled write reads the samples of each task by
    index, so ``dataset[i]`` should be cheap at any ``i``.

    ``client``: a Dask ``distributed.Client`` (extra ``fastload[dask]``): the
    samples are read and encoded on its cluster (a map-style dataset must
    pickle; paths it opens must be the same on every worker) and this process
    writes the shards, byte-identical to a one-machine run for any number of
    Dask workers and any task retries (docs/dask.md). ``workers`` must then
    stay 1 (ArgumentError otherwise). ClusterError when Dask's
    ``distributed`` is not installed or the scheduler is lost.

    ``scenes``: where the samples were cut from, recorded in the manifest's ``scenes`` for
    ``fastload.Mosaic``, as ``write_arrays(scenes=...)``: dicts as the manifest holds them or TIFF
    paths. With a ``scene`` field, ``tiles`` is counted from the written samples, which are read back
    once written (their ``scene`` and ``window`` fields) and checked to lie in their scenes; a sample
    that does not leaves the shards without a manifest (ArgumentError naming its position). Not with
    ``client`` writing to object storage (the shards never reach this machine to be counted).
    """
    options = dict(codec=codec, level=level, samples_per_shard=samples_per_shard, shard_size=shard_size,
                   workers=workers, resume=resume, names=names, progress=progress, layout=layout, quality=quality,
                   subsampling=subsampling, prefer=prefer, lossy_ok=lossy_ok, client=client, order=order, seed=seed,
                   scenes=scenes)
    if isinstance(out_dir, str) and is_remote(out_dir):
        staging, storage = stage_output(out_dir, storage_options, cache_dir, overwrite, resume)
        if staging is None:  # resume=True, and the URL holds the finished dataset: its options are checked
            return _write(source, out_dir, overwrite=False, target=None, complete_at=(out_dir, storage), **options)
        target = direct_target(out_dir, storage, client)  # on a cluster the tasks upload the shards themselves
        manifest = _write(source, staging, overwrite=False, target=target,
                          begin=functools.partial(begin_staged_run, staging, overwrite), **options)
        publish_output(staging, out_dir, storage, progress)
        return manifest
    if storage_options is not None or cache_dir is not None:
        raise ArgumentError(f"storage_options and cache_dir are for an output in object storage (s3://, gs://, "
                            f"az://), not the local path {os.fspath(out_dir)!r}")
    return _write(source, out_dir, overwrite=overwrite, target=None, **options)


def _write(source: Any, out_dir: str | os.PathLike, *, codec: str | Mapping[str, str], level: int | None,
           samples_per_shard: int | None, shard_size: str | None, workers: int, resume: bool, overwrite: bool,
           names: Sequence[str] | None, progress: bool, layout: str | None, quality: int | None,
           subsampling: str | None, prefer: str, lossy_ok: bool, client: Any,
           target: RemoteShards | None, order: str | None, seed: int,
           scenes: Sequence[Any] | None = None, complete_at: tuple[str, Any] | None = None,
           begin: Callable[[], None] | None = None) -> Manifest:
    """``write_dataset`` into a local directory; the shards go to ``target`` when given (a URL's, on a cluster).

    ``complete_at``: (URL, storage options) of a finished dataset that ``resume`` finds there with nothing
    staged: the arguments are checked, then the options against those it records, and its manifest is
    returned. ``begin``: called once the arguments are checked, before the directory is prepared (a
    URL's staging directory: ``begin_staged_run``).
    """
    names = check_names(names)
    items = scene_items(scenes, "write_dataset", ArgumentError) if scenes is not None else None
    check_codecs(codec, None)  # the field names are checked once the first sample gives them
    used = {codec} if isinstance(codec, str) else set(codec.values())
    if level is not None and used <= {"raw"}:
        raise ArgumentError(f"level {level} is not valid for codec 'raw' (it takes no level)")
    zstd = sorted(used & {"zstd", "zstd-shuffle"})
    if level is not None and zstd and not ZSTD_LEVELS[0] <= level <= ZSTD_LEVELS[1]:
        raise ArgumentError(f"level {level} is not valid for codec {zstd[0]!r} (zstd codecs take 1 to 22)")
    if prefer not in PREFERENCES:
        raise ArgumentError(f"prefer must be one of {PREFERENCES}, not {prefer!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers > MAX_WORKERS:
        raise ArgumentError(f"workers must be an integer in [1, {MAX_WORKERS}], not {workers!r}")
    if workers < 1 or (samples_per_shard is not None and samples_per_shard < 1):
        raise ArgumentError(f"workers and samples_per_shard must be positive, not {workers} and {samples_per_shard}")
    if client is not None:
        check_client(client)
        if workers != 1:
            raise ArgumentError(f"workers={workers} with client=: the Dask cluster's workers encode; "
                                "leave workers at 1")
    try:
        shard_bytes = parse_size(shard_size) if shard_size is not None else None
    except Exception as err:
        raise ArgumentError(f"shard_size: {err}") from None
    if shard_bytes is None and samples_per_shard is None:
        raise ArgumentError("give samples_per_shard or shard_size (or both)")
    out = Path(out_dir)
    map_style = _is_map_style(source)
    if order is not None:
        check_order(order)
    if order == "shuffled" and not map_style:
        raise ArgumentError(f"order='shuffled': a {type(source).__name__} is read in its own order only (an "
                            "iterable); shuffle it before (e.g. datasets.IterableDataset.shuffle), or pass "
                            "order='source'")
    order = order or ("shuffled" if map_style else "source")
    seed = check_seed(seed)
    if map_style and hasattr(source, "with_format") and type(source).__module__.startswith("datasets"):
        source = source.with_format("numpy")
    single = isinstance(codec, str) and codec != "auto"
    options = {"codec": codec if isinstance(codec, str) else dict(sorted(codec.items())),
               "level": default_options(codec, level).get("level") if single else level,  # type: ignore[arg-type]
               "samples_per_shard": samples_per_shard, "shard_size": shard_bytes,
               "names": list(names) if names is not None else None, "chunk_bytes": CHUNK_BYTES}
    if order == "shuffled":  # a source-order write records no order, as writes before order= did (resumable)
        options["order"] = order
        options["seed"] = seed
        options["order_group_bytes"] = GROUP_BYTES  # fixes the groups (_write_groups): a resume reproduces them
    image_options = {"layout": layout, "quality": quality, "subsampling": subsampling,
                     "prefer": prefer if "auto" in used else None, "lossy_ok": lossy_ok or None}
    options.update({k: v for k, v in image_options.items() if v is not None})  # recorded only when they matter
    try:
        if complete_at is not None:
            check_resume_options_at(*complete_at, options)
            return read_remote_manifest(*complete_at)
        if resume:
            check_resume_options(out, options)
    except UsageError as err:
        raise ArgumentError(str(err).replace("--resume", "resume=True")) from None
    if begin is not None:
        begin()
    _prepare(out, overwrite, resume)
    if resume and (out / MANIFEST_NAME).exists():
        from ..format._manifest import load_manifest

        manifest = load_manifest(out)  # checked before the journal goes: a damaged manifest keeps it
        drop_finished_journal(out)
        return manifest

    tuple_names = tuple(names) if names is not None else None
    if map_style:
        count: int | None = len(source)
        if not count:
            raise ArgumentError(f"{type(source).__name__}: the dataset is empty; nothing to write")
        first = sample_arrays(source[0], 0, tuple_names)
        rest: Iterator[Any] = iter(())
        head: list[dict[str, Any]] = []
    else:
        count = None
        iterator = iter(source)
        try:
            first = sample_arrays(next(iterator), 0, tuple_names)
        except StopIteration:
            raise ArgumentError(f"{type(source).__name__}: the iterable is empty; nothing to write") from None
        rest = iterator
        head = []
    if "auto" in used and not map_style:  # auto measures the first samples of a stream, kept to be written
        wanted = len(sample_indices(MAX_SAMPLES, max(1, sum(a.nbytes for a in first.values()))))
        head = [sample_arrays(s, i, tuple_names) for i, s in enumerate(itertools.islice(rest, wanted - 1), 1)]
    fields, choices = _plan_fields(first, codec, level, layout, quality, subsampling, prefer, lossy_ok,
                                   lambda: _auto_samples(source, count, first, head, tuple_names))
    check_sample_bytes(fields, "write_dataset")
    counted = items is not None and SCENE_FIELD in first  # tiles counted from the samples once written
    if counted and target is not None:
        raise ArgumentError("write_dataset: scenes= with a 'scene' field, written by a Dask cluster to object "
                            "storage: the shards never reach this machine to be counted; write locally, or give "
                            "the scenes without the field")
    extra = {SCENES_KEY: [s.to_json() for s in build_scenes(items, None, "write_dataset", ArgumentError)]} if (
        items is not None and not counted) else {}
    for choice in choices.values():
        if progress:
            print(choice.summary())
    sample_bytes = max(1, sum(f.nbytes for f in fields))
    chunk = max(1, CHUNK_BYTES // sample_bytes)
    settings = _Settings(fields, tuple_names)
    kind = f"{type(source).__module__}.{type(source).__qualname__}"

    def map_tasks(start: tuple[int, int]) -> Iterator[Task]:
        assert count is not None
        if start[0] > 0:
            return
        for a in range(start[1], count, chunk):
            yield (0, a, (a, min(a + chunk, count)))

    def iterable_tasks(start: tuple[int, int]) -> Iterator[Task]:
        if start[0] > 0:  # every sample is written already
            return
        samples = itertools.chain([first], head, (sample_arrays(s, i, tuple_names)
                                                  for i, s in enumerate(rest, 1 + len(head))))
        for _ in itertools.islice(samples, start[1]):  # written before the interruption
            pass
        index, pending = start[1], []  # type: tuple[int, list[dict[str, Any]]]
        for arrays in samples:
            pending.append(check_sample(arrays, fields, index + len(pending)))
            if len(pending) == chunk:
                yield (0, index, (fields, pending))
                index, pending = index + chunk, []
        if pending:
            yield (0, index, (fields, pending))

    provenance = {"tool": "fastload.write_dataset", "source": kind, "options": options,
                  "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if choices:
        provenance["codec_choice"] = {name: choice.to_json() for name, choice in choices.items()}
    job = WriteJob(out, settings, [Source(kind)], [count] if count is not None else None, [],
                   ShardLimits(samples_per_shard, shard_bytes), provenance,
                   tasks=map_tasks if map_style else iterable_tasks,
                   encode=_encode_range if map_style else _encode_arrays,
                   stamp=f"{kind}|{count}|{[f.to_json() for f in fields]}",
                   worker_init=(_init_worker, (source, settings)) if map_style else None, unit="sample",
                   piece=_range_piece if map_style else None, piece_samples=chunk, target=target, order=order,
                   seed=seed, gather=_gather_indices if map_style else None,
                   gather_encode=_encode_indices if map_style else None, sample_sources=map_style, extra=extra,
                   complete=functools.partial(_record_scenes, out, items) if counted else None)
    if client is not None and progress:
        print(describe(client))
    return write_job(job, workers, skip_bad=False, resume=resume, progress=progress, client=client).manifest


def _record_scenes(out: Path, items: Any, manifest: Manifest) -> None:
    """Count each scene's samples in the written shards, check their windows, record ``scenes`` in ``manifest``.

    Called before the manifest is written: a sample outside its scene raises, and the shards stay
    without a manifest (an incomplete dataset).
    """
    scene, window = read_scene_fields(out, manifest)
    try:
        index = check_scene_indices(scene, len(items), 0, "write_dataset", ArgumentError)
        scene_list = build_scenes(items, np.bincount(index, minlength=len(items)).tolist(), "write_dataset",
                                  ArgumentError)
        check_windows(scene_list, index, window, 0, "write_dataset", ArgumentError)
    except ArgumentError as err:
        raise ArgumentError(f"{err} (sample numbers are positions in {out}; no manifest was written)") from None
    manifest.extra[SCENES_KEY] = [s.to_json() for s in scene_list]



def _plan_fields(first: dict[str, np.ndarray], codec: str | Mapping[str, str], level: int | None,
                 layout: str | None, quality: int | None, subsampling: str | None, prefer: str, lossy_ok: bool,
                 auto_samples: Callable[[], list[dict[str, np.ndarray]]],
                 ) -> tuple[tuple[Field, ...], dict[str, Choice]]:
    """Return the schema of the first sample under ``codec`` (as ``write_arrays``) and auto's choices.

    A single codec applies to the arrays and leaves scalars raw; a mapping
    names each field's codec (others raw). ``auto_samples`` is called once,
    only when a field is ``"auto"``.
    """
    if not first:
        raise SchemaMismatchError("sample 0 has no fields")
    if not isinstance(codec, str):
        check_codecs(codec, list(first))
    fields, choices, sampled = [], {}, None
    for name, arr in first.items():
        field_codec = codec.get(name, "raw") if not isinstance(codec, str) else ("raw" if arr.ndim == 0 else codec)
        stack = arr[None]
        if field_codec == "auto":
            sampled = sampled if sampled is not None else auto_samples()
            stack = np.stack([s[name] for s in sampled if s[name].shape == arr.shape and s[name].dtype == arr.dtype])
        try:
            field, choice = plan_field(name, stack, field_codec, level, layout, quality, subsampling, prefer, lossy_ok)
        except SchemaMismatchError:
            raise
        except ValueError as err:
            raise SchemaMismatchError(f"sample 0 field {name!r}: {err}") from None
        fields.append(field)
        if choice is not None:
            choices[name] = choice
    return tuple(fields), choices


def _auto_samples(source: Any, count: int | None, first: dict[str, np.ndarray], head: list[dict[str, np.ndarray]],
                  names: tuple[str, ...] | None) -> list[dict[str, np.ndarray]]:
    """Return the samples ``codec="auto"`` measures: spread over a map-style dataset, the first of a stream."""
    if count is None:
        return [first, *head]
    picks = sample_indices(count, max(1, sum(a.nbytes for a in first.values())))
    return [first if i == 0 else sample_arrays(source[int(i)], int(i), names) for i in picks]
