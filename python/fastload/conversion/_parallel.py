"""An ordered, bounded parallel map over processes, for preprocess_tiles."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")

# Seconds an early stop gives the tasks already running before it kills every
# worker. Results are discarded after a stop, so this is not about losing
# work: a task still running this long after the stop is taken to be stuck.
STOP_GRACE_S = 5.0


def ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple], workers: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(result, None)`` or ``(None, exception)`` for each argument tuple, in input order.

    With ``workers <= 1`` everything runs in this process. Otherwise at most
    ``4 * workers`` tasks are in flight, so memory stays bounded however many
    inputs there are. When the consumer stops early (an error, Ctrl-C, the
    generator closed) the tasks not yet queued to a worker are cancelled, the
    others get ``STOP_GRACE_S`` to end, and if any is still running then
    every worker is killed: a worker stuck in a task (a dataset that blocks, a
    lock inherited through the fork) must not hang the caller. A worker that
    dies shows as ``BrokenProcessPool`` at every task not yet done.
    ``initializer(*initargs)`` runs once in each worker process (once in this
    process when ``workers <= 1``), e.g. to hand every worker a dataset once
    rather than with every task.
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
                yield _next_outcome(pending)
        while pending:
            yield _next_outcome(pending)
        finished = True
    finally:
        try:
            if not finished:
                _stop_early(executor, pending)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)


def _next_outcome(pending: deque[Future[T]]) -> tuple[T | None, BaseException | None]:
    """Return the oldest task's outcome; the task stays in ``pending`` while waited on (Ctrl-C may come then)."""
    outcome = _outcome(pending[0])
    pending.popleft()
    return outcome


def _stop_early(executor: ProcessPoolExecutor, pending: Iterable[Future[Any]]) -> None:
    """Cancel the tasks not queued yet; kill every worker if the others outlast ``STOP_GRACE_S``.

    Also kills when the pool is broken (a worker died: the executor then
    SIGTERMs the others and joins them, which a stuck worker that handles
    SIGTERM would block), and at once on a second Ctrl-C while waiting.
    """
    not_done = {future for future in pending if not future.cancel()}  # cancel() fails once queued or done
    try:
        not_done = wait(not_done, timeout=STOP_GRACE_S).not_done
    finally:
        if not_done or getattr(executor, "_broken", False):
            _kill_workers(executor)


def _kill_workers(executor: ProcessPoolExecutor) -> None:
    """Kill and reap the executor's worker processes, and make sure its manager thread can end.

    ``ProcessPoolExecutor`` has no public way to do this before Python 3.14,
    and 3.14's ``kill_workers`` drops the handles ``shutdown(wait=True)`` needs
    to join its thread: its ``_processes`` and ``_result_queue`` are used.
    A worker killed while sending a result leaves half a message in the
    result pipe and the manager thread blocked reading the rest; with every
    worker dead, closing this process's write end of that pipe turns the read
    into end-of-file, and the pool breaks and ends.
    """
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join()
    results = getattr(executor, "_result_queue", None)
    if results is not None:
        results._writer.close()


def _outcome(future: Future[T]) -> tuple[T | None, BaseException | None]:
    try:
        return future.result(), None
    except Exception as err:
        return None, err
