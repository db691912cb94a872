"""One pass over a ShardLoader: starts on its first ``next()``, counts what it delivers, closes cleanly.

The iterator knows nothing of the loader: the loader hands it callbacks
(:class:`PassHooks`). A pass is *pending* from ``iter()`` until its first
``next()``, which asks ``begin`` for its epoch, plan and batches, so a
``set_epoch`` or ``load_state_dict`` between ``iter()`` and the first batch
still takes effect (trainers call ``iter()`` before their epoch hooks). A pass
*ends* once: complete when it delivers its last batch, abandoned when it is
closed (``break``, ``del``, an exception) before that; ``ended`` tells the loader.

A pass may be repaired instead of ended by an error (``heal``: a damaged file in a cache replaced):
the batches in flight are dropped (the source closed), and the pass goes on from the batch that
failed (``resume``), so it still delivers exactly its plan's batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .. import _extension
from ..errors import FastloadError
from ._plan import EpochPlan

# The exit gate (csrc/bindings/exit_gate.h), when the extension imported.
begin_step: Callable[[], None] = _extension.native.begin_step if _extension.native is not None else (lambda: None)
end_step: Callable[[], None] = _extension.native.end_step if _extension.native is not None else (lambda: None)

Batch = dict[str, torch.Tensor]
_STAGES = ("read_s", "decompress_s", "copy_s")


@dataclass(frozen=True)
class PassHooks:
    """What a pass needs from its loader.

    ``begin(it)`` fixes the pass's epoch and plan and returns them with the
    batch iterator; ``ended(it, complete)`` reports the end of the pass;
    ``remaining()`` is how many batches a pass started now would deliver.
    ``heal(it, error)``, when given, repairs the cause of an error that
    ``begin`` or the batches raised and returns True (the pass goes on), or
    returns False (the error ends the pass as it is), or raises the error to
    end it with; ``resume(it)`` then returns the batches of the pass from
    ``it.delivered`` on (after ``begin``; before it, ``begin`` is asked again).
    """

    begin: Callable[[EpochIterator], tuple[int, EpochPlan, Iterator[Batch]]]
    ended: Callable[[EpochIterator, bool], None]
    remaining: Callable[[], int]
    heal: Callable[[EpochIterator, Exception], bool] | None = None
    resume: Callable[[EpochIterator], Iterator[Batch]] | None = None


class EpochIterator:
    """One pass over a loader: the batches of one epoch (or of what is left of it after a resume)."""

    def __init__(self, hooks: PassHooks) -> None:
        self._hooks = hooks
        self._inner: Iterator[Batch] | None = None
        self.epoch: int | None = None
        self.plan: EpochPlan | None = None
        self._length = 0  # len(self.plan), once begun
        self.delivered = 0
        self.finished = False  # ended: complete or abandoned
        self.complete = False
        self._counted_from = 0  # batches delivered before the counters were last reset
        self._wait = 0.0
        self._started = time.perf_counter()
        self._busy = threading.Lock()  # one consumer at a time (issue 10)
        self.repaired: set[Any] = set()  # what ``heal`` repaired in this pass (its own keys: once each)

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Batch:
        # A second thread inside next() would race on the pass (two begins, counts, the batch queue):
        # it gets a typed error and the first thread's pass goes on untouched.
        if not self._busy.acquire(blocking=False):
            raise FastloadError("this loader iterator is being consumed by another thread; give each thread its "
                                "own iterator (or its own ShardLoader)")
        # Once the interpreter is exiting, a thread other than the one that finalizes it parks in begin_step or
        # end_step (and the exit waits a moment for steps in flight): it never returns into code that may drop
        # the GIL as finalization begins, which CPython answers with pthread_exit (an abort through C++ frames).
        begin_step()
        try:
            return self._next_batch()
        finally:
            end_step()
            self._busy.release()

    def _next_batch(self, clock: Callable[[], float] = time.perf_counter) -> Batch:
        if self.finished:
            raise StopIteration
        inner = self._inner
        if inner is None:
            self.epoch, self.plan, inner = self._inner_from_begin()
        if self.delivered >= self._length:  # an empty plan: complete without a batch
            self._end(complete=True)
            raise StopIteration
        start = clock()
        try:
            batch = self._next_healed(inner)
        except BaseException:
            self._wait += clock() - start
            self._end(complete=False)
            raise
        self._wait += clock() - start
        if batch is None:  # the batches ran out before the plan did: never pass that off as an epoch's end
            self._end(complete=False)
            raise FastloadError(f"a pass over {self._length} batches stopped after {self.delivered}")
        self.delivered += 1
        if self.delivered == self._length:
            self._end(complete=True)  # the last batch: the epoch is complete now, not on an extra next()
        return batch

    def _inner_from_begin(self) -> tuple[int, EpochPlan, Iterator[Batch]]:
        while True:
            try:
                epoch, plan, inner = self._hooks.begin(self)
                break
            except Exception as err:
                if self._hooks.heal is None or not self._hooks.heal(self, err):
                    raise
        self._inner, self._length, self._started = inner, len(plan), time.perf_counter()
        return epoch, plan, inner

    def _next_healed(self, inner: Iterator[Batch]) -> Batch | None:
        """Return the next batch of ``inner`` (None: it ran out); an error ``heal`` repaired resumes the pass.

        Before ``heal`` runs, the source is closed: its threads joined and the batches in flight dropped
        (they are read again by the resumed pass). Each repair is of a cause ``heal`` had not repaired
        before in this pass (``repaired``), so the loop ends.
        """
        heal, resume = self._hooks.heal, self._hooks.resume
        current: Iterator[Batch] | None = inner
        while True:
            try:
                if current is None:
                    assert resume is not None
                    current = self._inner = resume(self)
                return next(current, None)
            except Exception as err:
                if heal is None or resume is None:
                    raise
                self._close_inner()
                current = None
                if not heal(self, err):
                    raise

    def _close_inner(self) -> None:
        """Close the current source of batches (joins its threads) and leave an exhausted one in its place."""
        inner, self._inner = self._inner, iter(())
        close = getattr(inner, "close", None)
        if close is not None:
            close()

    @property
    def started(self) -> bool:
        """Return whether the first batch was requested (the epoch and plan are fixed)."""
        return self._inner is not None

    def _end(self, complete: bool) -> None:
        if self.finished:
            return
        self.finished, self.complete = True, complete
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            self._hooks.ended(self, complete)

    def _samples(self) -> int:
        """Return the samples delivered since the counters were reset: the plan's, not counted batch by batch."""
        plan = self.plan
        if plan is None:
            return 0
        return min(self.delivered * plan.batch_size, plan.samples) - min(self._counted_from * plan.batch_size,
                                                                        plan.samples)

    def raw_stats(self, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
        """Return this pass's counters (the native reader's included).

        ``clock`` is bound at definition: ``__del__`` ends a pass at interpreter exit, when module globals are gone.
        """
        stats: dict[str, Any] = {}
        native = getattr(self._inner, "stats", None)
        if callable(native):
            stats.update(native())
        stats.update({"batches": self.delivered - self._counted_from, "samples": self._samples(), "wait_s": self._wait,
                      "wall_s": clock() - self._started})
        return stats

    def reset_stats(self) -> None:
        """Zero the counters of this pass."""
        self._counted_from, self._wait, self._started = self.delivered, 0.0, time.perf_counter()
        reset = getattr(self._inner, "reset_stats", None)
        if callable(reset):
            reset()

    def close(self) -> None:
        """Stop this pass and release its threads; before its last batch this abandons the pass."""
        self._end(complete=False)

    def __del__(self) -> None:
        if not getattr(self, "finished", True):
            try:
                self.close()
            except Exception:  # interpreter shutdown: nothing left to report to
                pass

    def __len__(self) -> int:
        """Return the batches this pass has still to deliver (all of them before it starts)."""
        if self.finished:
            return 0
        if self.plan is None:
            return self._hooks.remaining()
        return len(self.plan) - self.delivered


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
    elif stats.get("copy_wait_s", 0.0) > 0.5 * stats.get("wait_s", 0.0):
        stats["bottleneck"] = "h2d"
    elif all(k in stats for k in _STAGES):
        stats["bottleneck"] = max(_STAGES, key=lambda k: stats[k])[:-2]
    else:
        stats["bottleneck"] = "loader"
    return stats

