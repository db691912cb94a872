"""The cache's own filesystem operations: private by default, never through a link fastload did not make.

A cache directory is often shared with others (a team cache, one under ``/tmp``). The threat is
another local user who can create entries in it: a symbolic link planted where fastload expects a
directory or a file of its own would send a write, a lock or a recursive delete somewhere else.
So, below ``cache_dir``:

- every directory fastload walks through is checked with ``lstat`` right before use (a link or a
  non-directory is refused with an error naming it), and created with private permissions (0700);
- files are created with ``O_NOFOLLOW`` (locks) or ``O_EXCL`` (temporary files, unique names),
  private (0600), and renamed over their final names (a rename replaces a link, never follows it);
- recursive deletes (evicting a version, a finished staging directory) walk directory descriptors
  opened with ``O_NOFOLLOW | O_DIRECTORY`` from ``cache_dir`` down, and delete links as links: a
  planted link makes a delete skip that entry (with a warning naming it), never follow it.

``cache_dir`` itself is the user's choice and may be a link; what it resolves to must be owned by
this user and not writable by others (as ssh and pip check their directories), unless the user
opts in to a shared cache with ``FASTLOAD_SHARED_CACHE=1``: then group and others may write
(members of a team that trust each other not to attack the cache; deletes still never follow a
link), and files and directories are created with the process's umask instead of private modes.
"""

from __future__ import annotations

import os
import stat
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..errors import FastloadWarning, RemoteError

SHARED_CACHE_ENV = "FASTLOAD_SHARED_CACHE"
_POSIX_FDS = sys.platform != "win32" and os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def shared_cache() -> bool:
    """Return whether the user opted in to a cache shared with other users (``FASTLOAD_SHARED_CACHE=1``)."""
    return os.environ.get(SHARED_CACHE_ENV, "").strip().lower() in ("1", "true", "yes")


def dir_mode() -> int:
    """Return the mode new cache directories get: 0700, or 0777 less the umask in a shared cache."""
    return 0o777 if shared_cache() else 0o700


def file_mode() -> int:
    """Return the mode new cache files get: 0600, or 0666 less the umask in a shared cache."""
    return 0o666 if shared_cache() else 0o600


def check_cache_dir(cache_dir: Path) -> None:
    """Create ``cache_dir`` when missing (private), then refuse it when another user could plant files in it.

    Refused (a RemoteError saying why and how to opt in): a directory owned by another user, or one
    that group or others may write without the sticky bit, unless the cache is shared by choice.
    """
    try:
        if not cache_dir.exists():
            cache_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(cache_dir, dir_mode())
            except FileExistsError:
                pass
        info = os.stat(cache_dir)  # the directory the user named, through a link if it is one
    except OSError as err:
        raise RemoteError(f"cache directory {cache_dir}: {err.strerror or err}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise RemoteError(f"cache directory {cache_dir}: not a directory")
    if sys.platform == "win32" or shared_cache():
        return
    why = ""
    if info.st_uid != os.geteuid():
        why = f"it is owned by another user (uid {info.st_uid}, you are {os.geteuid()})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        why = f"group or others may write to it (mode {stat.S_IMODE(info.st_mode):04o}) and it has no sticky bit"
    if why:
        raise RemoteError(f"cache directory {cache_dir}: refused, {why}: another user could plant links in it that "
                          f"make the cache write or delete elsewhere. Use a directory of your own (cache_dir=, "
                          f"FASTLOAD_CACHE_DIR), chmod it go-w, or set {SHARED_CACHE_ENV}=1 to share it on purpose "
                          f"(docs/remote.md, 'A shared cache')")


def real_dir(cache_dir: Path, *names: str, create: bool = False) -> Path:
    """Return ``cache_dir / names...`` after checking that no part of it below ``cache_dir`` is a link.

    ``create``: make the missing parts (private). A part that is a link or not a directory is a
    RemoteError naming it: fastload never follows a link inside its cache.
    """
    path = cache_dir
    for name in names:
        path = path / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if not create:
                raise RemoteError(f"cache {cache_dir}: {path} is missing") from None
            try:
                os.mkdir(path, dir_mode())
            except FileExistsError:
                pass
            except OSError as err:
                raise RemoteError(f"cache {cache_dir}: {path}: {err.strerror or err}") from None
            info = os.lstat(path)
        except OSError as err:
            raise RemoteError(f"cache {cache_dir}: {path}: {err.strerror or err}") from None
        if not stat.S_ISDIR(info.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
            raise RemoteError(f"cache {cache_dir}: {path} is {what}, where fastload keeps a directory of its own; "
                              f"fastload never follows links inside its cache: remove it (someone else may have "
                              f"planted it)")
        foreign = foreign_dir(info)
        if foreign:
            raise RemoteError(f"cache {cache_dir}: {path}: refused, {foreign}: another user could plant links in it "
                              f"(made before fastload did?); remove it, or set {SHARED_CACHE_ENV}=1 to share the "
                              f"cache on purpose")
    return path


def foreign_dir(info: os.stat_result) -> str:
    """Return why a directory below ``cache_dir`` (its ``lstat``) is not this user's alone, or '' when it is.

    Always '' in a shared cache and on Windows.
    """
    if sys.platform == "win32" or shared_cache():
        return ""
    if info.st_uid != os.geteuid():
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write to it (mode {stat.S_IMODE(info.st_mode):04o})"
    return ""


def is_real_file(path: Path) -> bool:
    """Return whether ``path`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def open_new(path: Path, size: int | None = None) -> BinaryIO:
    """Create and open ``path`` for writing; it must not exist (a temporary file's unique name).

    Never through a link (``O_EXCL``). ``size``: extend it to this many bytes at once (sparse).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY, file_mode())
    f: BinaryIO = os.fdopen(fd, "wb")
    if size is not None:
        try:
            f.truncate(size)
        except BaseException:
            f.close()
            raise
    return f


def open_existing(path: Path) -> BinaryIO:
    """Open the existing file ``path`` (a temporary file this process made) for reading and writing, unbuffered.

    Never through a link (``O_NOFOLLOW``): one planted under its name since is refused (ELOOP).
    """
    fd = os.open(path, os.O_RDWR | _NOFOLLOW | _CLOEXEC | _BINARY)
    f: BinaryIO = os.fdopen(fd, "r+b", buffering=0)
    return f


def open_lock_file(path: Path) -> int:
    """Open (creating) the lock file ``path`` for flock: a descriptor, never of a link's target."""
    return os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _BINARY, file_mode())


@contextmanager
def _dir_fd(cache_dir: Path, parts: tuple[str, ...]) -> Iterator[int | None]:
    """Yield a descriptor of ``cache_dir / parts...`` opened without following a link below ``cache_dir``.

    Yield None when a part is missing, a link or not a directory (a warning names a link).
    """
    fds: list[int] = []
    try:
        found: int | None = None
        try:
            fds.append(os.open(cache_dir, os.O_RDONLY | _DIRECTORY | _CLOEXEC))
            for name in parts:
                try:
                    fds.append(os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fds[-1]))
                except OSError as err:
                    _warn_if_link(cache_dir, fds[-1], name, err)
                    break
            else:
                found = fds[-1]
        except FileNotFoundError:  # cache_dir itself is gone
            pass
        yield found
    finally:
        for fd in fds:
            os.close(fd)


