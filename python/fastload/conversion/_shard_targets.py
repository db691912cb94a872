"""Where a conversion's shards go: a directory (local or a shared filesystem), or a URL of object storage.

The driver writes a shard with ``write`` (whole, or not at all). A task on a cluster writes one with
``stage`` and the driver, taking the tasks' results in order, makes it part of the dataset with
``commit``, which checks it first:

- in a directory, a task builds its shard under a hidden name of its own (``.tasks/<attempt>/``) and
  ``commit`` renames it into place: a file with a shard's name is always one the driver checked and
  journals. The driver makes ``.tasks/`` before it submits tasks and deletes it when the run ends;
  a task it gave up on that is still running finds no folder to stage in (or loses its file with
  the folder), so a finished dataset holds no staged shard;
- in object storage there is no rename: a task uploads its shard under a key of its own
  (``.tasks/<attempt>/``; the store makes an object visible only when whole) and ``commit`` copies
  it server-side to the shard's name, checks its size (HEAD) and deletes the staged key. The old
  dataset's manifests are deleted before the first shard gets its name, and the manifest is
  written last, so a reader never takes an unchecked shard for part of a dataset.

Targets pickle: a task on a Dask worker writes through the one it is handed.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ..errors import PreprocessError, RemoteNotFoundError
from ..format._manifest import ShardInfo, file_hash, fsync_dir
from ..format._record import Field
from ..storage import RemoteFolder
from ..storage._client import StorageOptions, _obstore
from ..storage._publish import unpublish, upload_file
from ._shard_writer import fsync_file, write_shard

Binding = tuple[Sequence[Field], str]  # (schema, dataset id)
TASKS_DIR = ".tasks"  # in an output directory: the shards that tasks wrote and the driver has not committed
_OPEN_MARK = ".open"  # RemoteShards: .tasks/<run>.open, there while the run's tasks may stage
_CLEAN_TRIES = 100  # deleting TASKS_DIR while tasks given up on may still write in it
# A shard a task wrote: its entry, and where it lies until it is committed (a path under TASKS_DIR, or "").
Staged = tuple[ShardInfo, str]


class ShardTarget(Protocol):
    """Where shards are written, and how one is checked."""

    def clean_staged(self) -> None:
        """Delete the shards that tasks staged and the driver did not commit (before a run, and after it)."""
        ...

    def open_staging(self) -> None:
        """Let tasks stage shards (the driver, before it submits them); ``clean_staged`` closes it again."""
        ...

    def write(self, index: int, records: Sequence[bytes], binding: Binding) -> ShardInfo:
        """Write ``records`` as shard ``index`` (whole, or not at all) and return its entry (the driver)."""
        ...

    def stage(self, index: int, records: Sequence[bytes], binding: Binding) -> Staged:
        """Write ``records`` as shard ``index`` for the driver to commit (a task)."""
        ...

    def commit(self, staged: Staged) -> None:
        """Check a staged shard and make it part of the dataset; PreprocessError naming it when it is not whole."""
        ...

    def check(self, info: ShardInfo, thorough: bool) -> str | None:
        """Return None when the shard of ``info`` is there whole, else what is wrong (naming it)."""
        ...


class LocalShards:
    """Shards in a directory: this machine's, or one every Dask worker shares with the driver."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def clean_staged(self) -> None:
        """Delete what tasks left uncommitted under ``.tasks/``, and the folder: no task can stage any more.

        A task given up on but still running may make its attempt's folder while the tree is being
        deleted (the folder then is not empty, and stays): deleted again until it is gone, after which
        no task can make one (``stage`` does not make ``.tasks/``) nor write into one.
        """
        folder = self.directory / TASKS_DIR
        for _ in range(_CLEAN_TRIES):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                return
            time.sleep(0.01)
        raise PreprocessError(f"{folder}: cannot delete the shards tasks staged there")

    def open_staging(self) -> None:
        """Make the ``.tasks/`` folder that tasks stage their shards in."""
        (self.directory / TASKS_DIR).mkdir(exist_ok=True)

    def write(self, index: int, records: Sequence[bytes], binding: Binding) -> ShardInfo:
        """Write shard ``index`` into the directory (``_shard_writer.write_shard``)."""
        return write_shard(self.directory, index, records, binding)

    def stage(self, index: int, records: Sequence[bytes], binding: Binding) -> Staged:
        """Write shard ``index`` under the directory's ``.tasks/<this attempt>/``."""
        if not self.directory.is_dir():  # a Dask worker on a machine that does not share it
            raise PreprocessError(f"{self.directory}: no such directory on {socket.gethostname()}, where the task "
                                  f"of shard {index} runs; on a cluster the output must be a filesystem every "
                                  "worker shares, or a URL of object storage")
        attempt = self.directory / TASKS_DIR / uuid.uuid4().hex
        try:  # not parents=True: a task still running when its run ended must not make the folder again
            attempt.mkdir()
        except FileNotFoundError:
            raise PreprocessError(f"{self.directory}: the run that planned shard {index} has ended (a task it "
                                  "gave up on); nothing staged") from None
        info = write_shard(attempt, index, records, binding, durable=False)  # commit() makes it durable
        return info, str(attempt / info.file)

    def commit(self, staged: Staged) -> None:
        """Check the staged file's size and rename it to its shard's name."""
        info, where = staged
        path = Path(where)
        try:
            size = path.stat().st_size
        except OSError:
            raise PreprocessError(f"{path}: written by a task but not here: on a cluster the output must be a "
                                  "filesystem every worker shares with this process, or a URL of object "
                                  "storage") from None
        if size != info.bytes:
            raise PreprocessError(f"{path}: {size} bytes, the task that wrote it reported {info.bytes}")
        fsync_file(path)  # here rather than in the task: the worker goes on encoding meanwhile
        os.replace(path, self.directory / info.file)
        fsync_dir(self.directory)
        shutil.rmtree(path.parent, ignore_errors=True)

    def check(self, info: ShardInfo, thorough: bool) -> str | None:
        """Check the file's size (and with ``thorough`` its hash: the file is read whole)."""
        path = self.directory / info.file
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path}: missing"
        if size != info.bytes:
            return f"{path}: {size} bytes, its journal says {info.bytes}"
        if thorough and file_hash(path) != info.hash:
            return f"{path}: its content differs from its journal's hash"
        return None


