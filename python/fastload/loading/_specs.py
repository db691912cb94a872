"""What a ``ShardLoader`` is asked for, grouped by concern: one small typed spec each, validated on its own.

``ShardLoader.__init__`` keeps the flat keyword surface users write, as with
``DataLoader``; it only builds these specs and composes them. A new option
touches one spec (and its tests, tests/test_specs.py), not the constructor:

- :class:`SourceSpec`: what is read (a path, a split of a root, a dataset, a
  subset; which fields; checksums; shards outside the directory). The
  object-storage options (a cache directory, its bound, storage options) will
  join it.
- :class:`OrderSpec`: batches and their order (batch size, shuffle, seed,
  drop_last) and the sampling policy (subset indices, sample weights, mixtures).
- :class:`DistributionSpec`: which rank reads what (rank, world size, even batches).
- :class:`DeviceSpec`: where batches land (device, pinned memory).
- :class:`ReadSpec`: who reads and how far ahead (backend, threads, prefetch,
  the torch backend's workers and start method).

Transforms and the output form are ``Augment`` (``_augment.py``), already one
object of their own.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..format._splits import resolve_dataset_path
from ..storage import is_remote
from ._compose import ConcatShardDataset
from ._dataset import ShardDataset
from ._device import resolve_device
from ._distributed import Topology, _positive_int
from ._native_backend import NATIVE_IMPORT_ERROR
from ._sampling_setup import make_sampling
from ._subset import ShardSubset

MAX_THREADS = 1024  # the most native threads, and batches in flight, a loader takes
BACKEND_ENV = "FASTLOAD_BACKEND"
Auto = Literal["auto"]

PINNED_PREFETCH_BYTES = 32 * 2**20
# Plain batches in flight with more threads than cores: at least this many bytes (and this many
# batches at most). A worker descheduled in the middle of a chunk holds back the oldest batch; the
# others keep decoding only while later batches are queued, so the queue must hold more work than
# a scheduler time slice (small records: 200 us of work per batch).
MIN_PREFETCH_BYTES = 64 * 2**20
MAX_AUTO_PREFETCH = 64
# Plain batches in flight with threads within the cores: about this many bytes when batches are small
# (and this many batches at most). A consumer faster than the workers sleeps until three quarters of
# the window are ready (csrc/reader/batch_reader.cpp): a deeper window of small batches means fewer of
# its sleeps and wakes, each a large part of its CPU per batch, for a few MiB more buffers to fault in.
SMALL_BATCH_WINDOW_BYTES = 8 * 2**20
MAX_SMALL_BATCH_WINDOW = 16


@dataclass(frozen=True)
class SourceSpec:
    """What a loader reads: the opened dataset (fields selected) and the subset indices a ``ShardSubset`` brought."""

    dataset: ShardDataset | ConcatShardDataset
    indices: Any
    verify_checksums: bool
    allow_external_shards: bool

    @classmethod
    def build(cls, path_or_dataset: Any, split: str | None, fields: Any, verify_checksums: bool,
              allow_external_shards: bool, indices: Any, storage: dict[str, Any] | None = None) -> SourceSpec:
        """Open ``path_or_dataset`` (one ``split`` of a root, a dataset, a concatenation or a subset).

        ``storage`` holds ``storage_options``, ``cache_dir`` and ``cache_limit`` for a URL of object storage.
        """
        storage = {k: v for k, v in (storage or {}).items() if v is not None}
        if is_remote(path_or_dataset):  # the split, the download and the cache: ShardDataset's
            remote = ShardDataset(path_or_dataset, fields, verify_checksums, split=split,
                                  allow_external_shards=allow_external_shards, **storage)
            return cls(remote, indices, verify_checksums, bool(allow_external_shards))
        if storage:
            raise ArgumentError(f"{', '.join(sorted(storage))}: only for a dataset in object storage (s3://, gs://, "
                                f"az://, https://), not {type(path_or_dataset).__name__} {path_or_dataset!r}")
        if split is not None:  # a dataset root with splits.json: pick one split's directory
            if not isinstance(path_or_dataset, (str, os.PathLike)):
                raise ArgumentError(
                    f"split={split!r} needs a dataset root path, not a {type(path_or_dataset).__name__}")
            path_or_dataset = resolve_dataset_path(path_or_dataset, split)
        source = path_or_dataset
        if isinstance(source, ShardSubset):
            if indices is not None:
                raise ArgumentError("pass indices= or a ShardSubset, not both")
            indices = source.indices
            source = source.dataset
        dataset: ShardDataset | ConcatShardDataset
        if isinstance(source, ShardDataset):
            dataset = source if fields is None else source.with_fields(fields, verify_checksums)
        elif isinstance(source, ConcatShardDataset):
            dataset = source if fields is None else source.with_fields(fields)
        elif isinstance(source, (str, os.PathLike)):
            dataset = ShardDataset(Path(source), fields, verify_checksums, allow_external_shards=allow_external_shards)
        else:
            raise ArgumentTypeError(f"expected a dataset directory or a ShardDataset (or a fastload.concat, mix or "
                                    f"subset), not {type(path_or_dataset).__name__}")
        return cls(dataset, indices, verify_checksums, bool(allow_external_shards))

    @property
    def sample_bytes(self) -> int:
        """Return the decoded bytes of one sample (the fields read)."""
        return sum(f.nbytes for f in self.dataset.fields)


@dataclass(frozen=True)
class OrderSpec:
    """Batches and their order: batch size, shuffle, seed, drop_last, and the sampling policy."""

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    sampling: Any  # _sampling_setup.make_sampling: the epoch order's policy

    @staticmethod
    def check_batch_size(batch_size: Any) -> int:
        """Return ``batch_size`` after checking it is a positive integer in bounds (ArgumentError)."""
        return _positive_int("batch_size", batch_size)

    @classmethod
    def build(cls, source: SourceSpec, batch_size: Any, shuffle: Any, seed: Any, drop_last: Any,
              sample_weights: Any, num_samples: int | None, replacement: bool,
              shuffle_window: Any = None) -> OrderSpec:
        """Check the order's parameters and make the sampling policy over ``source``."""
        batch_size = cls.check_batch_size(batch_size)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ArgumentError(f"seed must be an integer, not {seed!r}")
        shuffle = bool(shuffle)
        sampling = make_sampling(source.dataset, shuffle, source.indices, sample_weights, num_samples, replacement,
                                 shuffle_window)
        return cls(batch_size, shuffle, seed, bool(drop_last), sampling)


