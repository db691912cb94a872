"""Shards written by the tasks themselves, on a Dask cluster: a task per planned shard, the driver journals them.

Used when the shard boundaries can be planned up front (``_shard_plan``): each task encodes the
samples of one shard, writes it whole to the output (a hidden name in a shared directory, or an
upload to object storage: ``_shard_targets``) and returns its entry; no record travels to the
driver. The driver takes the entries in order, checks and commits each shard (renamed into place in
a directory), journals it, and writes the manifest last
(``_dataset_writer``). The first shard is written by the driver beforehand, as in a one-machine run:
its records fix the dataset's id, to which every record is bound.

A file that fails to decode gets the one-machine policy. Without ``--skip-bad`` the run goes on
encoding (writing nothing more to the journal) to name every bad file, then raises. With it, the file
is dropped and the shards are planned again from the failed one on: the same shards, so the same
bytes, as a one-machine run that skipped it. A task that a worker's death interrupted is run again
by Dask; its shard is written again whole, with the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._progress import Progress
from ..errors import FastloadError, ImageReadError, PreprocessError
from ._images import undecodable_error
from ._journal import Journal
from ._picks import each_error
from ._shard_labels import label_histogram
from ._shard_plan import Piece, PlannedShard, plan_shards
from ._shard_targets import Binding, ShardTarget, Staged
from ._shard_writer import dataset_id

# A piece that failed to decode: (its position in the shard's pieces, the reason, the whole message).
Failure = tuple[int, str, str]


def write_planned_shard(target: ShardTarget | None, encode: Callable[..., list[bytes]], pieces: Sequence[tuple],
                        names: Sequence[str], expected: int, max_bytes: int | None, index: int,
                        binding: Binding) -> tuple[Staged | None, list[Failure], list[int] | None]:
    """Encode the pieces of shard ``index`` (``encode(*args)`` each) and stage the shard whole for the driver.

    Runs in a task; returns the staged shard, the failures and the shard's count per label
    (``_shard_labels.label_histogram``). When a piece's file does not decode (ImageReadError)
    nothing is written and the failures are returned: the driver decides. A typed error is raised
    as it is; another is raised as a PreprocessError naming the piece's source (``names``), as a
    one-machine run names it.
    Without a ``target`` the pieces are only encoded (to find the bad files) and nothing is written.
    """
    records: list[bytes] = []
    failures: list[Failure] = []
    for position, args in enumerate(pieces):
        try:
            got = encode(*args)
        except ImageReadError as err:
            failures += [(position, e.reason, str(e)) for e in each_error(err)]
            continue
        except FastloadError:
            raise
        except Exception as err:
            raise PreprocessError(f"{names[position]}: {type(err).__name__}: {err}") from err
        records += got
    if failures:
        return None, failures, None
    if len(records) != expected:
        raise PreprocessError(f"shard {index}: its sources gave {len(records)} samples, {expected} were planned "
                              "(did a source change since it was probed?)")
    total = sum(len(r) for r in records)
    if max_bytes and len(records) > 1 and total > max_bytes:  # the one-machine writer would have closed it sooner
        raise PreprocessError(f"shard {index}: {total} bytes of records, more than the shard size of {max_bytes} "
                              "that its plan assumed they could not reach (a fastload bug: please report it)")
    labels = label_histogram(binding[0], records)
    return (target.stage(index, records, binding) if target is not None else None), [], labels


def write_first_planned(job: Any, journal: Journal, target: ShardTarget, counts: list[int], capacity: int,
                        skip_bad: bool, workers: int, client: Any, bar: Progress, identity: str) -> bool:
    """Write the first planned shard here, from tasks that encode exactly its samples; return whether it is written.

    Its records fix the dataset's id (``_shard_writer.dataset_id``), so they come back to this
    process, which writes it. Its pieces are split into tasks of at most ``job.piece_samples``
    samples, so that every worker helps. A file that fails to decode is skipped with ``skip_bad``
    (the shard is planned again without it); without, False is returned and nothing is written:
    the caller falls back to the one-machine order, which names every bad file.
    """
    while True:
        skipped = {s["index"] for s in journal.skipped}
        effective = [0 if i in skipped else n for i, n in enumerate(counts)]
        plan = plan_shards(effective, (0, 0), 0, capacity)
        if not plan:
            return True  # every source skipped: the caller writes an empty dataset
        shard = plan[0]
        pieces = list(_split(shard.pieces, job.piece_samples))
        outcomes = job.run_tasks(job.encode, (job.piece(*p) for p in pieces), workers, client)
        records: list[bytes] = []
        try:
            for (source, first, _), (got, error) in zip(pieces, outcomes):
                relpath = job.sources[source].relpath
                if error is None:
                    assert got is not None
                    records += got
                    continue
                if isinstance(error, FastloadError) and not isinstance(error, ImageReadError):
                    raise error
                if not isinstance(error, ImageReadError):
                    raise PreprocessError(f"{relpath}: {type(error).__name__}: {error}") from error
                if not job.lists_bad_files:  # a dataset's sample, as in a one-machine run
                    raise PreprocessError(str(error)) from error
                if not (skip_bad and job.whole_sources):
                    return False
                assert first == 0  # the first shard holds its sources from their first sample
                bar.write(f"skipping {relpath}: {error.reason}")
                journal.skipped.append({"index": source, "path": relpath, "error": error.reason})
                bar.update(effective[source])
                break
            else:
                if len(records) != shard.count:
                    raise PreprocessError(f"shard 0: its sources gave {len(records)} samples, {shard.count} were "
                                          "planned (did a source change since it was probed?)")
                journal.dataset_id = dataset_id(job.settings.fields, identity, records)
                info = target.write(0, records, (job.settings.fields, journal.dataset_id))
                journal.record(info, shard.next_source, shard.next_tile, list(journal.skipped),
                               label_histogram(job.settings.fields, records))
                bar.update(info.count)
                return True
        finally:
            outcomes.close()  # cancels the tasks in flight


def _split(pieces: Sequence[Piece], most: int | None) -> Iterator[Piece]:
    """Yield ``pieces`` cut into pieces of at most ``most`` samples (None: as they are)."""
    for source, first, stop in pieces:
        step = most or (stop - first)
        for a in range(first, stop, max(1, step)):
            yield (source, a, min(stop, a + step))


def write_planned(job: Any, journal: Journal, target: ShardTarget, counts: list[int], capacity: int,
                  skip_bad: bool, workers: int, client: Any, bar: Progress, delay: float) -> None:
    """Write every shard after the journal's last one through tasks (see the module).

    The tasks run on ``client``'s cluster, or in ``workers`` local processes without one. After a
    file failed to decode without ``skip_bad``, the tasks of the shards after it only encode (to
    name every bad file) and write nothing.
    """
    assert journal.dataset_id is not None, "the first shard is written before the planned ones"
    binding: Binding = (job.settings.fields, journal.dataset_id)
    target.open_staging()
    skipped = {s["index"] for s in journal.skipped}
    failures: list[str] = []
    failed_at = -1  # the first shard with a bad file (not skipped): the later ones are only encoded
    while True:
        effective = [0 if i in skipped else n for i, n in enumerate(counts)]
        shards = [s for s in plan_shards(effective, journal.position(), len(journal.entries), capacity)
                  if s.index > failed_at]
        if not shards:
            break
        writes = target if not failures else None
        args = ((writes, job.encode, [job.piece(*p) for p in s.pieces], _names(job, s), s.count, job.limits.bytes,
                 s.index, binding) for s in shards)
        outcomes = job.run_tasks(write_planned_shard, args, workers, client)
        again = False
        try:
            for shard, (result, error) in zip(shards, outcomes):
                if error is not None:
                    if isinstance(error, FastloadError):
                        raise error
                    raise PreprocessError(f"shard {shard.index} ({', '.join(_names(job, shard))}): "
                                          f"{type(error).__name__}: {error}") from error
                assert result is not None
                staged, bad, labels = result
                if bad and (failures or not (skip_bad and job.whole_sources) or not job.lists_bad_files):
                    if not job.lists_bad_files:  # a dataset's sample: the first error ends the run, as locally
                        raise PreprocessError(bad[0][2])
                    first_failure = not failures
                    failures += [m for _, _, m in bad if m not in failures]
                    if first_failure:  # go on to name every bad file, the tasks writing nothing more
                        failed_at, again = shard.index, True
                        break
                    continue
                if bad:
                    for position, reason, message in bad:
                        source, first, _ = shard.pieces[position]
                        if first != 0:  # part of it is in a shard already written: it cannot be left out
                            raise PreprocessError(message)
                        relpath = job.sources[source].relpath
                        bar.write(f"skipping {relpath}: {reason}")
                        journal.skipped.append({"index": source, "path": relpath, "error": reason})
                        skipped.add(source)
                        bar.update(effective[source])
                    again = True  # the shards from this one on hold other samples now
                    break
                if failures:
                    continue
                assert staged is not None
                target.commit(staged)
                journal.record(staged[0], shard.next_source, shard.next_tile, list(journal.skipped), labels)
                bar.update(staged[0].count)
                if delay:
                    time.sleep(delay)
        finally:
            outcomes.close()  # cancels the tasks in flight
        if not again:
            break
    if failures:
        raise undecodable_error(failures, job.whole_sources)


def _names(job: Any, shard: PlannedShard) -> list[str]:
    """Return the sources of a shard's pieces, for messages."""
    return [job.sources[p[0]].relpath for p in shard.pieces]
