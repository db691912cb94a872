"""An ordered, bounded parallel map over processes, for preprocess_tiles."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple], workers: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(result, None)`` or ``(None, exception)`` for each argument tuple, in input order.

    With ``workers <= 1`` everything runs in this process. Otherwise at most
    ``4 * workers`` tasks are in flight, so memory stays bounded however many
    inputs there are; the pool is shut down (pending tasks cancelled) when the
    consumer stops early. ``initializer(*initargs)`` runs once in each worker
    process (once in this process when ``workers <= 1``), e.g. to hand every
    worker a dataset once rather than with every task.
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
    try:
        for args in arg_tuples:
            pending.append(executor.submit(fn, *args))
            if len(pending) >= window:
                yield _outcome(pending.popleft())
        while pending:
            yield _outcome(pending.popleft())
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _outcome(future: Future[T]) -> tuple[T | None, BaseException | None]:
    try:
        return future.result(), None
    except Exception as err:
        return None, err
