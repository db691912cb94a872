"""fastload's native core: LMDB shard reading, record decoding and the batch worker pool."""

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

RECORD_MAGIC: int
RECORD_VERSION: int
DEFAULT_MAX_SAMPLE_BYTES: int

# codec id, item size, decoded bytes[, is bool[, height, width, channels, planar (png and jpeg)]]
FieldTuple = tuple[int, int, int] | tuple[int, int, int, bool] | tuple[int, int, int, bool, int, int, int, bool]
# A compiled transform step (fastload.transforms.Step.native): kind, field, in dtype code, in (c, h, w), hwc,
# out dtype code, out (c, h, w), parameter offset, pad/fill bytes, channels, convert mode, scale, mean, std, rects.
StepTuple = tuple[int, int, int, list[int], bool, int, list[int], int, bytes, list[int], int, float, list[float],
                  list[float], int]

def checksum(data: ArrayLike | bytes) -> int:
    """Return XXH3-64 (seed 0) of a buffer's bytes: the record checksum."""

def permutation(seed: int, epoch: int, n: int, start: int, count: int) -> NDArray[np.uint64]:
    """Return the samples at positions [start, start+count) of the epoch order (docs/ORDER.md, v1)."""

def permutation_at(seed: int, epoch: int, n: int, positions: ArrayLike) -> NDArray[np.uint64]:
    """Return the samples at the given positions of the epoch order (docs/ORDER.md, v1)."""

def mix64(z: int) -> int:
    """Return SplitMix64's finaliser of z, as used by the epoch order."""

def decode_record(record: bytes | ArrayLike, fields: Sequence[FieldTuple], out: Sequence[ArrayLike],
                  verify: bool = True, version: int = 3, fingerprint: int = 0, key: int | None = None) -> None:
    """Decode one record into one writable buffer per field (v2, v3: checks the fingerprint, and the key if given)."""

def decode_records(blob: ArrayLike, offsets: ArrayLike, fields: Sequence[FieldTuple], out: Sequence[ArrayLike],
                   verify: bool = True, version: int = 3, fingerprint: int = 0) -> None:
    """Decode records laid end to end in one thread (a benchmark floor; keys are not checked)."""

def library_decode(codec: int, blob: ArrayLike, offsets: ArrayLike, out: ArrayLike, decoded_bytes: int,
                   height: int = 0, width: int = 0, channels: int = 0) -> None:
    """Decode payloads laid end to end with the codec's library alone, one thread (a benchmark floor)."""

def lookup_records(shards: ShardSet, indices: ArrayLike) -> int:
    """Look records up in the shards in one thread without decoding; return their total bytes (a floor)."""

def validate_shard(path: str, expected_records: int, packed: bool = False) -> dict[str, int]:
    """Validate a shard file's whole LMDB structure, and with ``packed`` (format v4) its blocks; return a summary."""

def begin_step() -> None:
    """Mark the start of a loader step (one next()) on this thread; at interpreter exit another thread parks here."""

def end_step() -> None:
    """Mark the end of the step; at interpreter exit a thread other than the finalizing one parks here for good."""

class ShardSet:
    """The shards of one dataset, mapped and validated."""

    def __init__(self, paths: Sequence[str], counts: Sequence[int], packed: Sequence[bool]) -> None: ...
    @staticmethod
    def lazy(counts: Sequence[int], packed: Sequence[bool]) -> ShardSet:
        """Return a set of shards of these record counts, none opened yet: attach() opens each."""
    def attach(self, index: int, path: str) -> None:
        """Open and validate ``path`` as shard ``index`` (once; a second attach keeps the first)."""
    def attached(self, index: int) -> bool:
        """Return whether shard ``index`` is attached."""
    def detach(self, index: int) -> bool:
        """Close shard ``index`` (a lazy set's) unless a batch in flight reads it; return whether it is closed."""
    def __len__(self) -> int: ...
    @property
    def total_records(self) -> int: ...

class ShardRecords:
    """One shard's records, validated, mapped and decoded natively (the Python readers)."""

    def __init__(self, path: str, count: int, fields: Sequence[FieldTuple], verify: bool = True,
                 version: int = ..., fingerprint: int = 0, max_sample_bytes: int = ...) -> None: ...
    def __len__(self) -> int: ...
    @property
    def path(self) -> str: ...
    def decode_rows(self, keys: ArrayLike, rows: ArrayLike, out: Sequence[ArrayLike | None]) -> None:
        """Decode record ``keys[i]`` into row ``rows[i]`` of each field's buffer (None skips a field)."""

class SlotLease:
    """Keeps a batch buffer out of the pool while arrays view it."""