def _warn_if_link(cache_dir: Path, parent_fd: int, name: str, err: OSError) -> None:
    try:
        planted = stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode)
    except OSError:
        return
    if planted:
        warnings.warn(f"cache {cache_dir}: {name} is a symbolic link where fastload keeps a directory: not followed, "
                      f"left alone ({err.strerror or err})", FastloadWarning, stacklevel=4)


def remove_tree(cache_dir: Path, path: Path) -> None:
    """Delete directory ``path`` (under ``cache_dir``) and everything in it, never following a link.

    A link anywhere in it is deleted as a link; a link on the way from ``cache_dir`` to ``path``
    makes this delete nothing. Errors on single entries are ignored (best effort, like eviction was).
    """
    parts = path.relative_to(cache_dir).parts
    if not parts:
        return
    if not _POSIX_FDS:  # Windows: no descriptor walk; check the parts, then the library's delete
        try:
            real_dir(cache_dir, *parts)
        except RemoteError:
            return
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return
    with _dir_fd(cache_dir, parts[:-1]) as parent:
        if parent is not None:
            _remove_at(parent, parts[-1])


def _remove_at(parent: int, name: str) -> None:
    """Delete entry ``name`` of directory ``parent`` (a descriptor), a directory recursively, a link as a link."""
    try:
        fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=parent)
    except OSError:  # a file, a link, or gone
        try:
            os.unlink(name, dir_fd=parent)
        except OSError:
            pass
        return
    try:
        for entry in list(os.scandir(fd)):
            _remove_at(fd, entry.name)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass


def unlink_in(cache_dir: Path, path: Path) -> None:
    """Delete file ``path`` (under ``cache_dir``), reaching its directory without following a link."""
    parts = path.relative_to(cache_dir).parts
    if not _POSIX_FDS:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise RemoteError(f"cache file {path}: cannot delete it: {err.strerror or err}") from None
        return
    with _dir_fd(cache_dir, parts[:-1]) as parent:
        if parent is not None:
            try:
                os.unlink(parts[-1], dir_fd=parent)
            except (FileNotFoundError, IsADirectoryError):
                pass
            except OSError as err:  # read-only, busy, refused: the cache's disk, said as such
                raise RemoteError(f"cache file {path}: cannot delete it: {err.strerror or err}") from None
