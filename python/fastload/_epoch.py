"""The iterator of one pass over a ShardLoader: counts what it delivers, times waits, closes cleanly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ._plan import EpochPlan

if TYPE_CHECKING:
    from ._loader import ShardLoader

_STAGES = ("read_s", "decompress_s", "copy_s")


class EpochIterator:
    """Wraps one epoch's batch iterator; tells the loader when the pass completes."""

    def __init__(self, loader: ShardLoader, inner: Iterator[dict[str, torch.Tensor]], epoch: int,
                 plan: EpochPlan) -> None:
        self._loader, self._inner, self.epoch, self.plan = loader, inner, epoch, plan
        self.delivered = 0
        self.finished = False
        self._samples = 0
        self._wait = 0.0
        self._started = time.perf_counter()

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        try:
            batch = next(self._inner)
        except StopIteration:
            self._finish()
            raise
        finally:
            self._wait += time.perf_counter() - start
        self.delivered += 1
        self._samples += len(next(iter(batch.values())))
        return batch

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self._loader._remember_stats(self.raw_stats())
            self._loader._epoch_done(self)

    def raw_stats(self) -> dict[str, Any]:
        """Return this pass's counters (the native reader's included)."""
        stats: dict[str, Any] = {}
        native = getattr(self._inner, "stats", None)
        if callable(native):
            stats.update(native())
        stats.update({"batches": self.delivered, "samples": self._samples, "wait_s": self._wait,
                      "wall_s": time.perf_counter() - self._started})
        return stats

    def reset_stats(self) -> None:
        """Zero the counters of this pass."""
        self._samples, self._wait, self._started = 0, 0.0, time.perf_counter()
        reader = getattr(self._inner, "_reader", None)
        if reader is not None:
            reader.reset_stats()

    def close(self) -> None:
        """Stop this pass early and release its threads."""
        self._loader._remember_stats(self.raw_stats())
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        if not self.finished and hasattr(self, "_inner"):
            try:
                self.close()
            except Exception:  # interpreter shutdown: nothing left to report to
                pass

    def __len__(self) -> int:
        return len(self.plan)


def summarize_stats(raw: dict[str, Any], backend: str) -> dict[str, Any]:
    """Add ``wait_share`` and ``bottleneck`` to raw counters."""
    stats = dict(raw)
    stats["backend"] = backend
    wall = stats.get("wall_s", 0.0)
    stats["wait_share"] = stats.get("wait_s", 0.0) / wall if wall > 0 else 0.0
    if not stats.get("batches"):
        stats["bottleneck"] = None
    elif stats["wait_share"] < 0.1:
        stats["bottleneck"] = "consumer"
    elif all(k in stats for k in _STAGES):
        stats["bottleneck"] = max(_STAGES, key=lambda k: stats[k])[:-2]
    else:
        stats["bottleneck"] = "loader"
    return stats
