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
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RemoteError, RemoteNotFoundError
from ._client import RemoteRoot, StorageOptions, _obstore
from ._urls import redact


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
        """The store of this folder, opened on first use in this process."""
        if self._root is None:
            self._root = RemoteRoot(self.url, self.options)
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

        self._listing = dict(sorted(root.call("", "LIST", listing).items()))
        return self._listing

    def stat(self, relpath: str) -> RemoteFile:
        """Return the listing of ``relpath`` (RemoteNotFoundError naming its URL when it is not listed)."""
        found = self.list().get(relpath)
        if found is None:
            raise RemoteNotFoundError(f"{self.url_of(relpath)}: not found (LIST)")
        return found

    @contextmanager
    def local_copy(self, relpath: str) -> Iterator[Path]:
        """Copy ``relpath`` into a temporary directory and yield its path; delete it afterwards.

        The copy keeps the object's name (readers choose by suffix). It lies under ``scratch`` when
        that directory exists in this process's machine: the driver that made it deletes it at the end,
        also when it killed a worker in the middle of a copy. Raises RemoteError naming the URL when
        the object cannot be read, or the local disk cannot hold it.
        """
        parent = self.scratch if self.scratch is not None and os.path.isdir(self.scratch) else None
        with tempfile.TemporaryDirectory(prefix="fastload-source-", dir=parent) as tmp:
            path = Path(tmp, relpath.rsplit("/", 1)[-1] or "object")
            try:
                with open(path, "wb") as out:
                    for chunk in self.root.stream(relpath):
                        out.write(chunk)
            except OSError as err:  # the local disk: full, or not writable
                raise RemoteError(f"{self.url_of(relpath)}: cannot copy it to {tmp}: {err.strerror or err}") \
                    from None
            yield path