@dataclass(frozen=True)
class DistributionSpec:
    """Which rank reads what: explicit rank and world size (or torch.distributed's), and even batches."""

    topology: Topology
    even_batches: bool

    @classmethod
    def build(cls, rank: int | None, world_size: int | None, even_batches: Any) -> DistributionSpec:
        """Check explicit ``rank`` / ``world_size`` now (ArgumentError); ``None`` asks torch.distributed later."""
        return cls(Topology(rank, world_size), bool(even_batches))


@dataclass(frozen=True)
class DeviceSpec:
    """Where batches land: a device (batches copied there one ahead) and whether host batches are pinned."""

    device: torch.device | None
    pin_memory: bool

    @classmethod
    def build(cls, device: str | torch.device | None, pin_memory: bool | str) -> DeviceSpec:
        """Resolve ``device`` and ``pin_memory="auto"`` (pinned with a device or CUDA); refuse pinning without CUDA."""
        resolved = resolve_device(device)
        return cls(resolved, resolve_pin_memory(pin_memory, resolved))


@dataclass(frozen=True)
class ReadSpec:
    """Who reads and how far ahead: the backend, native threads and prefetch, the torch backend's workers."""

    backend: str
    num_threads: int
    prefetch: int
    num_workers: Union[int, Auto]
    prefetch_factor: int | None
    persistent_workers: bool
    multiprocessing_context: str | None
    running: int  # how many of the native threads decode at once (``running_threads``)

    @classmethod
    def build(cls, backend: str, num_threads: Union[int, Auto], prefetch: Union[int, Auto],
              num_workers: Union[int, Auto], prefetch_factor: int | None, persistent_workers: bool,
              multiprocessing_context: str | None, batch_bytes: int, pin_memory: bool) -> ReadSpec:
        """Check the reading parameters and resolve the ``"auto"`` ones for batches of ``batch_bytes``."""
        threads = min(os.cpu_count() or 1, 8) if num_threads == "auto" else _positive_int(
            "num_threads", num_threads, MAX_THREADS)
        running = running_threads(threads)
        if prefetch == "auto":
            ahead = auto_prefetch(running, batch_bytes, pin_memory)  # batches for the threads that run
        else:
            ahead = _positive_int("prefetch", prefetch, MAX_THREADS)
        if num_workers != "auto" and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                      or not 0 <= num_workers <= MAX_THREADS):
            raise ArgumentError(f"num_workers must be an integer in [0, {MAX_THREADS}] or 'auto', not {num_workers!r}")
        if prefetch_factor is not None:
            _positive_int("prefetch_factor", prefetch_factor, MAX_THREADS)
        return cls(resolve_backend(backend), threads, ahead, num_workers, prefetch_factor, bool(persistent_workers),
                   multiprocessing_context, running)


