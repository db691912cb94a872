"""The ordered, bounded map of ``_parallel.ordered_map`` on a Dask cluster (``distributed``).

Same contract as the process pool: results in input order, ``(result, None)``
or ``(None, exception)`` per task, a bounded window of tasks in flight, the
tasks cancelled when the map ends early (an error, Ctrl-C, the generator
closed). Dask only computes: the driver (this process) still plans every task
and writes every shard, in order, so the output is the one-machine output
byte for byte however many workers there are and however often Dask reruns a
task after a worker died (tasks are pure: the same inputs give the same bytes,
and they write nothing).

``initializer(*initargs)`` (a dataset handed once to each worker) becomes: the
``initargs`` held by one task of their own (``fastload-initargs-<token>``, a
key every task depends on), and a small wrapper around each task that calls
the initializer in a worker process the first time a task of this map runs
there (``_run_task``). A worker fetches the ``initargs`` from a peer on its
first task. They are a computed key, not scattered data, on purpose: Dask's
active memory manager keeps one replica of a key, and a scattered key whose
worker dies is lost for good (every task of the map cancelled), where a
computed one is computed again on another worker.

``distributed`` is imported only here, and only when a client is used: local
users do not install it (the extra ``fastload[dask]``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError
from typing import Any, TypeVar

from ..errors import ArgumentTypeError, ClusterError
from ._worker_heap import heap_kept

T = TypeVar("T")

EXTRA = 'pip install "fastload[dask]"'
CONNECT_TIMEOUT_S = 30.0
TASKS_PER_THREAD = 4  # the window: this many tasks in flight per worker thread of the cluster
INITARGS_KEY = "fastload-initargs"  # the key of the task that holds a map's initargs, with the map's token
_WINDOW_REFRESH_S = 1.0  # how often the window follows workers joining or leaving


def require_distributed() -> Any:
    """Return the ``distributed`` module, or raise ClusterError naming the extra to install."""
    try:
        import distributed
    except ImportError as err:
        raise ClusterError(f"converting on a Dask cluster needs Dask's distributed ({err}); install it with: "
                           f"{EXTRA}") from None
    return distributed


def check_client(client: Any) -> None:
    """Raise ArgumentTypeError unless ``client`` is a ``distributed.Client`` (ClusterError without distributed)."""
    distributed = require_distributed()
    if not isinstance(client, distributed.Client):
        raise ArgumentTypeError(f"client must be a dask.distributed.Client, not {type(client).__name__}")
    if client.status not in ("running", "connecting"):
        raise ClusterError(f"client: the Dask client is {client.status}, not running")


def connect(scheduler: str, timeout: float = CONNECT_TIMEOUT_S) -> Any:
    """Return a ``distributed.Client`` connected to ``scheduler``: an address or a scheduler file.

    ``scheduler``: ``tcp://host:8786`` (any Dask address; ``host:port`` alone
    is tcp), or the path of a scheduler file (JSON, written by ``dask
    scheduler --scheduler-file``): an existing file, or a name ending in
    ``.json``. Raises ClusterError when the scheduler does not answer within
    ``timeout`` seconds or the file is missing or unreadable.
    """
    distributed = require_distributed()
    is_file = "://" not in scheduler and (os.path.isfile(scheduler) or scheduler.lower().endswith(".json"))
    try:
        if is_file:
            if not os.path.isfile(scheduler):  # Client would wait for it to appear, without a timeout
                raise ClusterError(f"{scheduler}: no such scheduler file")
            return distributed.Client(scheduler_file=scheduler, timeout=timeout, set_as_default=False)
        return distributed.Client(scheduler, timeout=timeout, set_as_default=False)
    except ClusterError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as err:  # OSError: timed out, refused; others: a bad file
        what = f"scheduler file {scheduler}" if is_file else f"scheduler {scheduler}"
        raise ClusterError(f"cannot reach the Dask {what} within {timeout:g} s: {type(err).__name__}: "
                           f"{err}") from None


def describe(client: Any) -> str:
    """Return one line about the cluster: scheduler, workers, threads and the dashboard's link when it has one."""
    threads = client.nthreads()
    link = dashboard_link(client)
    line = (f"dask: scheduler {client.scheduler.address}, {len(threads)} worker(s), {sum(threads.values())} "
            f"thread(s)")
    return line + (f"; dashboard {link}" if link else "; no dashboard")


def dashboard_link(client: Any) -> str | None:
    """Return the link of the cluster's dashboard, or None when its scheduler serves none.

    ``client.dashboard_link`` is not enough: the scheduler always runs its HTTP server (health,
    metrics) and registers it as its ``dashboard`` service, also when started without a dashboard
    (``LocalCluster(dashboard_address=None)``, ``dask scheduler --no-dashboard``) or without bokeh,
    so the link it gives may lead to nothing. The dashboard itself is a bokeh application that the
    scheduler adds to its HTTP application: asked there. A scheduler that cannot be asked (the
    call refused or failed) gets the benefit of the doubt, its link as Dask gives it.
    """
    try:
        link = client.dashboard_link
    except Exception:  # no HTTP service at all
        return None
    try:  # a lambda: sent by value, so the scheduler needs no fastload installed to run it
        served = client.run_on_scheduler(lambda dask_scheduler: bool(
            getattr(getattr(dask_scheduler, "http_application", None), "applications", None)))
    except Exception:
        return str(link) if link else None
    return str(link) if link and served else None