class RemoteShards:
    """Shards uploaded under a URL of object storage, each built in a local temporary directory first.

    A task uploads its shard under a key of its own (``.tasks/<run>/<attempt>/shard-NNNNN.lmdb``); the
    driver commits it with a server-side copy to the shard's name (S3's CopyObject: up to 5 GB) and
    deletes the staged key. A task still running after the driver gave up on it (a replan, Ctrl-C) can
    write only its own staged key, never a shard's name. ``root``: the URL of the whole output (a
    split's shards go under ``root/train``), whose manifests are deleted before the first shard gets its
    name.

    A bucket has no folder whose deletion stops such a task (``LocalShards``): the run's open mark
    (``.tasks/<run>.open``) stands in for it. ``clean_staged`` deletes every mark, then every staged key;
    a task that finds its run's mark gone after its upload deletes what it uploaded. Either the
    clean's listing comes after the upload (and deletes it), or the mark was gone before the task
    looked: no staged key outlives a run, not even one of a task that ends after a later run finished.
    """

    def __init__(self, url: str, root: str, options: StorageOptions) -> None:
        self.folder = RemoteFolder(url, options)  # its store is opened once per process (RemoteFolder.root)
        self.root = root
        self._retired = False  # the old dataset's manifests deleted (in the driver)
        self._run = uuid.uuid4().hex  # made in the driver; its tasks get it with the rest of this object

    def clean_staged(self) -> None:
        """Delete what tasks of this or an earlier run staged under ``.tasks/`` and nobody committed.

        The runs' open marks go first: a task whose upload ends after the second listing finds its mark gone.
        """
        obstore, root = _obstore(), self.folder.root

        def staged() -> list[str]:
            return [str(meta["path"]) for batch in obstore.list(root.store, prefix=TASKS_DIR + "/") for meta in batch]

        marks = [name for name in root.call(TASKS_DIR + "/", "LIST", staged) if name.endswith(_OPEN_MARK)]
        if marks:
            root.call(TASKS_DIR + "/", "DELETE", lambda: obstore.delete(root.store, marks))
        names = root.call(TASKS_DIR + "/", "LIST", staged)
        if names:
            root.call(TASKS_DIR + "/", "DELETE", lambda: obstore.delete(root.store, names))

    def open_staging(self) -> None:
        """Put this run's open mark: while it is there, its tasks keep what they stage."""
        obstore, root, mark = _obstore(), self.folder.root, self._mark()
        root.call(mark, "PUT", lambda: obstore.put(root.store, mark, b""))

    def _mark(self) -> str:
        return f"{TASKS_DIR}/{self._run}{_OPEN_MARK}"

    def write(self, index: int, records: Sequence[bytes], binding: Binding) -> ShardInfo:
        """Build shard ``index`` locally, upload it under its name (multipart when large) and check its size."""
        self._retire_old_dataset()
        with tempfile.TemporaryDirectory(prefix="fastload-shard-") as tmp:
            info = write_shard(tmp, index, records, binding, durable=False)  # uploaded, then deleted
            upload_file(self.folder.root, info.file, Path(tmp, info.file))
        return info

    def stage(self, index: int, records: Sequence[bytes], binding: Binding) -> Staged:
        """Build shard ``index`` locally and upload it under ``.tasks/<this attempt>/``."""
        with tempfile.TemporaryDirectory(prefix="fastload-shard-") as tmp:
            info = write_shard(tmp, index, records, binding, durable=False)
            key = f"{TASKS_DIR}/{self._run}/{uuid.uuid4().hex}/{info.file}"
            upload_file(self.folder.root, key, Path(tmp, info.file))
        root = self.folder.root
        if not root.exists(self._mark()):  # the run ended or was given up on: nobody commits this key
            obstore = _obstore()
            root.call(key, "DELETE", lambda: obstore.delete(root.store, key))
        return info, key

    def commit(self, staged: Staged) -> None:
        """Copy the staged object to the shard's name (server-side), check its size, delete the staged one."""
        info, key = staged
        obstore, root = _obstore(), self.folder.root
        self._retire_old_dataset()
        root.call(key, "COPY", lambda: obstore.copy(root.store, key, info.file))
        problem = self.check(info, thorough=False)
        if problem is not None:
            raise PreprocessError(problem)
        root.call(key, "DELETE", lambda: obstore.delete(root.store, key))

    def check(self, info: ShardInfo, thorough: bool) -> str | None:
        """Check the object's size (HEAD); its hash was taken of the file uploaded, whose size the store confirmed."""
        try:
            size = self.folder.root.size(info.file)
        except RemoteNotFoundError:
            return f"{self.folder.url_of(info.file)}: not found"
        if size != info.bytes:
            return f"{self.folder.url_of(info.file)}: {size} bytes, the journal says {info.bytes}"
        return None

    def _retire_old_dataset(self) -> None:
        """Before the first shard gets its name: delete the manifests under the output's URL (see the class)."""
        if not self._retired:
            unpublish(self.root, self.folder.options)
            self._retired = True
