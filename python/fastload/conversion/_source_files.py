"""Where a conversion's source files lie: a local folder, or a folder in object storage.

Probe and encode tasks name their source by the folder (``data_dir``: a directory or a URL), the
folder's :class:`~fastload.storage.RemoteFolder` when it is remote, and the file's relative path. A
remote file is read through a local copy (``storage/_folder.py``); its errors name the URL, never the
temporary copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from ..errors import ImageReadError, RemoteNotFoundError
from ..storage import RemoteFolder


@contextmanager
def readable_source(data_dir: str, remote: RemoteFolder | None, relpath: str, keep: bool = False) -> Iterator[str]:
    """Yield a local path holding the source ``relpath``: the file itself, or a copy of the remote object.

    ``keep``: a remote copy may stay in the run's spool for the encode task to read (a probe's:
    ``RemoteFolder.local_copy``), so that each object is downloaded once.

    An ImageReadError raised in the block about the copy is raised again naming the object's URL.
    An object gone since the listing is an ImageReadError too, as a local file deleted meanwhile is
    (``--skip-bad`` skips it); any other failure of the store stops the run (a RemoteError).
    """
    if remote is None:
        yield os.path.join(data_dir, relpath)
        return
    url = remote.url_of(relpath)
    with ExitStack() as stack:
        try:
            copy = stack.enter_context(remote.local_copy(relpath, keep=keep))
        except RemoteNotFoundError:
            raise ImageReadError(url, "not found: deleted since the folder was listed") from None
        try:
            yield str(copy)
        except ImageReadError as err:
            raise ImageReadError(url, err.reason.replace(str(copy), url)) from None


def source_name(data_dir: str, remote: RemoteFolder | None, relpath: str) -> str:
    """Return how messages name the source ``relpath``: its path, or its URL."""
    return remote.url_of(relpath) if remote is not None else os.path.join(data_dir, relpath)


def source_stat(settings: Any, relpath: str) -> tuple[int, str]:
    """Return (size in bytes, version) of the source ``relpath`` of ``settings`` (an EncodeSettings, a Partner).

    The version is the modification time in nanoseconds for a local file, the listing's ETag (else
    its modification time) for an object: what tells ``--resume`` that an input changed.
    """
    remote = getattr(settings, "remote", None)
    if remote is not None:
        listed = remote.stat(relpath)
        return listed.size, listed.version
    st = os.stat(os.path.join(settings.data_dir, relpath))
    return st.st_size, str(st.st_mtime_ns)

