"""``ShardDataset``: the pure-Python reader of a shard dataset, a map-style torch Dataset.

It is the reference the native reader is tested against and the dataset the
``backend="torch"`` fallback hands to ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._extension import require as native_core
from ..errors import (
    ArgumentError,
    CorruptRecordError,
    CorruptShardError,
    DatasetError,
    FastloadError,
    RemoteError,
    ShardNotFoundError,
)
from ..format._manifest import Manifest, load_manifest
from ..format._record import Field, max_sample_bytes
from ..format._shard_files import check_shard_files
from ..format._splits import resolve_dataset_path
from ..storage import CachedDataset, RemoteSpec, is_remote, open_remote, reopen_cached
from ..storage._heal import advised, heal_shard, names_file
from ._subset import ShardSubset

_HOLD_ATTEMPTS = 20  # a windowed shard evicted between its fetch and its hold this often: an error


@contextmanager
def changes_named(datasets: Sequence[ShardDataset]) -> Iterator[None]:
    """Open shards of ``datasets`` within this block, naming a dataset rewritten in place since it was opened.

    A shard that fails its checks because its dataset changed after it was opened raises
    :meth:`ShardDataset.raise_if_changed`'s error instead of being reported as corrupt.
    """
    try:
        yield
    except (CorruptShardError, CorruptRecordError, ShardNotFoundError) as err:
        for ds in datasets:
            ds.raise_if_changed(err)
        raise


def empty_batch(count: int, field: Field, shared: bool) -> torch.Tensor:
    """Return an uninitialised ``[count, *shape]`` tensor of the field's dtype (in shared memory when ``shared``)."""
    dtype = torch.from_numpy(np.empty(0, field.np_dtype)).dtype
    shape = (count, *field.shape)
    if not shared:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(max(1, count * field.nbytes))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, torch.empty(shape, device="meta").stride())


