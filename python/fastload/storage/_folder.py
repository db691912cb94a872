"""A folder of source files in object storage: listing it, and copying one file to local disk for its reader.

Conversion (``preprocess_tiles --data-dir s3://...``) reads its inputs through this: the driver lists
the prefix once (names, sizes, versions), and each probe or encode task copies the one file it reads
into a temporary directory, reads it with the same readers as a local file (Pillow, tifffile, numpy),
and deletes it. The listing's sizes and versions identify the inputs for ``--resume`` (as a local
file's size and modification time do).

A :class:`RemoteFolder` is picklable (its URL and options; the store is opened in each process), so it
travels to Dask workers and to spawned pool workers. obstore's runtime does not survive ``fork``:
the local process pool starts fresh interpreters when its tasks read a remote folder.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from ..errors import RemoteError, RemoteNotFoundError
from ._client import RemoteRoot, StorageOptions, _obstore
from ._locks import FileLock
from ._urls import redact

# The stores opened in this process, by (process id, URL, pickled options): bounded, and a forked
# child (another process id) opens its own, as obstore's runtime does not survive a fork.
_OPEN_STORES: dict[tuple[int, str, bytes], RemoteRoot] = {}
_MAX_OPEN_STORES = 16


@dataclass(frozen=True)
class RemoteFile:
    """One object of a listing: its size in bytes and its version (the ETag, else the modification time)."""

    size: int
    version: str


class RemoteFolder:
    """Source files under an object-storage URL (a prefix), read one at a time through local copies."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | StorageOptions | None = None,
                 scratch: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.scratch = scratch  # where copies go when it exists here (else the system's temporary directory)
        self.options = (storage_options if isinstance(storage_options, StorageOptions)
                        else StorageOptions.build(storage_options))
        self._root: RemoteRoot | None = None
        self._listing: dict[str, RemoteFile] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "scratch": self.scratch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.options, self.scratch = state["url"], state["options"], state["scratch"]
        self._root, self._listing = None, None

    def __repr__(self) -> str:
        return f"RemoteFolder({redact(self.url)!r})"

    @property
    def root(self) -> RemoteRoot:
        """The store of this folder, opened on first use in this process.

        Each task gets its own unpickled folder: the store (an HTTP client, its connections, the
        credentials it looked up) is kept per process in :data:`_OPEN_STORES`, so a worker's tasks
        share one rather than opening one per file.
        """
        if self._root is None:
            key = (os.getpid(), self.url, pickle.dumps(self.options))
            self._root = _OPEN_STORES.get(key)
            if self._root is None:
                self._root = RemoteRoot(self.url, self.options)
                if len(_OPEN_STORES) >= _MAX_OPEN_STORES:
                    _OPEN_STORES.clear()
                _OPEN_STORES[key] = self._root
        return self._root

    def url_of(self, relpath: str) -> str:
        """Return the URL of ``relpath`` in this folder, as messages show it (no secrets)."""
        return self.root.url_of(relpath)

    def list(self) -> dict[str, RemoteFile]:
        """Return every object under the folder by relative path (``/``-separated), sorted by path.

        Listed once per process (kept for :meth:`stat`; not pickled). Raises RemoteError naming the URL
        when the listing fails (no bucket, refused, server gone).
        """
        if self._listing is not None:
            return self._listing
        obstore, root = _obstore(), self.root

        def listing() -> dict[str, RemoteFile]:
            found = {}
            for batch in obstore.list(root.store):
                for meta in batch:
                    version = meta.get("e_tag") or str(meta.get("last_modified") or "")
                    found[str(meta["path"])] = RemoteFile(int(meta["size"]), str(version))
            return found

        try:
            found = root.call("", "LIST", listing)
        except RemoteError as err:
            if self.url.partition("://")[0].lower() not in ("http", "https"):
                raise
            raise type(err)(f"{err} (an http(s):// folder is listed with WebDAV's PROPFIND, which this server may "
                            "not answer: name the folder by its store's own scheme, s3://, gs:// or az://, or copy "
                            "it to a local or shared folder)") from None
        # Folder markers (empty objects named like a folder, which consoles create) are no files: the
        # store lists "cats/" as "cats", and the prefix's own marker as "".
        folders = {prefix for name in found for prefix in _prefixes(name)}
        self._listing = {name: meta for name, meta in sorted(found.items())
                         if not (meta.size == 0 and (name == "" or name in folders))}
        return self._listing

    def stat(self, relpath: str) -> RemoteFile:
        """Return the listing of ``relpath`` (RemoteNotFoundError naming its URL when it is not listed)."""
        found = self.list().get(relpath)
        if found is None:
            raise RemoteNotFoundError(f"{self.url_of(relpath)}: not found (LIST)")
        return found

    @contextmanager
    def local_copy(self, relpath: str, keep: bool = False) -> Iterator[Path]:
        """Copy ``relpath`` into a temporary directory and yield its path; delete it afterwards.

        The copy is named ``source`` with the object's suffix (readers choose by suffix; a key's own
        name may be longer than a local file's may be, or hold characters Windows refuses). It lies
        under ``scratch`` when that directory exists in this process's machine: the driver that made it
        deletes it at the end, also when it killed a worker in the middle of a copy. Raises RemoteError
        naming the URL when the object cannot be read, or the local disk cannot hold it.

        The run's spool (``scratch/spool/``, on the driver's machine only): a copy made with ``keep``
        (a probe's) is kept there while the spool holds fewer than ``spool_bytes()`` bytes, and a later
        copy of the same object (its encode task's) is read from there instead of downloaded again.
        """
        spool = self._spool()
        kept = spool / _spool_name(relpath) if spool is not None else None
        if kept is not None and kept.is_file():  # downloaded once already in this run (its probe)
            yield kept
            return
        parent = self.scratch if self.scratch is not None and os.path.isdir(self.scratch) else None
        with tempfile.TemporaryDirectory(prefix="fastload-source-", dir=parent) as tmp:
            path = Path(tmp, "source" + Path(relpath.rsplit("/", 1)[-1]).suffix)
            try:
                with open(path, "wb") as out:
                    for chunk in self.root.stream(relpath):
                        out.write(chunk)
            except OSError as err:  # the local disk: full, or not writable
                raise RemoteError(f"{self.url_of(relpath)}: cannot copy it to {tmp}: {err.strerror or err}") \
                    from None
            yield path
            if keep and kept is not None and spool is not None:
                _keep_in_spool(path, kept, spool)

    def spooled(self, relpath: str) -> bool:
        """Return whether this run's spool holds a copy of ``relpath`` (reading it then makes no request)."""
        spool = self._spool()
        return spool is not None and (spool / _spool_name(relpath)).is_file()

    def _spool(self) -> Path | None:
        """Return the run's spool directory when ``scratch`` exists on this machine, else None."""
        if self.scratch is None or not os.path.isdir(self.scratch):
            return None
        spool = Path(self.scratch, "spool")
        spool.mkdir(mode=0o700, exist_ok=True)
        return spool


