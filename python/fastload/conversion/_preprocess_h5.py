"""Planning ``preprocess_tiles --h5-dataset``: HDF5 files of stacked samples, written in row chunks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..format._dtypes import dtype_name
from ..format._record import Field
from ._dataset_writer import PreprocessError, Task, WriteJob
from ._hdf5 import StackInfo, StackSettings, probe_stack
from ._images import ImageReadError
from ._parallel import ordered_map
from ._preprocess_plan import SplitPlan, listed
from ._sources import Source, SourceError
from ._write_order import picks_of


def probe_stacks(data_dir: Path, sources: list[Source], dataset: str, labels: str | None, workers: int,
                 skip_bad: bool, client: Any = None) -> tuple[dict[str, StackInfo], list[dict]]:
    """Probe every HDF5 file (in ``workers`` processes, or on a Dask ``client``'s cluster).

    Return infos by path and the unreadable ones (all listed in one error).
    """
    others = [s.relpath for s in sources if Path(s.relpath).suffix.lower() not in (".h5", ".hdf5")]
    if others:
        raise SourceError(f"--h5-dataset reads only .h5/.hdf5 files; move these out of {data_dir}:{listed(others)}")
    infos: dict[str, StackInfo] = {}
    bad: list[dict] = []
    args = ((data_dir / s.relpath, dataset, labels) for s in sources)
    for src, (info, err) in zip(sources, ordered_map(probe_stack, args, workers, client=client)):
        if isinstance(err, ImageReadError):
            bad.append({"path": src.relpath, "error": err.reason})
        elif err is not None:
            raise err
        else:
            assert info is not None
            infos[src.relpath] = info
    if bad and not skip_bad:
        raise PreprocessError(f"{len(bad)} unusable HDF5 file(s); fix or remove them, or pass --skip-bad:"
                              + listed([f"{data_dir / b['path']}: {b['error']}" for b in bad]))
    for b in bad:
        print(f"skipping {b['path']}: {b['error']}", file=sys.stderr)
    if not infos:
        raise PreprocessError(f"{data_dir}: no usable HDF5 file")
    ref_path, ref = next(iter(infos.items()))
    odd = [f"{p} ({i.dtype} {list(i.shape)})" for p, i in infos.items() if (i.shape, i.dtype) != (ref.shape, ref.dtype)]
    if odd:
        raise PreprocessError(f"HDF5 samples differ in shape or dtype: {ref_path} has {ref.dtype} {list(ref.shape)}, "
                              f"these differ:{listed(odd)}")
    return infos, bad


def stack_plan(name: str, sources: list[Source], infos: dict[str, StackInfo]) -> SplitPlan:
    """Return the plan of one split: every usable file and its sample count."""
    usable = [s for s in sources if s.relpath in infos]
    return SplitPlan(name, usable, [infos[s.relpath].count for s in usable], [], {s.relpath for s in sources})


def stack_fields(info: StackInfo, dtype: str | None, codec: str, options: dict, labelled: bool) -> tuple[Field, ...]:
    """Return the schema: the samples as stored (optionally cast) and an int64 label."""
    image = Field("image", dtype or dtype_name(info.dtype), info.shape, codec, options)
    return (image, Field("label", "int64", ())) if labelled else (image,)


def stack_job(job: WriteJob, settings: StackSettings, infos: dict[str, StackInfo]) -> WriteJob:
    """Give a WriteJob the tasks and encode function that read its files in row chunks."""
    def tasks(start: tuple[int, int]) -> Iterator[Task]:
        for i in range(start[0], len(job.sources)):
            src = job.sources[i]
            info = infos[src.relpath]
            for a in range(start[1] if i == start[0] else 0, info.count, info.rows):
                yield (i, a, (settings, src.relpath, src.label, a, min(a + info.rows, info.count)))

    from ._hdf5 import encode_stack_picked, encode_stack_rows

    def gather(sources: np.ndarray, samples: np.ndarray) -> tuple:
        picks = [(src.relpath, src.label, rows, slots)
                 for src, _, rows, slots in picks_of(job.sources, sources, samples)]
        return (settings, picks, len(sources))

    # No pieces: a stack's rows are read in chunks, and a chunk that fails mid-file must fail as in a
    # one-machine run (not skip the whole file), so the driver writes its shards. A shuffled order
    # reads the rows of a task from each file it touches (``gather``), and may be planned.
    job.tasks, job.encode, job.unit, job.piece = tasks, encode_stack_rows, "sample", None
    job.gather, job.gather_encode = gather, encode_stack_picked
    return job