def check_sample_fits(directory: Path, manifest: Manifest) -> None:
    """Refuse, before any allocation, a sample whose decoded bytes exceed this machine's physical memory."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX: no bound known
        return
    sample = sum(f.nbytes for f in manifest.fields)
    if memory > 0 and sample > memory:
        raise DatasetError(f"{directory}: a sample of {sample} decoded bytes does not fit in this machine's memory "
                           f"({memory} bytes)")


def select_fields(schema: Sequence[Field], fields: Sequence[str] | None) -> list[Field]:
    """Return the schema fields named by ``fields`` (all when None); raise ValueError on an unknown name."""
    if fields is None:
        return list(schema)
    if isinstance(fields, str):
        fields = [fields]
    names = [f.name for f in schema]
    known, chosen = set(names), set(fields)  # sets: a schema holds up to MAX_FIELDS fields
    unknown = [n for n in fields if n not in known]
    if unknown:
        raise ArgumentError(f"unknown field(s) {unknown}; the dataset has {names}")
    if not fields:
        raise ArgumentError("fields must name at least one field")
    return [f for f in schema if f.name in chosen]


def locate_in_parts(starts: Sequence[int], index: int) -> tuple[int, int]:
    """Return (part, index within it) of ``index`` over parts beginning at ``starts`` (the last entry: the total).

    A negative ``index`` counts from the end, as in a list; one outside raises IndexError.
    """
    n = starts[-1]
    if index < 0:
        index += n
    if not 0 <= index < n:
        raise IndexError(f"sample index {index} out of range for {n} samples")
    part = bisect.bisect_right(starts, index) - 1
    return part, index - starts[part]


class ShardDataset(torch.utils.data.Dataset):
    """A map-style dataset over a shard dataset directory: ``ds[i]`` is a dict of field name to tensor.

    Opens each shard lazily through the native core (``_native.ShardRecords``:
    the LMDB structure validated once, the file mapped, records decoded by the
    same decoders as the native loader, so both backends accept and refuse the
    same bytes, and a shard that shrinks while read is a ``CorruptShardError``
    naming it, never SIGBUS). It pickles to ``spawn`` workers (which open their
    own handles) and works in ``fork`` workers (which use the inherited
    read-only mappings). Scalars come back as 0-d tensors, arrays with the
    schema's dtype and shape. A shard whose real path leaves the dataset
    directory (a symbolic link out of it) is refused unless
    ``allow_external_shards`` is true.

    ``path`` may be a URL of object storage (``s3://``, ``gs://``, ``az://``,
    ``https://``; needs ``fastload[remote]``): the manifest is fetched and
    checked, and each shard is downloaded into ``cache_dir`` (default
    ``$FASTLOAD_CACHE_DIR`` or the per-user cache) when it is first needed (a
    ``ShardLoader`` fetches ahead, in the order of its epoch), checked against
    the manifest's hash, never more than ``cache_limit`` bytes in all (an int
    or a size such as ``"50GB"``), and the cached copy is read as a local one.
    ``storage_options`` are obstore's settings (``endpoint``, ``region``,
    ``allow_http``, credentials...) plus ``max_retries`` and
    ``retry_timeout_s``; without them credentials come from the standard
    places (``AWS_*`` variables, ``GOOGLE_APPLICATION_CREDENTIALS``, ...).
    ``predownload`` bounds how far a loader's downloads run ahead of its
    reader: at most that many shards first read from the next batch on
    (``"auto"``: 16, twice the downloads at once; ``"all"``: no bound; ``0``:
    each shard when a batch needs it).
    """

    def __init__(self, path: str | os.PathLike, fields: Sequence[str] | None = None,
                 verify_checksums: bool = True, split: str | None = None,
                 allow_external_shards: bool = False, storage_options: Any = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
                 predownload: int | str = "auto") -> None:
        self.url: str | None = None  # a remote dataset's URL (without secrets)
        self._remote: tuple[str, RemoteSpec] | None = None
        self._cached: CachedDataset | None = None
        if is_remote(path):
            assert isinstance(path, str)
            spec = RemoteSpec.build(storage_options, cache_dir, cache_limit, predownload)
            self._cached = open_remote(path, split, spec)
            self.url, self._remote = self._cached.url, (self._cached.source_url, spec)
            path, split = self._cached.path, None
        elif (storage_options is not None or cache_dir is not None or cache_limit is not None
              or not (isinstance(predownload, str) and predownload == "auto")):
            raise ArgumentError(f"storage_options, cache_dir, cache_limit and predownload are for a dataset in "
                                f"object storage (s3://, gs://, az://, https://), not the local path {str(path)!r}")
        self.path = resolve_dataset_path(path, split)  # a root with splits.json needs split=
        self.manifest = load_manifest(self.path)
        self.allow_external_shards = bool(allow_external_shards)
        check_sample_fits(self.path, self.manifest)
        if self._cached is None:  # a remote version's shards arrive later, under the names the manifest fixes
            check_shard_files(self.path, self.manifest, self.allow_external_shards)
        self.fields = select_fields(self.manifest.fields, fields)
        self.verify_checksums = verify_checksums
        chosen = {f.name for f in self.fields}  # names are unique; a list's `in` made opening quadratic
        self._wanted = [f.name in chosen for f in self.manifest.fields]
        self._fingerprints = self.manifest.record_fingerprints()  # v3: each shard's binding to this dataset
        self._starts = [0]
        for shard in self.manifest.shards:
            self._starts.append(self._starts[-1] + shard.count)
        self._envs: dict[int, Any] = {}

    @property
    def classes(self) -> list[str] | None:
        """Return the class names (label ``i`` is ``classes[i]``), or None when labels are plain integers."""
        classes = self.manifest.extra.get("classes")
        return [str(c) for c in classes] if isinstance(classes, list) else None

    @property
    def target_fields(self) -> tuple[str, ...]:
        """Return the fields the conversion wrote as targets (``--targets``): resampled nearest by default."""
        names = {f.name for f in self.fields}
        targets = self.manifest.extra.get("targets")
        return tuple(t for t in targets if isinstance(t, str) and t in names) if isinstance(targets, list) else ()

    @property
    def schema(self) -> list[Field]:
        """Return the fields this dataset yields, in schema order."""
        return list(self.fields)

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """Return (shard number, key within the shard) of global sample ``index``."""
        return locate_in_parts(self._starts, index)

    def _env(self, shard: int) -> Any:
        env = self._envs.get(shard)
        if env is None:
            if self._cached is not None:  # remote: fetched first when it is not in the cache yet
                self._fetch(shard)
            info = self.manifest.shards[shard]
            fields = [f.native_spec for f in self.manifest.fields]
            with changes_named([self]):
                env = self._envs[shard] = native_core().ShardRecords(
                    str(self.path / info.file), info.count, fields, self.verify_checksums,
                    self.manifest.format_version, self._fingerprints[shard], max_sample_bytes())
        return env

    def raise_if_changed(self, err: Exception) -> None:
        """Raise :class:`DatasetError` when this local dataset's manifest changed since it was opened.

        Shards are opened when first read: a dataset rewritten in place after it was opened (``fastload
        upgrade``, a conversion writing over it) has shards its manifest does not describe. Their checks
        then fail (``err``); this names the cause instead of reporting the new shards as corrupt.
        """
        if self._cached is not None:  # a remote version's files are the cache's, fixed by their hashes
            return
        try:
            current: Manifest | None = load_manifest(self.path)
        except FastloadError:
            current = None
        if current is not None and current.to_json() == self.manifest.to_json():
            return
        now = "is gone or unreadable" if current is None else "was rewritten"
        raise DatasetError(f"{self.path}: the dataset changed after it was opened: its manifest {now} (by "
                           f"`fastload upgrade`, or a conversion over it?), and the shards no longer match the "
                           f"manifest read then; open the dataset again ({err})") from err

    def _fetch(self, shard: int) -> None:
        """Have a remote shard in the cache; of a windowed version, held (and the one shard this dataset holds)."""
        assert self._cached is not None
        fetcher = self._cached.fetcher
        if not fetcher.windowed:
            fetcher.ensure(shard)
            return
        self.close()  # a window of shards at a time: this dataset holds one (read_batch goes shard by shard)
        for _ in range(_HOLD_ATTEMPTS):
            fetcher.ensure(shard)
            hold = fetcher.hold(shard)  # None: evicted by another process between the two
            if hold is not None:
                self.__dict__.setdefault("_holds", {})[shard] = hold
                return
        raise RemoteError(f"{self.url}/{self.manifest.shards[shard].file}: evicted {_HOLD_ATTEMPTS} times before it "
                          "could be read; the cache is too small for the processes sharing it (raise cache_limit)")

    def read_arrays(self, index: int) -> list[np.ndarray]:
        """Return the selected fields of sample ``index`` as numpy arrays, in schema order."""
        shard, key = self.locate(int(index))
        out = [np.empty(f.nbytes, dtype=np.uint8) if wanted else None
               for f, wanted in zip(self.manifest.fields, self._wanted)]
        self._decode(shard, np.array([key], np.uint64), np.zeros(1, np.uint64), out)
        return [a.view(f.np_dtype).reshape(f.shape) for a, f in zip(out, self.manifest.fields) if a is not None]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        arrays = self.read_arrays(index)
        return {f.name: torch.from_numpy(a) for f, a in zip(self.fields, arrays)}

    def read_batch(self, indices: Sequence[int], shared: bool = False) -> dict[str, torch.Tensor]:
        """Return samples ``indices`` as one batch: ``{name: tensor[len(indices), *shape]}``.

        Each record is decoded straight into its row of one array per field,
        one native call per shard touched: no tensor per sample and no
        collation. ``shared=True`` allocates the batch in shared memory, so a
        DataLoader worker sends it to the main process without a copy.
        """
        count = len(indices)
        tensors = {f.name: empty_batch(count, f, shared) for f in self.fields}
        rows = [tensors[f.name].view(torch.uint8).reshape(count, f.nbytes).numpy() if wanted else None
                for f, wanted in zip(self.manifest.fields, self._wanted)]
        by_shard: dict[int, tuple[list[int], list[int]]] = {}
        for position, index in enumerate(indices):
            shard, key = self.locate(int(index))
            keys, positions = by_shard.setdefault(shard, ([], []))
            keys.append(key)
            positions.append(position)
        for shard, (keys, positions) in by_shard.items():
            self._decode(shard, np.array(keys, np.uint64), np.array(positions, np.uint64), rows)
        return tensors

    def _decode(self, shard: int, keys: np.ndarray, positions: np.ndarray, out: list[Any]) -> None:
        """Decode records ``keys`` of ``shard`` into rows ``positions`` of ``out`` (``decode_rows``).

        A remote dataset's cached copy found damaged (a record's checksum, the LMDB structure) is healed
        (``storage/_heal.py``: downloaded again when it no longer matches its manifest) and read again,
        once; a second failure is the typed error, its message saying what to run. A local dataset's
        error is raised as it is.
        """
        info = self.manifest.shards[shard]
        try:
            self._env(shard).decode_rows(keys, positions, out)
            return
        except (CorruptRecordError, CorruptShardError) as err:
            if self._cached is None or not names_file(err, self.path / info.file):
                raise
            damage: Exception = err
        self._forget(shard)
        assert self.url is not None
        heal_shard(self._cached.fetcher, shard, info, damage, self.url)
        try:
            self._env(shard).decode_rows(keys, positions, out)
        except (CorruptRecordError, CorruptShardError) as again:
            if not names_file(again, self.path / info.file):
                raise
            self._forget(shard)
            raise advised(again, self.url, info) from None
        except RemoteError as failed:  # set aside by another process that heals it, and fetching it failed here
            raise advised(damage, self.url, info, f"it was set aside to be downloaded again, which failed: {failed}") \
                from None

    def _forget(self, shard: int) -> None:
        """Unmap ``shard`` in this process and let go of its hold (a windowed version's), if any."""
        self._envs.pop(shard, None)
        hold = self.__dict__.get("_holds", {}).pop(shard, None)
        if hold is not None:
            hold.release()

    def subset(self, indices: Any) -> Any:
        """Return a :class:`~fastload.ShardSubset`: the samples ``indices`` (integers in range), in that order.

        A ``ShardLoader`` over the subset reads it through this dataset with
        ``indices=`` (shuffled among themselves with ``shuffle=True``).
        """
        return ShardSubset(self, indices)

    def with_fields(self, fields: Sequence[str] | None, verify_checksums: bool) -> ShardDataset:
        """Return this dataset reading ``fields`` (all when None), a remote one from the same cached copy."""
        if self._cached is None:
            return ShardDataset(self.path, fields, verify_checksums, allow_external_shards=self.allow_external_shards)
        # Remote: the same cached version and fetcher; its shards may not be here yet, so no file is checked.
        dataset = ShardDataset.__new__(ShardDataset)
        dataset.__dict__.update(self.__dict__)
        dataset.fields = select_fields(self.manifest.fields, fields)
        dataset.verify_checksums = verify_checksums
        chosen = {f.name for f in dataset.fields}
        dataset._wanted = [f.name in chosen for f in self.manifest.fields]
        dataset._envs = {}
        dataset.__dict__.pop("_holds", None)
        return dataset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_envs"] = {}
        state.pop("_holds", None)
        state["_cached"] = None  # a lock of this process; the receiver takes its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "_fingerprints" not in state:  # pickled before format v3: one schema fingerprint for every shard
            self.__dict__.pop("_fingerprint", None)
            self._fingerprints = self.manifest.record_fingerprints()
        self.__dict__.setdefault("url", None)
        self.__dict__.setdefault("_remote", None)
        self.__dict__.setdefault("_cached", None)  # pickled before remote datasets: a local one
        if self._remote is not None:  # the same version, held against eviction here too, offline when whole
            url, spec = self._remote
            self._cached = reopen_cached(url, self.path, spec)

    def close(self) -> None:
        """Unmap the shards this process opened (they open again on the next read)."""
        self._envs = {}
        for hold in self.__dict__.pop("_holds", {}).values():  # the shards are unmapped: eviction may take them
            hold.release()

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in self.fields)
        where = self.url if self.url is not None else str(self.path)
        return f"ShardDataset({where!r}, {len(self)} samples, {fields})"