def dask_ordered_map(client: Any, fn: Callable[..., T], arg_tuples: Iterable[tuple],
                     initializer: Callable[..., None] | None = None,
                     initargs: tuple = ()) -> Iterator[tuple[T | None, BaseException | None]]:
    """Yield ``(fn(*args), None)`` or ``(None, exception)`` per argument tuple, in input order, computed on ``client``.

    At most ``4 *`` (the cluster's worker threads, at least 1) tasks are in
    flight; the window follows workers joining and leaving. An exception the
    task raised is yielded (the caller's skip-bad policy applies), also
    ``KilledWorker`` (a task that killed every worker that ran it); a task
    cancelled or lost with the scheduler raises ClusterError. When the map ends,
    finished or not, the tasks still in flight are cancelled (a task already
    running finishes on its worker, its result dropped) and the ``initargs``'
    key released.
    """
    check_client(client)
    import cloudpickle  # a dependency of distributed, present once check_client passed

    token = uuid.uuid4().hex
    shared = None
    pending: deque[Any] = deque()
    try:
        if initializer is not None:
            try:
                cloudpickle.dumps(initargs)  # the error names what does not pickle, where submit's names a graph
            except Exception as err:  # pickling raises TypeError, AttributeError, PicklingError, anything
                raise ClusterError(f"cannot send {getattr(initializer, '__name__', 'the initializer')}'s arguments "
                                   f"(the dataset) to the Dask workers: {type(err).__name__}: {err} (it must "
                                   "pickle: with cloudpickle, by reference to an importable module or by value)"
                                   ) from err
            shared = client.submit(_hold, initargs, key=f"{INITARGS_KEY}-{token}", pure=False)
        window, checked = _window(client), time.monotonic()
        for args in arg_tuples:
            pending.append(client.submit(_run_task, token, initializer, shared, fn, args, pure=False))
            if len(pending) >= window:
                if time.monotonic() - checked > _WINDOW_REFRESH_S:
                    window, checked = _window(client), time.monotonic()
                if len(pending) >= window:
                    yield _outcome(pending.popleft())
        while pending:
            yield _outcome(pending.popleft())
    finally:
        leftover = [*pending, *([shared] if shared is not None else [])]
        pending.clear()
        if leftover and client.status == "running":
            try:
                client.cancel(leftover)
            except Exception:  # the scheduler is gone: nothing runs there any more
                pass


def _hold(initargs: tuple) -> tuple:
    """Return ``initargs``: the task that holds them on the cluster (computed again if its worker dies)."""
    return initargs


def _window(client: Any) -> int:
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # the scheduler is unreachable: the next result says so
        threads = 0
    return TASKS_PER_THREAD * max(1, threads)


def _outcome(future: Any) -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except Exception as err:
        if future.status == "error":  # the task raised (or killed its workers: KilledWorker)
            return None, err
        reason = "cancelled (the scheduler was lost, or the client closed)" if isinstance(err, CancelledError) \
            else f"{type(err).__name__}: {err}"
        raise ClusterError(f"dask: task {future.key} {reason}") from err


# In a worker process: which map's initializer ran last, and how many of its tasks are running. A task of
# another map waits until they are done before initializing again (the initializer sets module globals that
# the running tasks read; a map's tasks still running when it was cancelled finish first).
_state: dict[str, Any] = {"token": None, "running": 0}
_state_changed = threading.Condition()


def _run_task(token: str, initializer: Callable[..., None] | None, initargs: tuple | None,
              fn: Callable[..., T], args: tuple) -> T:
    """Run ``fn(*args)`` in a Dask worker, after ``initializer(*initargs)`` once per worker process and map.

    glibc keeps freed memory meanwhile (``_worker_heap``): Dask's trim threshold doubled the tasks' CPU time.
    """
    with heap_kept():
        return _run_initialized(token, initializer, initargs, fn, args)


def _run_initialized(token: str, initializer: Callable[..., None] | None, initargs: tuple | None,
                     fn: Callable[..., T], args: tuple) -> T:
    if initializer is None:
        return fn(*args)
    with _state_changed:
        while _state["token"] != token and _state["running"] > 0:
            _state_changed.wait()
        if _state["token"] != token:
            _state["token"] = None  # an initializer that raises leaves no map initialized
            initializer(*(initargs or ()))
            _state["token"] = token
        _state["running"] += 1
    try:
        return fn(*args)
    finally:
        with _state_changed:
            _state["running"] -= 1
            _state_changed.notify_all()
