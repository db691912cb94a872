"""An ordered, bounded parallel map over processes, for preprocess_tiles."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from ..errors import _unwinding_ctrl_c
from ._dask_map import dask_ordered_map

T = TypeVar("T")

# The consumer waits on a task in slices of this many seconds, so that a Ctrl-C is seen within one even
# when the kernel hands SIGINT to another thread of this process (an untimed wait there is not interrupted).
WAIT_SLICE_S = 0.1


def ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple], workers: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = (), client: Any = None,
                fresh_workers: bool = False) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(result, None)`` or ``(None, exception)`` for each argument tuple, in input order.

    With a Dask ``client`` (a ``distributed.Client``) the tasks run on its
    cluster instead, with the same contract (``_dask_map.dask_ordered_map``),
    and ``workers`` is not used.

    With ``workers <= 1`` everything runs in this process. Otherwise at most
    ``4 * workers`` tasks are in flight, so memory stays bounded however many
    inputs there are. When the map ends (all results taken, or the consumer
    stopped early: an error, Ctrl-C, the generator closed) the workers are
    killed at once, busy or not (Ctrl-C may come inside ``submit``, before its
    future is recorded; a polite shutdown at the end once waited for ever on a
    worker that never took its sentinel): they only compute,
    what they would still return is not wanted, and one stuck in a task (a
    dataset that blocks, a lock inherited through the fork) must not hang the
    caller. A worker that dies shows as ``BrokenProcessPool`` at every task
    not done. Ctrl-C is this process's alone: the workers ignore SIGINT (a
    terminal sends it to the whole process group), so none dies or unwinds
    halfway through sending a result (which wedged the result pipe and hung
    the run, or turned the Ctrl-C into a broken-pool error); they start with
    SIGINT blocked, so that none is interrupted before it ignores it. A
    KeyboardInterrupt is held back while a ``submit`` forks workers (raised
    halfway through, it left a worker forked but not recorded, so never
    killed: it held the command's output pipes open for ever). On Linux a
    worker also dies with the process that started it, however that ends.
    ``initializer(*initargs)`` runs once in each worker process (once in this
    process when ``workers <= 1``), e.g. to hand every worker a dataset once
    rather than with every task. With ``fresh_workers`` the workers are fresh
    interpreters (``spawn``) rather than forks of this process: tasks that read
    object storage need that, as obstore's runtime does not survive a fork.
    """
    if client is not None:
        yield from dask_ordered_map(client, fn, arg_tuples, initializer, initargs)
        return
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        for args in arg_tuples:
            try:
                outcome: tuple[T | None, BaseException | None] = (fn(*args), None)
            except Exception as err:  # handed to the caller, which decides
                if _unwinding_ctrl_c(err):
                    raise KeyboardInterrupt from err
                outcome = (None, err)
            yield outcome
        return
    window = 4 * workers
    # Fresh interpreters, not the fork server: its workers are its children, so the kernel's parent-death
    # signal cannot tie them to this process (measured: this process SIGKILLed, the server and its
    # workers lived on); the fork server would save about a second per conversion (two pools).
    context = multiprocessing.get_context("spawn" if fresh_workers else None)
    # The kernel's parent-death signal follows the thread that forks: the main thread ends last.
    die_with_parent = (threading.current_thread() is threading.main_thread()
                       and context.get_start_method() in ("fork", "spawn"))
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_start_worker,
                                   initargs=(os.getpid() if die_with_parent else None, initializer, initargs))
    pending: deque[Future[Any]] = deque()
    try:
        for args in arg_tuples:
            with _sigint_blocked(), _keyboard_interrupt_deferred():  # a submit may start workers and threads
                pending.append(executor.submit(fn, *args))
            if len(pending) >= window:
                yield _outcome(pending.popleft())
        while pending:
            yield _outcome(pending.popleft())
    finally:
        try:
            # Killed whether the map finished or not: they only compute, and every result wanted has
            # been received. A polite shutdown sends each worker a sentinel through the task queue and
            # joins it; a worker that never takes it (seen: one waiting for ever on the queue's lock)
            # hung the run at its very end. Not cancelling futures here: the executor's thread fails
            # every pending one once it sees a worker gone, and raises on one cancelled meanwhile.
            # A Ctrl-C is held back meanwhile: raised halfway (one worker killed, the other not), it left
            # the live one waiting for ever on the task queue's lock, which the killed one held (an idle
            # worker holds it while it waits for a task), and the shutdown below joining it.
            with _sigint_blocked(), _keyboard_interrupt_deferred():
                _kill_workers(executor)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)


