"""Which rank of how many: given explicitly, or read from ``torch.distributed`` when it is needed.

A loader built before ``init_process_group`` (a Lightning ``Trainer`` creates
the process group inside ``fit``; ``torchrun`` scripts often build data first)
must not freeze ``(0, 1)`` at construction: :class:`Topology` resolves again
each time it is asked, and a pass fixes the answer when it starts.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ArgumentError

MAX_COUNT = 1 << 31  # the largest batch size or world size a loader takes


def _positive_int(name: str, value: Any, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, not {value!r}")
    if value > high:
        raise ArgumentError(f"{name} must be at most {high}, not {value!r}")
    return value


def resolve_distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return (rank, world_size): as given, else from an initialised torch.distributed, else (0, 1)."""
    dist = torch.distributed
    if rank is None and world_size is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = 1 if world_size is None else _positive_int("world_size", world_size)
    rank = 0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ArgumentError(f"rank must be an integer in [0, {world}), not {rank!r}")
    return rank, world


@dataclass(frozen=True)
class Topology:
    """A loader's rank and world size: explicit, or ``None`` for "from torch.distributed when asked"."""

    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.rank is not None or self.world_size is not None:
            resolve_distributed(self.rank, self.world_size)  # validate explicit values now

    @property
    def explicit(self) -> bool:
        """Return whether rank or world size was given (then torch.distributed is never consulted)."""
        return self.rank is not None or self.world_size is not None

    def resolve(self, warn: bool = True) -> tuple[int, int]:
        """Return (rank, world_size) now; without a process group, (0, 1).

        With ``warn``, a single-process answer while the environment announces
        several processes (``WORLD_SIZE`` > 1, as ``torchrun`` sets it) raises a
        ``RuntimeWarning``: every rank would read the whole epoch.
        """
        rank, world = resolve_distributed(self.rank, self.world_size)
        if warn and not self.explicit and world == 1 and _env_world_size() > 1:
            warnings.warn(f"fastload: WORLD_SIZE={_env_world_size()} but torch.distributed is not initialised, "
                          "so this loader reads as a single process (rank 0 of 1); call "
                          "init_process_group first, or pass rank= and world_size=", RuntimeWarning, stacklevel=3)
        return rank, world


def _env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1
