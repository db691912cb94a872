"""Advisory file locks between the processes that share one cache (flock on POSIX, msvcrt on Windows)."""

from __future__ import annotations

import errno
import os
import sys
import time
import weakref
from pathlib import Path

from ..errors import RemoteError
from ._cache_fs import open_lock_file


class FileLock:
    """A lock on ``path`` (created if missing), shared or exclusive; released by ``release`` or ``with``.

    The kernel drops it when the process ends, however it ends, so a crashed or killed process never
    leaves the cache locked. A child made by ``os.fork()`` closes its copies of the exclusive locks'
    descriptors at once: a flock belongs to the open file, which the child would otherwise keep
    locked after the parent released it (a DataLoader worker forked during a download would then
    wait for that shard forever). Shared (readers') locks stay held by the child, which reads too.
    """

    def __init__(self, path: Path, exclusive: bool, blocking: bool = True) -> None:
        self.path = path
        self._fd: int | None = None
        self._exclusive = exclusive
        self._pid = os.getpid()
        try:
            fd = open_lock_file(path)  # never a link's target (storage/_cache_fs.py)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RemoteError(f"cache lock file {path} is a symbolic link: not followed; remove it (someone else "
                                  f"may have planted it)") from None
            raise
        self._fd = fd
        if exclusive:  # before it is locked: a child forked while this thread waits closes its copy too
            _EXCLUSIVE.add(self)
        try:
            if not _lock(fd, exclusive, blocking):
                raise BlockingIOError(f"{path} is locked")
        except BaseException:
            self._fd = None
            os.close(fd)
            raise

    @classmethod
    def try_exclusive(cls, path: Path) -> FileLock | None:
        """Return an exclusive lock on ``path``, or None when another process holds any lock on it.

        On Windows readers hold no lock (msvcrt has no shared one), so nothing can tell a version in
        use from an idle one there: None, always (the cache is never evicted on Windows; a cache_limit
        that needs eviction is an error there).
        """
        if sys.platform == "win32":
            return None
        try:
            return cls(path, exclusive=True, blocking=False)
        except BlockingIOError:
            return None

    def release(self) -> None:
        """Release the lock (idempotent).

        An exclusive lock is unlocked explicitly before its descriptor is closed: a child forked
        while it was being taken may hold a copy of the descriptor, which would otherwise keep the
        open file locked. Only the process that took it unlocks it; a forked child's copy is closed.
        """
        fd, self._fd = self._fd, None
        if fd is not None:
            if self._exclusive and self._pid == os.getpid():
                _unlock(fd)
            os.close(fd)  # closing the last descriptor of the open file drops a lock left

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except (AttributeError, TypeError):  # interpreter shutdown (module globals are None): exit closes it
            pass


_EXCLUSIVE: weakref.WeakSet[FileLock] = weakref.WeakSet()  # this process's exclusive locks (for fork)


def _drop_exclusive_locks_in_child() -> None:
    for lock in list(_EXCLUSIVE):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            try:
                os.close(fd)  # the child's reference to the open file: the parent's lock is unaffected
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_exclusive_locks_in_child)


if sys.platform == "win32":
    import msvcrt

    def _unlock(fd: int) -> None:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass

    def _lock(fd: int, exclusive: bool, blocking: bool) -> bool:
        # msvcrt has no shared lock: a reader's holds nothing (Windows refuses to delete a file that is
        # open or mapped, which is what keeps an evictor off it there).
        if not exclusive:
            return True
        deadline = time.monotonic() + 3600
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not blocking:
                    return False
                if time.monotonic() > deadline:
                    raise RemoteError("a cache lock has been held by another process for an hour") from None
                time.sleep(0.05)
else:
    import fcntl

    def _unlock(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass

    def _lock(fd: int, exclusive: bool, blocking: bool) -> bool:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            return False
        return True