def threaded_ordered_map(fn: Callable[..., T], arg_tuples: Iterable[tuple],
                         threads: int) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(fn(*args), None)`` or ``(None, error)`` per argument tuple, in order, from ``threads`` threads.

    For tasks that mostly wait on the network (probing sources in object storage: a download, then a
    header read): no process pool to start (fresh interpreters, about half a second each), and the
    store's client releases the GIL while it downloads. At most ``4 * threads`` tasks are in flight.
    """
    pending: deque[Future[Any]] = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fastload-probe") as pool:
        try:
            for args in arg_tuples:
                pending.append(pool.submit(fn, *args))
                if len(pending) >= 4 * threads:
                    yield _thread_outcome(pending.popleft())
            while pending:
                yield _thread_outcome(pending.popleft())
        finally:
            for future in pending:
                future.cancel()


def _thread_outcome(future: Future[Any]) -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except Exception as err:  # handed to the caller, which decides
        if _unwinding_ctrl_c(err):
            raise KeyboardInterrupt from err
        return None, err


def _kill_workers(executor: ProcessPoolExecutor) -> None:
    """Kill and reap the executor's worker processes, and make sure its manager thread can end.

    ``ProcessPoolExecutor`` has no public way to do this before Python 3.14,
    and 3.14's ``kill_workers`` drops the handles ``shutdown(wait=True)`` needs
    to join its thread: its ``_processes`` and ``_result_queue`` are used.
    A worker killed while sending a result leaves half a message in the
    result pipe and the manager thread blocked reading the rest; with every
    worker dead, closing this process's write end of that pipe turns the read
    into end-of-file, and the pool breaks and ends (its thread then closes the
    task pipe's read end itself: closing it here too raced with that thread, a
    double close of one descriptor).
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


@contextmanager
def _keyboard_interrupt_deferred() -> Iterator[None]:
    """Hold back a Ctrl-C's KeyboardInterrupt until the block ends, then raise it (in the main thread).

    Blocking SIGINT in this thread is not enough: the kernel may hand the signal to another thread, whose
    C handler marks it pending, and the main thread raises KeyboardInterrupt at its next bytecode whatever
    its mask. Elsewhere than the main thread (where Python runs no signal handler), or with a handler that
    is not Python's own, the block runs as it is.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def _start_worker(parent: int | None, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Worker start: ignore SIGINT (the consumer handles Ctrl-C and kills the workers), then unblock it.

    With ``parent`` (its process id, when it started the worker from its main thread) on Linux, the
    worker is killed when that process ends, however it ends (SIGKILL, a crash): it must not live on
    blocked on the task queue, holding the parent's pipes.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if parent is not None:
        _die_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def _resolve_prctl() -> Callable[..., int] | None:
    """Return libc's ``prctl`` (Linux), resolved here in the parent: a forked worker must not dlopen."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once at import, before any fork: dlopen/dlsym in a child forked from a process with other
# threads can wait for ever on a loader lock one of those threads held at the fork.
_PRCTL = _resolve_prctl()


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` ends (``prctl(PR_SET_PDEATHSIG)``); exit if it has."""
    pr_set_pdeathsig = 1
    if _PRCTL is None or _PRCTL(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not fatal: the parent kills its workers on every exit path it sees
    if os.getppid() != parent:  # it ended before the request took effect
        os._exit(1)


def _outcome(future: Future[T]) -> tuple[T | None, BaseException | None]:
    while not future.done():
        wait((future,), timeout=WAIT_SLICE_S, return_when=FIRST_COMPLETED)
    try:
        return future.result(), None
    except Exception as err:
        return None, err