SPOOL_ENV = "FASTLOAD_SOURCE_SPOOL_BYTES"
DEFAULT_SPOOL_BYTES = 8 * 10**9


def spool_bytes() -> int:
    """Return the bytes a conversion may keep of its downloaded sources (``FASTLOAD_SOURCE_SPOOL_BYTES``).

    At most half the free space of the disk the spool is on is used whatever the setting; 0
    downloads every source twice (its probe, its encode), as before the spool.
    """
    text = os.environ.get(SPOOL_ENV)
    if text is None:
        return DEFAULT_SPOOL_BYTES
    try:
        value = int(text)
    except ValueError:
        raise RemoteError(f"{SPOOL_ENV}={text!r}: expected a byte count") from None
    if value < 0:
        raise RemoteError(f"{SPOOL_ENV}={text!r}: expected a byte count of at least 0")
    return value


def _spool_name(relpath: str) -> str:
    """Return the spool's file name of ``relpath``: a hash of the path, with its suffix (readers go by it)."""
    return xxhash.xxh3_128_hexdigest(relpath.encode()) + Path(relpath.rsplit("/", 1)[-1]).suffix


def _keep_in_spool(path: Path, kept: Path, spool: Path) -> None:
    """Move a finished copy into the spool when the spool has room (its byte count kept under a lock)."""
    size = path.stat().st_size
    with FileLock(spool / ".lock", exclusive=True):
        counter = spool / ".bytes"
        used = int(counter.read_text() or 0) if counter.exists() else 0
        free = shutil.disk_usage(spool).free
        if used + size > min(spool_bytes(), free // 2) or kept.exists():
            return
        os.replace(path, kept)
        tmp = spool / ".bytes.tmp"
        tmp.write_text(str(used + size))
        os.replace(tmp, counter)


def _prefixes(name: str) -> list[str]:
    """Return the folders above ``name`` ("a/b/c" -> ["a", "a/b"])."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