def resolve_backend(backend: str) -> str:
    """Return ``"native"`` or ``"torch"``: ``"auto"`` (or ``FASTLOAD_BACKEND``) picks native when it imports."""
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    if backend not in ("auto", "native", "torch"):
        raise ArgumentError(f"backend must be 'auto', 'native' or 'torch', not {backend!r}")
    if backend == "native" and NATIVE_IMPORT_ERROR is not None:
        raise ImportError(f"backend='native' needs fastload._native, which failed to import: {NATIVE_IMPORT_ERROR}")
    if backend == "auto":
        if NATIVE_IMPORT_ERROR is None:
            return "native"
        warnings.warn(f"fastload: the native extension is not available ({NATIVE_IMPORT_ERROR}); "
                      "falling back to backend='torch'", RuntimeWarning, stacklevel=4)
        return "torch"
    return backend


def auto_prefetch(num_threads: int, batch_bytes: int, pin_memory: bool, cores: int | None = None) -> int:
    """Return ``prefetch="auto"``: batches in flight for this many threads and this batch size.

    Plain memory: one batch per thread and at least 4 while the threads fit the ``cores``
    this process may run on (default: its CPU affinity), and with small batches about 8 MiB
    of them (at most 16 batches), so that a consumer faster than the threads sleeps once per
    several batches rather than once per batch (issue 26). With more threads than cores, at
    least 64 MiB of batches (up to 64 batches), so that small batches keep many threads busy
    while one is descheduled. That deep window is not the default for every loader: a fresh
    process faults in every page of its batch buffers once, and 64 MiB of them made the
    first epoch of small records run at half the steady state (issue 26). Pinned: one batch
    per thread, no more than about 32 MiB of batches: page-locked memory is scarce and torch
    rounds each pinned batch up to a power of two; with batches of a few MiB, two or three in
    flight keep every thread busy, since all threads work on the oldest batch.
    """
    prefetch = max(2, num_threads)
    if batch_bytes <= 0:
        return prefetch
    if pin_memory:
        return min(prefetch, max(2, -(-PINNED_PREFETCH_BYTES // batch_bytes)))
    if num_threads <= (usable_cores() if cores is None else cores):
        return max(4, num_threads, min(MAX_SMALL_BATCH_WINDOW, -(-SMALL_BATCH_WINDOW_BYTES // batch_bytes)))
    return max(prefetch, min(MAX_AUTO_PREFETCH, -(-MIN_PREFETCH_BYTES // batch_bytes)))


def running_threads(num_threads: int, cores: int | None = None, platform: str | None = None) -> int:
    """Return how many of the native reader's ``num_threads`` decode at once; the others wait for a turn.

    Reading shards held in memory (the page cache) is CPU work: threads beyond the ``cores`` this
    process may run on only take the cores from one another, and needed a window of batches several
    times deeper to stay busy, which no longer fits the CPU's cache. So at most ``cores`` of them run,
    the threads that went idle last first (csrc/reader/batch_reader.h): 8 or 16 threads read as fast
    as 2 on 2 cores (docs/benchmarks.md, "Many threads on few cores"). Shards read from disk (a page
    cache that does not hold them, a network file system) are another matter: a thread waiting for a
    page leaves its core to another. The reader sees those waits (its threads' major page faults) and
    then lets every thread run, as many reads in flight as threads, until a second passes without
    one. It can see them on Linux only (``platform``, default ``sys.platform``): elsewhere every
    thread runs, as before.
    """
    cores = usable_cores() if cores is None else cores
    platform = sys.platform if platform is None else platform
    if num_threads <= cores or not platform.startswith("linux"):
        return num_threads
    return cores


def usable_cores() -> int:
    """Return how many CPUs this process may run on: its affinity where the OS has one, within its cgroup's CPU quota.

    A container started with ``docker run --cpus=2`` on a 64-core machine sees 64 CPUs in its affinity
    and may use 2 (cgroup v2 ``cpu.max``).
    """
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(cores, quota)) if quota is not None else cores


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Return the CPUs this process's cgroup v2 quota allows, rounded up; None: no quota, or none to read."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            group = next((line[3:] for line in f.read().splitlines() if line.startswith("0::")), None)
        if group is None:
            return None
        fields = Path(root, group.strip().lstrip("/"), "cpu.max").read_text(encoding="utf-8").split()
        quota, period = int(fields[0]), int(fields[1])  # "max 100000" (no quota) raises ValueError
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return -(-quota // period) if quota > 0 and period > 0 else None


def resolve_pin_memory(pin_memory: bool | str, device: torch.device | None) -> bool:
    """Return whether batches are pinned: ``"auto"`` pins with a device or CUDA; True needs CUDA."""
    if pin_memory == "auto":
        return device is not None or torch.cuda.is_available()
    if not isinstance(pin_memory, bool):
        raise ArgumentError(f"pin_memory must be True, False or 'auto', not {pin_memory!r}")
    if pin_memory and not torch.cuda.is_available():
        raise ArgumentError("pin_memory=True needs CUDA, which is not available; use pin_memory='auto' or False")
    return pin_memory
