"""An ordered, bounded parallel map over processes, for preprocess_tiles."""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

# The consumer waits on a task in slices of this many seconds, so that a Ctrl-C is seen within one even
# when the kernel hands SIGINT to another thread of this process (an untimed wait there is not interrupted).
WAIT_SLICE_S = 0.1


def ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple], workers: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(result, None)`` or ``(None, exception)`` for each argument tuple, in input order.

    With ``workers <= 1`` everything runs in this process. Otherwise at most
    ``4 * workers`` tasks are in flight, so memory stays bounded however many
    inputs there are. When the consumer stops early (an error, Ctrl-C, the
    generator closed) the workers are killed at once, busy or not (Ctrl-C may
    come inside ``submit``, before its future is recorded): they only compute,
    what they would still return is not wanted, and one stuck in a task (a
    dataset that blocks, a lock inherited through the fork) must not hang the
    caller. A worker that dies shows as ``BrokenProcessPool`` at every task
    not done. Ctrl-C is this process's alone: the workers ignore SIGINT (a
    terminal sends it to the whole process group), so none dies or unwinds
    halfway through sending a result (which wedged the result pipe and hung
    the run, or turned the Ctrl-C into a broken-pool error); they start with
    SIGINT blocked, so that none is interrupted before it ignores it.
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
    executor = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(initializer, initargs))
    pending: deque[Future[Any]] = deque()
    finished = False
    try:
        for args in arg_tuples:
            with _sigint_blocked():  # a submit may start workers and the executor's threads
                pending.append(executor.submit(fn, *args))
            if len(pending) >= window:
                yield _outcome(pending.popleft())
        while pending:
            yield _outcome(pending.popleft())
        finished = True
    finally:
        try:
            if not finished:
                # Not cancelling futures here: the executor's thread fails every pending one once it
                # sees a worker gone, and raises on one cancelled meanwhile (InvalidStateError).
                _kill_workers(executor)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)


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


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread for the block: processes forked and threads started in it inherit the mask.

    A SIGINT arriving meanwhile stays pending and is delivered (as KeyboardInterrupt) when the block ends.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process groups, no fork
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Worker start: ignore SIGINT (the consumer handles Ctrl-C and kills the workers), then unblock it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if initializer is not None:
        initializer(*initargs)


def _outcome(future: Future[T]) -> tuple[T | None, BaseException | None]:
    while not future.done():
        wait((future,), timeout=WAIT_SLICE_S, return_when=FIRST_COMPLETED)
    try:
        return future.result(), None
    except Exception as err:
        return None, err
