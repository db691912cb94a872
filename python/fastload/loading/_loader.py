"""``ShardLoader``: a drop-in replacement for ``DataLoader`` over a shard dataset."""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Union

import numpy as np
import torch

from .._extension import require as native_core
from ..errors import ArgumentError, FastloadError
from ..sampling._order import EpochOrder
from ..sampling._sampling import ArrayOrder
from ._augment import Augment, BatchTransform, check_dataset_class
from ._compose import ConcatShardDataset, ShardSubset, parts_of
from ._dataset import ShardDataset
from ._device import CudaOps, DevicePrefetcher
from ._epoch import Batch, EpochIterator, PassHooks, summarize_stats
from ._native_backend import NativeEpoch, NativeSettings, SlotPoolKeeper, open_shards, record_fingerprints, shard_paths
from ._native_groups import GroupedNativeEpoch, open_groups
from ._plan import BatchIndices, EpochPlan
from ._remote_shards import (
    RemoteShardSet,
    check_cache_fits,
    fetch_ahead,
    follow_pass,
    heal_damaged_shard,
    is_remote_dataset,
    remote_fetchers,
    shards_missing,
)
from ._sampler import EpochBatchSampler, EpochSampler
from ._sampling_setup import WithSource, dataset_fingerprint
from ._specs import Auto, DeviceSpec, DistributionSpec, OrderSpec, ReadSpec, SourceSpec, usable_cores
from ._state import MAX_EPOCH, check_state, make_state
from ._torch_backend import OrderBatchSampler, make_dataloader, relay_notices, workers_for_platform
from ._warm_up import WarmUp, start_warm_up

_log = logging.getLogger(__name__)