class SlotPool:
    """A reader's batch buffers; hand it to the next reader over the same fields to reuse them."""

    @property
    def slot_bytes(self) -> int: ...
    @property
    def free_slots(self) -> int: ...
    @property
    def total_slots(self) -> int: ...
    def keep_at_most(self, count: int) -> None: ...

class BatchReader:
    """Worker threads decoding batches into pooled buffers."""

    def __init__(self, shards: ShardSet, fields: Sequence[FieldTuple], dtypes: Sequence[np.dtype],
                 shapes: Sequence[Sequence[int]], decode: Sequence[bool], batch_capacity: int, num_threads: int,
                 verify: bool = True, transforms: Sequence[StepTuple] = (),
                 num_params: int = 0, max_sample_bytes: int = ..., record_version: int = 4,
                 schema_fingerprint: int = 0, shard_fingerprints: Sequence[int] = (),
                 pool: SlotPool | None = None, max_running: int = 0) -> None: ...
    @property
    def pool(self) -> SlotPool: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def num_threads(self) -> int: ...
    @property
    def max_running(self) -> int:
        """How many workers decode at once (the others wait for a turn); ``max_running=0`` gives num_threads."""
        ...
    @property
    def free_slots(self) -> int: ...
    @property
    def total_slots(self) -> int: ...
    @property
    def prefault_while_waiting(self) -> bool: ...  # whether the consumer does so (off by default: the loader's policy)
    @prefault_while_waiting.setter
    def prefault_while_waiting(self, on: bool) -> None: ...
    @property
    def pending(self) -> int: ...
    @property
    def ready(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def planned(self) -> int:
        """Planned batches not yet submitted."""
    @property
    def field_offsets(self) -> list[int]: ...
    @property
    def field_bytes(self) -> list[int]: ...
    def add_slot(self, buffer: ArrayLike, reusable: bool = True) -> None: ...
    def add_split_slot(self, buffers: list[ArrayLike | None], reusable: bool = True) -> None: ...
    def reserve_slots(self, count: int) -> np.ndarray | None:
        """Add fresh batch buffers until the pool holds ``count``; return their memory (uint8), or None if it did."""
    def prefault_later(self, region: np.ndarray) -> None:
        """With ``prefault_while_waiting`` on: fault ``region`` (pooled slots' memory) in while waiting."""
    def submit(self, indices: ArrayLike, params: ArrayLike | None = None) -> bool: ...
    def plan(self, indices: ArrayLike, sizes: Sequence[int], params: ArrayLike | None = None,
             permutation: tuple[int, int, int] | None = None) -> None:
        """Queue batches (indices one batch after another, each batch's size); the reader submits them itself.

        With ``permutation=(seed, epoch, n)`` the values are positions of that epoch order, mapped by the workers.
        Over a lazy ``ShardSet`` every shard must be attached (else FastloadError): each then stays attached until
        the plan's last batch is delivered.
        """
    def plan_positions(self, rank_plan: tuple[int, int, int, int, int, int], first: int, stop: int,
                       permutation: tuple[int, int, int] | None = None) -> None:
        """Queue batches ``first`` to ``stop - 1`` of a rank's epoch plan; the reader works out their positions.

        ``rank_plan`` is ``(start, remaining, rank, world_size, samples, batch_size)`` (``EpochPlan``): batch b
        holds ``start + (rank + j * world_size) % remaining`` for j in ``[b * batch_size, min((b + 1) *
        batch_size, samples))``, mapped through ``permutation=(seed, epoch, n)`` when given, else sample indices.
        Refused (FastloadError) with transform parameters, while batches queued by ``plan`` remain, and as
        ``plan`` over a lazy ``ShardSet``.
        """
    def set_window(self, window: int, first_window: int) -> None:
        """Keep at most ``window`` planned batches in flight (``first_window`` until the first is delivered)."""
    def next(self) -> list[np.ndarray]: ...
    def next_count(self) -> int: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, float]: ...
    def reset_stats(self) -> None: ...


class Warmer:
    """A background thread faulting in batch buffers and mapping the shards' cached pages; stop() joins it."""

    def __init__(self, buffer: np.ndarray | None, shards: ShardSet | None, max_mapping_bytes: int) -> None: ...
    def stop(self, wait: bool = True) -> None:
        """Stop the thread (at most one 2 MiB step later) and join it; with ``wait=False`` only ask it to stop."""
    def stats(self) -> dict[str, int | float | bool]:
        """Return what it did so far: prefaulted_bytes, claimed_bytes, mapped_bytes, seconds, done, supported.

        After ``stop(wait=False)`` the thread touches no buffer byte past ``claimed_bytes``.
        """
