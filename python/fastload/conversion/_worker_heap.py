"""Keeping freed memory in a Dask worker while a conversion task runs (glibc's trim threshold).

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``): glibc hands any free memory above 64 KB at the top of
the heap back to the kernel at once. A conversion task allocates and frees records of tens of KB
to MB by the thousand, so each is faulted in again page by page: measured here, a task that
encodes 250 tiles of 3x128x128 and writes their shard took 1.5 to 2 times the CPU time it takes
in a process-pool worker, and setting the threshold to 128 MB removed the difference.

:func:`heap_kept` raises the threshold while at least one fastload task runs in the process, then
sets it back to the value the worker started with and trims once, so the worker's memory
between tasks is what Dask's setting intends. Only where that variable is set (Dask's workers, or a
user who chose it) and glibc is the allocator; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

KEPT_BYTES = 128 << 20  # freed memory glibc keeps while a task runs
_M_TRIM_THRESHOLD = -1  # mallopt's parameter number (malloc.h)


def _resolve_glibc() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """Return glibc's ``mallopt`` and ``malloc_trim``, resolved at import (never in a forked child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        return libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # musl and other allocators: nothing to tune
        return None


_GLIBC = _resolve_glibc()
_lock = threading.Lock()
_running = [0]  # fastload tasks running in this process (a worker may run several threads)


def _started_threshold() -> int | None:
    value = os.environ.get("MALLOC_TRIM_THRESHOLD_", "")
    return int(value) if value.isdigit() else None


@contextmanager
def heap_kept() -> Iterator[None]:
    """Keep up to ``KEPT_BYTES`` of freed memory in this process while the block runs (see the module)."""
    threshold = _started_threshold()
    if _GLIBC is None or threshold is None or threshold >= KEPT_BYTES:
        yield
        return
    mallopt, malloc_trim = _GLIBC
    with _lock:
        _running[0] += 1
        if _running[0] == 1:
            mallopt(_M_TRIM_THRESHOLD, KEPT_BYTES)
    try:
        yield
    finally:
        with _lock:
            _running[0] -= 1
            if _running[0] == 0:
                mallopt(_M_TRIM_THRESHOLD, threshold)
                malloc_trim(0)