class ShardLoader:
    """Batches of a shard dataset in a seeded, deterministic order; a drop-in for ``DataLoader``.

    Each batch is a dict of field name to a tensor of shape ``[B, *field shape]``
    in the schema's dtype. The order of epoch ``e`` is a pure function of
    ``(seed, e, len(dataset))`` (docs/ORDER.md), identical for every thread
    count and backend.

    Epochs work as with ``DataLoader`` + ``DistributedSampler`` (docs/ORDER.md,
    "Epochs"): ``len(loader)`` is the number of batches of one full epoch on
    this rank; every pass (each ``iter()``, from its first ``next()``) reads one
    epoch, and the next pass reads the next epoch, whether the pass delivered
    its last batch or was abandoned (``break``; ``state_dict()`` then still
    records where the data stopped, until the next pass begins); ``set_epoch(e)`` (also through
    ``loader.sampler`` / ``loader.batch_sampler.sampler``, where trainers call
    it) selects the epoch of the next pass. ``load_state_dict`` makes the next
    pass resume mid-epoch; ``remaining()`` says how many batches it has.

    ``transforms=[...]`` (``fastload.transforms`` ops; ``layout="chw"`` or
    ``"hwc"`` for 3-D fields) augments every sample inside the loader, the
    same for any thread count, backend or resume point (docs/TRANSFORMS.md);
    ``batch_transform=fn`` calls ``fn(batch, generator)`` on each batch on the
    iterating thread with a generator keyed by (seed, epoch, batch);
    ``output=("image", "label")`` yields tuples in that order instead of dicts.

    ``backend="native"`` decodes in C++ threads into pooled (pinned when CUDA
    is there) buffers; ``backend="torch"`` uses ``torch.utils.data.DataLoader``
    over :class:`ShardDataset`; ``"auto"`` (or the ``FASTLOAD_BACKEND``
    environment variable) picks native when the extension imports.

    ``split="train"`` opens one split of a dataset root written with
    ``preprocess_tiles --val-fraction`` (a root with ``splits.json``).

    Without ``rank``/``world_size`` the split follows ``torch.distributed``
    as it is when a pass starts (a loader may be built before
    ``init_process_group``); each rank reads its disjoint part of every epoch
    (``_plan.py``). With ``device="cuda"`` batches arrive on the GPU, copied one
    batch ahead on a side stream. ``state_dict()`` / ``load_state_dict()``
    resume exactly, also with another world size, and a loader pickles as its
    configuration plus that state (for spawned processes).

    Shards are validated before anything reads them; a shard whose real path
    leaves the dataset directory is refused unless ``allow_external_shards``
    is true (a ``ShardDataset`` passed in keeps its own setting).

    Sampling (docs/ORDER.md, "Sampling"): ``indices=`` (or a
    ``ShardDataset.subset``) reads those samples, in order or shuffled among
    themselves; ``sample_weights=`` with ``num_samples=`` and ``replacement=``
    draws as ``WeightedRandomSampler``; a ``fastload.concat`` is one index
    space and a ``fastload.mix`` samples its datasets by weight. Every policy
    is a pure function of ``(seed, epoch, position)``, so all of the above
    (backends, threads, ranks, resume) holds for it too. ``shuffle=True,
    shuffle_window=K`` shuffles within windows of ``K`` shards taken in a
    shuffled order, so a stretch of batches reads only ``K`` shards (a dataset
    in object storage behind a small cache, a page cache smaller than the
    dataset); docs/ORDER.md, "Shard windows", measures what it costs in mixing.

    ``path_or_dataset`` may be a URL of object storage (``s3://bucket/tiles``,
    ``gs://``, ``az://``, ``https://``; ``pip install "fastload[remote]"``):
    the shards are downloaded into ``cache_dir`` (bounded by ``cache_limit``,
    e.g. ``"50GB"``), each checked against the manifest, and read as a local
    copy: the same batches, bitwise. ``storage_options`` configure the store
    (``endpoint``, ``region``, ``allow_http`` for a plain-http server,
    credentials, ``max_retries``, ``retry_timeout_s``); by default credentials
    come from the environment. Shards download in the order the epoch first
    reads them, at most ``predownload`` shards ahead of the next batch
    (``"auto"``: 16; ``"all"``: no bound). ``cache_dir`` is made private
    (0700) and refused when another user could plant files in it, unless
    ``FASTLOAD_SHARED_CACHE=1``; a dataset larger than its room claims the
    room its order needs (``2 K`` shards for ``shuffle_window=K``), so other
    datasets fit beside it. See docs/remote.md.

    ``warm_up=True`` (the native backend, local shards): from construction
    until the first pass starts, a background thread faults in that pass's
    batch buffers and maps the shard pages the page cache holds, so the first
    epoch of a fresh process does not pay for them while the script builds its
    model (docs/benchmarks.md, "Warming up while the model is built").
    ``warm_up=False`` leaves both to the first pass.

    ``multiprocessing_context`` is the start method of ``backend="torch"``'s
    workers: ``None`` forks on Linux and takes the platform's default
    elsewhere (``spawn`` on Windows and macOS); ``"spawn"`` starts them as
    Windows does, on any platform.
    """

    def __init__(
        self,
        path_or_dataset: str | os.PathLike | ShardDataset | ConcatShardDataset | ShardSubset,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_threads: Union[int, Auto] = "auto",
        prefetch: Union[int, Auto] = "auto",
        fields: Sequence[str] | None = None,
        pin_memory: Union[bool, Auto] = "auto",
        backend: Literal["auto", "native", "torch"] = "auto",
        num_workers: Union[int, Auto] = "auto",
        verify_checksums: bool = True,
        prefetch_factor: int | None = None,
        persistent_workers: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        even_batches: bool = True,
        device: str | torch.device | None = None,
        split: str | None = None,
        allow_external_shards: bool = False,
        indices: Any = None,
        sample_weights: Any = None,
        num_samples: int | None = None,
        replacement: bool = True,
        shuffle_window: int | None = None,
        transforms: Sequence[Any] | None = None,
        layout: str | Mapping[str, str] = "chw",
        batch_transform: BatchTransform | None = None,
        output: Sequence[str] | None = None,
        multiprocessing_context: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        predownload: int | str = "auto",
        warm_up: bool = True,
    ) -> None:
        # The constructor only validates and groups (one spec per concern, _specs.py), then composes them.
        OrderSpec.check_batch_size(batch_size)  # before the dataset is opened, as a DataLoader would
        source = SourceSpec.build(path_or_dataset, split, fields, verify_checksums, allow_external_shards, indices,
                                  {"storage_options": storage_options, "cache_dir": cache_dir,
                                   "cache_limit": cache_limit,
                                   "predownload": None if isinstance(predownload, str) and predownload == "auto"
                                   else predownload})
        indices = source.indices  # a ShardSubset's, when one was passed
        order = OrderSpec.build(source, batch_size, shuffle, seed, drop_last, sample_weights, num_samples,
                                replacement, shuffle_window)
        distribution = DistributionSpec.build(rank, world_size, even_batches)
        placement = DeviceSpec.build(device, pin_memory)
        reading = ReadSpec.build(backend, num_threads, prefetch, num_workers, prefetch_factor, persistent_workers,
                                 multiprocessing_context, order.batch_size * source.sample_bytes,
                                 placement.pin_memory)
        self.dataset: ShardDataset | ConcatShardDataset = source.dataset
        self.batch_size, self.shuffle, self.seed, self.drop_last = (order.batch_size, order.shuffle, order.seed,
                                                                    order.drop_last)
        self._sampling = order.sampling
        self._orders: dict[int, EpochOrder | ArrayOrder] = {}
        self._topology, self.even_batches = distribution.topology, distribution.even_batches
        self.device, self.pin_memory = placement.device, placement.pin_memory
        self.num_threads, self.prefetch, self.backend = reading.num_threads, reading.prefetch, reading.backend
        self._running = reading.running  # of the native threads, how many decode at once (_specs.running_threads)
        check_dataset_class(self.dataset, self.backend)
        check_cache_fits(self._parts(), self.shuffle, self._sampling)
        self.augment = Augment(self.dataset, transforms, layout, batch_transform, output, seed)
        self.verify_checksums = verify_checksums
        self._epoch = 0
        self._start = 0  # global position where the data stopped in self._epoch (where a resumed pass begins)
        self._advance = False  # a pass was abandoned at (_epoch, _start): the next pass reads _epoch + 1 from 0
        self._active: weakref.ref[EpochIterator] | None = None  # the started pass that moves this loader
        self._last_stats: dict[str, Any] = {}
        self._shards: Any = None  # the native ShardSet, opened by the first pass in this process
        self._warm_up: WarmUp | None = None  # buffers and shard pages touched in the background until a pass starts
        self._warm_up_stats: dict[str, Any] = {}
        self._slots = SlotPoolKeeper()  # plain batch buffers, reused by the next pass
        self._sampler: OrderBatchSampler | None = None
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._samplers: tuple[EpochSampler, EpochBatchSampler] | None = None
        self._host_allocator: Any = None  # testing only: replaces torch's pinned allocator
        self._transfer_ops: Any = None  # testing only: replaces CudaOps (a device without CUDA)
        self.max_copies_in_flight = 2
        self._init_kwargs: dict[str, Any] = {
            "batch_size": batch_size, "shuffle": shuffle, "seed": seed, "drop_last": drop_last,
            "num_threads": num_threads, "prefetch": prefetch, "pin_memory": pin_memory, "backend": self.backend,
            "num_workers": num_workers, "verify_checksums": verify_checksums, "prefetch_factor": prefetch_factor,
            "persistent_workers": persistent_workers, "rank": rank, "world_size": world_size,
            "even_batches": even_batches, "device": device, "indices": indices, "sample_weights": sample_weights,
            "num_samples": num_samples, "replacement": replacement, "shuffle_window": shuffle_window,
            "transforms": transforms,
            "layout": layout, "batch_transform": batch_transform, "output": output,
            "multiprocessing_context": multiprocessing_context, "warm_up": warm_up}
        if self.backend == "torch":
            self.num_workers = workers_for_platform(num_workers)
            self._init_kwargs["num_workers"] = self.num_workers
            self._sampler = OrderBatchSampler(self._order(0), self._plan(0, 0, warn=False))
            self._dataloader = make_dataloader(self.dataset, self._sampler, self.num_workers, self.pin_memory, seed,
                                               prefetch_factor, persistent_workers, self.augment,
                                               multiprocessing_context)
        elif warm_up:
            self._warm_up = self._start_warm_up()

    # ---- distributed settings -----------------------------------------------------------------

    @property
    def rank(self) -> int:
        """Return this process's rank: as given, else torch.distributed's now, else 0."""
        return self._topology.resolve(warn=False)[0]

    @property
    def world_size(self) -> int:
        """Return the number of ranks: as given, else torch.distributed's now, else 1."""
        return self._topology.resolve(warn=False)[1]

    # ---- epochs and order ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Return the epoch of the running pass, else of the next one.

        As ``state_dict()["epoch"]``, except after a pass abandoned mid-epoch:
        the state then records the epoch where the data stopped.
        """
        active = self._live_pass()
        return self._next_pass_position()[0] if active is None else int(active.epoch)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass, as ``DistributedSampler.set_epoch``.

        A running pass is abandoned (its remaining batches no longer move the
        loader). Another epoch starts from its beginning; the epoch the loader
        is already at keeps a position loaded by ``load_state_dict``, so a
        trainer that calls ``set_epoch`` after restoring a checkpoint resumes.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise ArgumentError(f"epoch must be an integer in [0, {MAX_EPOCH}], not {epoch!r}")
        self._abandon_active()
        if epoch != self._epoch or self._advance:  # only a loaded position is kept, not where a pass stopped
            self._epoch, self._start, self._advance = epoch, 0, False

    def _order(self, epoch: int) -> EpochOrder | ArrayOrder:
        order = self._orders.get(epoch)
        if order is None:
            order = self._sampling.epoch_order(self.seed, epoch, len(self.dataset), self.shuffle)
            self._orders = {e: o for e, o in self._orders.items() if e in (epoch - 1, self._epoch)}
            self._orders[epoch] = order
        return order

    def _plan(self, start: int, epoch: int | None = None, warn: bool = True) -> EpochPlan:
        rank, world = self._topology.resolve(warn)
        n = self._order(self._epoch if epoch is None else epoch).n
        return EpochPlan(n, self.batch_size, self.drop_last, world, rank, start, self.even_batches)

    def __len__(self) -> int:
        """Return the batches of one full epoch on this rank, as ``len(DataLoader)``.

        Without explicit ``rank``/``world_size`` this follows torch.distributed
        as it is now: before ``init_process_group`` it counts for a single
        process (and warns when ``WORLD_SIZE`` says otherwise).
        """
        return len(self._plan(0))

    def remaining(self) -> int:
        """Return the batches the running pass has still to deliver, else those of the next pass.

        Equal to ``len(loader)`` except after ``load_state_dict`` mid-epoch (the
        resumed pass reads only what is left of its epoch) and during a pass.
        """
        active = self._live_pass()
        if active is not None:
            assert active.plan is not None
            return len(active.plan) - active.delivered
        epoch, start = self._next_pass_position()
        return len(self._plan(start, epoch))

    @property
    def sampler(self) -> EpochSampler:
        """Return the sampler trainers call ``set_epoch`` on; it lists this rank's indices of the next pass."""
        return self._trainer_samplers()[0]

    @property
    def batch_sampler(self) -> EpochBatchSampler:
        """Return the batch sampler (``.sampler`` is :attr:`sampler`) that trainers probe for ``set_epoch``."""
        return self._trainer_samplers()[1]

    def _trainer_samplers(self) -> tuple[EpochSampler, EpochBatchSampler]:
        if self._samplers is None:
            sampler = EpochSampler(self.set_epoch, self._next_pass_batches, lambda: self._plan(0).samples)
            self._samplers = sampler, EpochBatchSampler(sampler, self.batch_size, self.drop_last,
                                                        self._next_pass_batches, self.remaining)
        return self._samplers

    def _next_pass_position(self) -> tuple[int, int]:
        """Return (epoch, position) where a pass started now begins (a running pass would be abandoned)."""
        active = self._live_pass()
        if active is not None:
            return int(active.epoch) + 1, 0  # type: ignore[arg-type]
        return (self._epoch + 1, 0) if self._advance else (self._epoch, self._start)

    def _next_pass_len(self) -> int:
        epoch, start = self._next_pass_position()
        return len(self._plan(start, epoch))

    def _next_pass_batches(self) -> Iterator[list[int]]:
        epoch, start = self._next_pass_position()
        order, plan = self._order(epoch), self._plan(start, epoch)
        for b in range(len(plan)):
            yield order.at(plan.batch_positions(b)).tolist()

    # ---- passes -------------------------------------------------------------------------------

    def __iter__(self) -> EpochIterator:
        """Return a pass over the next epoch; it fixes its epoch, split and position at its first ``next()``."""
        return EpochIterator(PassHooks(self._begin_pass, self._end_pass, self._next_pass_len, self._heal_pass,
                                       self._resume_pass))

    def _parts(self) -> list[ShardDataset]:
        """Return the datasets laid end to end in this loader's index space (one, unless it reads a concat)."""
        return parts_of(self.dataset)

    def _live_pass(self) -> EpochIterator | None:
        active = self._active() if self._active is not None else None
        return None if active is None or active.finished else active

    def _abandon_active(self) -> None:
        """Detach the running pass, if any; the next pass reads the epoch after it."""
        active = self._live_pass()
        self._active = None
        if active is not None:
            self._stopped(active, complete=False)

    def _stopped(self, it: EpochIterator, complete: bool) -> None:
        """Record where a pass ended: a complete one at the next epoch's start; an abandoned one where it stopped.

        After an abandoned pass, ``state_dict()`` describes where the data
        stopped (so a state saved after ``break`` resumes the rest of the
        epoch) and the advance to the next epoch waits for the next pass.
        """
        self._last_stats = it.raw_stats()
        assert it.epoch is not None and it.plan is not None
        if complete:
            self._epoch, self._start, self._advance = it.epoch + 1, 0, False
        else:
            self._epoch, self._start, self._advance = it.epoch, it.plan.position_after(it.delivered), True

    def _begin_pass(self, it: EpochIterator) -> tuple[int, EpochPlan, Iterator[Batch]]:
        self._abandon_active()  # a second pass started while one runs supersedes it
        if self._advance:  # the last pass was abandoned: this one reads the next epoch
            self._epoch, self._start, self._advance = self._epoch + 1, 0, False
        epoch, plan = self._epoch, self._plan(self._start, self._epoch)
        inner = self._pass_batches(self._order(epoch), plan, epoch)
        self._active = weakref.ref(it)
        return epoch, plan, inner

    def _pass_batches(self, order: EpochOrder | ArrayOrder, plan: EpochPlan, epoch: int) -> Iterator[Batch]:
        """Return the batches of ``plan`` (of epoch ``epoch``, in ``order``), through this loader's backend."""
        if self.backend == "native":
            inner: Iterator[Batch] = self._iter_native(order, plan, epoch)
        else:
            assert self._sampler is not None and self._dataloader is not None
            self._sampler.configure(order, plan, epoch)
            datasets = self._parts()
            if len(plan) and shards_missing(datasets):  # fetch ahead in the order this rank's batches read
                fetch_ahead(datasets, np.asarray(order.at(plan.positions_of_batches(0, len(plan)))), self.batch_size,
                            lead=self._dataloader.num_workers * (self._dataloader.prefetch_factor or 0))
            inner = iter(self._dataloader) if len(plan) else iter(())
            fetchers = remote_fetchers(datasets)
            if fetchers and len(plan):  # downloads (and a windowed dataset's eviction) follow where the pass is
                inner = follow_pass(inner, fetchers)
            notices = getattr(self._dataloader.dataset, "notices", None)
            if notices is not None and len(plan):  # workers that healed a damaged cache file: warned here
                inner = relay_notices(inner, notices)
        if self.device is not None or self._transfer_ops is not None:
            ops = self._transfer_ops
            if ops is None:
                assert self.device is not None
                ops = CudaOps(self.device)
            inner = DevicePrefetcher(inner, ops, self.max_copies_in_flight)
        return self.augment.finish(inner, epoch, lambda b: int(plan.batch_positions(b)[0]), self.device)

    def _heal_pass(self, it: EpochIterator, error: Exception) -> bool:
        """Heal the damaged cached shard of a remote dataset that ``error`` names; return whether the pass goes on.

        The native backend's (the torch backend's datasets heal as they read): the shard is detached from
        the native shard set, its cached copy checked against its manifest and downloaded again when it no
        longer matches (``storage/_heal.py``), and the pass resumes from the batch that failed
        (``_resume_pass``). False for any other error, or a local dataset's: the pass ends with it.
        """
        if self.backend != "native":
            return False
        shard_sets = self._shards if isinstance(self._shards, list) else [self._shards]
        if not heal_damaged_shard(self._parts(), shard_sets, error, it.repaired):
            return False
        if not all(isinstance(s, RemoteShardSet) for s in shard_sets if s is not None):
            self._shards = None  # an eager set maps the file it opened: the resumed pass opens them again
        return True

    def _resume_pass(self, it: EpochIterator) -> Iterator[Batch]:
        """Return the batches of a started pass from ``it.delivered`` on: the rest of its plan, exactly."""
        assert it.epoch is not None and it.plan is not None
        plan = self._plan(it.plan.position_after(it.delivered), it.epoch)
        if len(plan) != len(it.plan) - it.delivered:  # the split changed under the pass (torch.distributed)
            raise FastloadError(f"a pass over {len(it.plan)} batches cannot resume after batch {it.delivered}: "
                                f"its rank's share of the epoch changed")
        return self._pass_batches(self._order(it.epoch), plan, it.epoch)

    def _end_pass(self, it: EpochIterator, complete: bool) -> None:
        """End a pass (its last batch delivered, or closed early): the next pass reads the next epoch."""
        if self._active is not None and self._active() is it:
            self._active = None
            self._stopped(it, complete)
        self._join_warm_up()

    def _join_warm_up(self) -> None:
        """Join the warm-up thread once a pass has asked it to stop (it ended after its step in flight)."""
        warm = self._warm_up
        if warm is not None and warm.forked():  # the parent's thread: nothing to wait for or use here
            self._warm_up, self._warm_up_stats = None, {}
        elif warm is not None and self._warm_up_stats:
            self._warm_up_stats, self._warm_up = warm.stop(), None

    def _native_settings(self, grouped: bool, unfaulted: Sequence[np.ndarray] = ()) -> NativeSettings:
        return NativeSettings(self.num_threads, self.prefetch, self.pin_memory, self.verify_checksums,
                              host_allocator=self._host_allocator, slots=None if grouped else self._slots,
                              prefault_while_waiting=self._running < usable_cores(), unfaulted=unfaulted,
                              max_running=self._running)

    def _start_warm_up(self) -> WarmUp | None:
        """Start faulting in the first pass's batch buffers and mapping the cached shard pages (``_warm_up.py``).

        Local shards of one layout only. A dataset that cannot be opened or read gets no warm-up: the first
        pass opens it again and raises its error there, as without one.
        """
        datasets = self._parts()
        if isinstance(self.dataset, ConcatShardDataset) and not self.dataset.same_layout:
            return None
        if any(is_remote_dataset(ds) for ds in datasets):
            return None
        try:
            shards = open_shards(datasets)
            return start_warm_up(shards, datasets[0], self.batch_size, self._native_settings(False), self.augment,
                                 record_fingerprints(datasets), shard_paths(datasets))
        except Exception:  # noqa: BLE001 - raised again, where it always was, by the first pass
            _log.debug("no warm-up for %r", self, exc_info=True)
            return None

    def _iter_native(self, order: EpochOrder | ArrayOrder, plan: EpochPlan, epoch: int) -> Iterator[Batch]:
        if len(plan) == 0:
            return iter(())
        datasets = self._parts()
        grouped = isinstance(self.dataset, ConcatShardDataset) and not self.dataset.same_layout
        if self._shards is None:
            self._shards = open_groups(self.dataset) if grouped else open_shards(datasets)  # type: ignore[arg-type]
        unfaulted: list[np.ndarray] = []
        self._join_warm_up()  # a pass that ran alongside this one stopped it (or this is a forked child)
        warm = self._warm_up  # bound once: a pass's end (a collected iterator) may clear the attribute meanwhile
        if warm is not None:  # the first pass: its shards, its pool's buffers
            # Not joined here: the step in flight (a 2 MiB fault can take milliseconds) ends on its own while the
            # pass starts, and the pass's end joins the thread.
            stats = warm.stop(wait=False)
            unfaulted = warm.unfaulted()
            self._warm_up_stats = stats
        batch_indices = BatchIndices(plan, native_position_map(order), permutation=native_permutation(order),
                                     identity=isinstance(order, EpochOrder) and not order.shuffle)
        remote_set = self._shards if isinstance(self._shards, RemoteShardSet) else None
        if remote_set is not None and shards_missing(datasets):  # fetch ahead in the order the batches read
            remote_set.want(native_position_map(order)(plan.positions_of_batches(0, len(plan))), self.batch_size)
        settings = self._native_settings(grouped, unfaulted)  # with a core idle, the consumer goes on with it
        epoch_batches: Iterator[Batch]
        if grouped:  # datasets that store records differently: a reader per group, parts copied together
            assert isinstance(self.dataset, ConcatShardDataset)
            epoch_batches = GroupedNativeEpoch(self.dataset, self._shards, len(plan), self.batch_size, batch_indices,
                                               settings)  # transforms are refused at construction here
        else:
            epoch_batches = NativeEpoch(self._shards, datasets[0], len(plan), self.batch_size, batch_indices,
                                        settings, self.augment, epoch,
                                        record_fingerprints(datasets))
        if isinstance(self.dataset, ConcatShardDataset) and self.dataset.with_source:
            epoch_batches = WithSource(epoch_batches, self.dataset, batch_indices)
        return epoch_batches

    # ---- resumable state ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the loader's position as small JSON-able data (no pickle of the loader).

        During a pass it records the global position after the batches
        delivered so far (once the last one is delivered: the next epoch, at
        0); after a pass abandoned before its end (``break``, an exception),
        the position where it stopped, until the next pass begins (which reads
        the next epoch). Loading it into a new loader (any world size)
        continues from there.
        """
        active = self._live_pass()
        if active is None:
            epoch, position = self._epoch, self._start
        else:
            assert active.plan is not None and active.epoch is not None
            epoch, position = active.epoch, active.plan.position_after(active.delivered)
        return make_state(fingerprint=dataset_fingerprint(self.dataset), n=len(self.dataset), seed=self.seed,
                          shuffle=self.shuffle, epoch=epoch, position=position, batch_size=self.batch_size,
                          world_size=self.world_size, sampling=self._sampling.describe(),
                          augment=self.augment.description)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state: the next pass resumes its epoch at its position.

        ``len(loader)`` stays the length of a full epoch; ``remaining()`` is the
        number of batches the resumed pass delivers.
        """
        epoch, start = check_state(state, fingerprint=dataset_fingerprint(self.dataset), n=len(self.dataset),
                                   seed=self.seed, shuffle=self.shuffle, sampling=self._sampling.describe(),
                                   epoch_length=lambda e: self._order(e).n, augment=self.augment.description)
        self._active = None
        self._epoch, self._start, self._advance = epoch, start, False

    def __getstate__(self) -> dict[str, Any]:
        """Pickle as configuration plus position: no native handle, thread or weak reference."""
        state = self.state_dict()
        return {"dataset": self.dataset, "kwargs": dict(self._init_kwargs), "epoch": state["epoch"],
                "position": state["position"], "advance": self._advance and self._live_pass() is None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild from configuration and position; shards are opened by the first pass in this process."""
        self.__init__(state["dataset"], **state["kwargs"])  # type: ignore[misc]
        self._epoch, self._start = state["epoch"], state["position"]  # older pickles also hold a test hook's value
        self._advance = bool(state.get("advance", False))  # older pickles: the next pass's own position

    # ---- observability ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Return counters of the current (or last) pass and the stage that limits throughput.

        Keys: batches, samples (those of the batches delivered, as the epoch plan
        has them: a ``batch_transform`` that changes a batch's size is not counted),
        wait_s (time the consumer waited for data),
        wall_s, wait_share, and for the native backend bytes_read,
        bytes_decoded, read_s, decompress_s, copy_s (summed over threads),
        peak_running (the most threads that decoded at once: beyond the cores they take turns,
        docs/loading.md), disk_chunks (chunks whose thread waited for the disk: every thread runs then),
        ready_batches, prefaulted_bytes and prefault_s (fresh batch buffers the
        consumer's thread faulted in while it waited, a first epoch's, and the
        time that took, counted in wait_s too); after a warm-up (``warm_up=True``)
        warm_up_prefaulted_bytes, warm_up_mapped_bytes and warm_up_s (what it
        did before the first pass stopped it); with ``device=`` also h2d_s (device time of the
        host-to-device copies), h2d_bytes and copy_wait_s (time the consumer
        blocked on a copy); plus ``bottleneck``: "consumer" when the loop
        rarely waits, "h2d" when most of the waiting was on copies, else the
        slowest loader stage.
        """
        active = self._live_pass()
        raw = active.raw_stats() if active is not None else dict(self._last_stats)
        stats = summarize_stats(raw, self.backend)
        warm_up = self._warm_up
        warm = warm_up.stats() if warm_up is not None else self._warm_up_stats  # running, or as it ended
        if warm:
            stats.update(warm_up_prefaulted_bytes=warm["prefaulted_bytes"], warm_up_mapped_bytes=warm["mapped_bytes"],
                         warm_up_s=warm["seconds"])
        return stats

    def reset_stats(self) -> None:
        """Start the counters of the current pass from zero."""
        active = self._live_pass()
        if active is not None:
            active.reset_stats()
        self._last_stats = {}

    def __repr__(self) -> str:
        topology = "from torch.distributed" if not self._topology.explicit else (
            f"rank={self._topology.rank}, world_size={self._topology.world_size}")
        what = repr(self.dataset.url or str(self.dataset.path)) if isinstance(self.dataset, ShardDataset) else (
            repr(self.dataset))
        return (f"ShardLoader({what}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"seed={self.seed}, backend={self.backend!r}, num_threads={self.num_threads}, {topology})")


def native_permutation(order: EpochOrder | ArrayOrder) -> tuple[int, int, int] | None:
    """Return ``(seed, epoch, n)`` when ``native_position_map(order)`` is the native epoch permutation, else None."""
    if isinstance(order, EpochOrder) and order.shuffle:
        return order.seed, order.epoch, order.n
    return None


def native_position_map(order: EpochOrder | ArrayOrder) -> Callable[[np.ndarray], np.ndarray]:
    """Return the map from epoch positions to sample indices that the native backend reads with."""
    if isinstance(order, EpochOrder) and order.shuffle:
        native = native_core()
        seed, epoch, n = order.seed, order.epoch, order.n
        return lambda positions: native.permutation_at(seed, epoch, n, positions)
    if isinstance(order, EpochOrder):
        return lambda positions: positions
    indices = order.indices()
    return lambda positions: indices[positions.astype(np.int64)]
