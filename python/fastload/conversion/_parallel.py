"""An ordered, bounded parallel map over processes, for preprocess_tiles."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")

# Seconds an early stop waits for the tasks already running before it kills
# their workers. Killing a worker while it sends a result would leave half a
# message in the result pipe, and the executor's thread reading it waiting
# forever; a task running this long after the stop is taken to be stuck.
STOP_GRACE_S = 10.0


def ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple], workers: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(result, None)`` or ``(None, exception)`` for each argument tuple, in input order.

    With ``workers <= 1`` everything runs in this process. Otherwise at most
    ``4 * workers`` tasks are in flight, so memory stays bounded however many
    inputs there are. When the consumer stops early (an error, Ctrl-C, the
    generator closed) the tasks not started are cancelled, the running ones
    get ``STOP_GRACE_S`` to end, and the workers of those still running are
    then killed: a worker stuck in a task (a dataset that blocks, a lock
    inherited through the fork) must not hang the caller. A worker that dies
    shows as ``BrokenProcessPool`` at its task. ``initializer(*initargs)`` runs
    once in each worker process (once in this process when ``workers <= 1``),
    e.g. to hand every worker a dataset once rather than with every task.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        for args in arg_tuples:
            try:
                yield fn(*args), None
            except Exception as err:  # handed to the caller, which decides
                yield None, err
        return
    window = 4 * workers
    executor = ProcessPoolExecutor(max_workers=workers, initializer=initializer, initargs=initargs)
    pending: deque[Future[Any]] = deque()
    finished = False
    try:
        for args in arg_tuples:
            pending.append(executor.submit(fn, *args))
            if len(pending) >= window:
                yield _outcome(pending.popleft())
        while pending:
            yield _outcome(pending.popleft())
        finished = True
    finally:
        try:
            if not finished:
                _stop_early(executor, pending)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)


def _stop_early(executor: ProcessPoolExecutor, pending: Iterable[Future[Any]]) -> None:
    """Cancel the tasks not started; kill the workers if the running ones outlast ``STOP_GRACE_S``.

    A second Ctrl-C while waiting kills them at once.
    """
    running = {future for future in pending if not future.cancel()}  # cancel() fails once a task is queued
    try:
        running = wait(running, timeout=STOP_GRACE_S).not_done
    finally:
        if running:
            _kill_workers(executor)


def _kill_workers(executor: ProcessPoolExecutor) -> None:
    """Kill the executor's worker processes; its manager thread then sees them gone and ends.

    ``ProcessPoolExecutor`` has no public way to stop its workers before
    Python 3.14 (``kill_workers``); its ``_processes`` (pid -> Process) is used
    where that method is missing.
    """
    kill = getattr(executor, "kill_workers", None)
    if kill is not None:
        kill()
        return
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()


def _outcome(future: Future[T]) -> tuple[T | None, BaseException | None]:
    try:
        return future.result(), None
    except Exception as err:
        return None, err
