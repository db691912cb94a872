"""Writing a dataset to object storage: converted into a local staging directory, then published.

A conversion whose output is a URL (``write_dataset(source, "s3://bucket/out")``, ``preprocess_tiles
--output-dir s3://...``) writes exactly as it writes a local directory, into a staging directory
under the cache (``<cache_dir>/publish/<name>-<hash of the URL>``, :func:`staging_dir`), so the bytes
are those of a local run and ``resume`` works as locally (the staging directory keeps the journal).
:func:`publish` then uploads it:

1. the manifests and ``splits.json`` already at the URL are deleted first (``overwrite``): from then
   on the old dataset no longer looks complete, and no reader mixes its manifest with new shards;
2. every shard (every file but the manifests and ``splits.json``), each a single PUT or, above
   obstore's part size, a multipart upload, which the store makes visible only when it completes
   (object stores have no rename: an object appears whole or not at all); each is then checked by
   its size (HEAD);
3. the manifests last (each split's, then ``splits.json``): a reader never sees a manifest whose
   shards are not all there;
4. an older dataset's shards that the new one does not have are deleted; nothing else under the
   URL is touched (``_a_dataset_s`` says what is the dataset's).

A failed request is retried by obstore (bounded, as for reads), then a RemoteError names the URL. An
interrupted publish leaves no manifest at the URL: the dataset looks incomplete, and a rerun (with
``resume``) uploads again what the staging directory holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .._progress import Progress
from ..errors import DatasetError, RemoteError, RemoteNotFoundError
from ..format._manifest import MANIFEST_NAME, Manifest, load_manifest
from ..format._manifest_check import MAX_MANIFEST_BYTES, SHARD_FILE
from ..format._splits import SPLIT_FOLDERS, SPLITS_NAME
from ..format._strict_json import load_strict
from ._cache_fs import check_cache_dir, open_lock_file, real_dir, remove_tree
from ._client import RemoteRoot, StorageOptions, _obstore
from ._urls import redact

_LAST = (MANIFEST_NAME, SPLITS_NAME)  # uploaded after every other file, splits.json after the manifests


def staging_dir(cache_dir: Path, url: str) -> Path:
    """Return the local directory where the dataset for ``url`` is written before it is published."""
    shown = redact(url).split("://", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", shown).strip("-.")[-48:] or "dataset"
    return cache_dir / "publish" / f"{name}-{hashlib.sha256(redact(url).rstrip('/').encode()).hexdigest()[:16]}"


def checked_staging_dir(cache_dir: Path, url: str) -> Path:
    """Return ``staging_dir(cache_dir, url)`` after checking the cache and making ``publish/`` (private).

    A link planted at ``publish/`` or at the staging directory's name is refused (a RemoteError naming
    it): the conversion never writes, and ``overwrite`` never deletes, through it.
    """
    staging = staging_dir(cache_dir, url)
    check_cache_dir(cache_dir)
    real_dir(cache_dir, staging.parent.name, create=True)
    if os.path.lexists(staging):
        real_dir(cache_dir, staging.parent.name, staging.name)
    return staging


def started_mark(staging: Path) -> Path:
    """Return the file beside ``staging`` that says a conversion to its URL started and is not published yet.

    It is made before the conversion writes anything and deleted after the staging directory: an
    interrupted ``overwrite`` of a URL whose old dataset is still complete is known as started
    (``resume`` continues it) even before its staging directory holds a file.
    """
    return staging.with_name(staging.name + ".started")


def is_staged(staging: Path) -> bool:
    """Return whether a conversion to the URL of ``staging`` was started and not published."""
    if os.path.lexists(started_mark(staging)):
        return True
    try:
        return any(staging.iterdir())
    except OSError:  # none
        return False


def mark_started(staging: Path) -> None:
    """Make the ``started_mark`` of ``staging`` (in the private ``publish/`` folder; never through a link)."""
    mark = started_mark(staging)
    try:
        fd = open_lock_file(mark)
    except OSError as err:
        raise RemoteError(f"{mark}: cannot mark the conversion as started ({err.strerror}); a link planted "
                          "there is refused") from None
    os.close(fd)


def remove_staging(staging: Path) -> None:
    """Delete a staging directory (``<cache_dir>/publish/<name>``) and what it holds, then its ``started_mark``.

    Never through a link.
    """
    remove_tree(staging.parent.parent, staging)
    remove_tree(staging.parent.parent, started_mark(staging))


def clear_staging(staging: Path) -> None:
    """Delete what a staging directory holds but keep its ``started_mark``: a conversion starting again."""
    remove_tree(staging.parent.parent, staging)


def remote_dataset_exists(url: str, options: StorageOptions) -> bool:
    """Return whether ``url`` holds a dataset (a manifest or ``splits.json``)."""
    root = RemoteRoot(url, options)
    return root.exists(MANIFEST_NAME) or root.exists(SPLITS_NAME)


def publish(local: Path, url: str, options: StorageOptions, progress: bool = False) -> int:
    """Upload the dataset written in ``local`` to ``url``: shards first, manifests last; return the bytes sent.

    ``progress``: a bar on a terminal, lines in a command's log, INFO records of the ``fastload.publish``
    logger (``_progress``), counting the bytes of each file once it is uploaded and checked.
    """
    obstore = _obstore()
    root = RemoteRoot(url, options)
    files = sorted((p for p in local.rglob("*") if p.is_file() and not _hidden(p.relative_to(local))),
                   key=lambda p: (p.name in _LAST, p.name == SPLITS_NAME, len(p.relative_to(local).parts), str(p)))
    if not any(p.name in _LAST for p in files):
        raise RemoteError(f"{local}: no manifest to publish to {redact(url)} (the conversion did not finish)")
    staged = {p.relative_to(local).as_posix() for p in files}
    elsewhere = {name: size for name, size in _listed_shards(local, files).items() if name not in staged}
    for name, size in elsewhere.items():  # uploaded by the conversion's tasks: each must be there, whole
        stored = root.size(name)
        if stored != size:
            raise RemoteError(f"{root.url_of(name)}: {stored} bytes, its manifest says {size}; not publishing")
    for name in _manifests_at(root, obstore):  # the old dataset stops looking complete before a file changes
        _delete(root, obstore, name)
    sent = 0
    with Progress(f"publish {redact(url)}", sum(p.stat().st_size for p in files), unit="B", enabled=progress,
                  logger="fastload.publish") as bar:
        for path in files:
            name = path.relative_to(local).as_posix()
            size = upload_file(root, name, path)
            sent += size
            bar.update(size)
    for name in _listed(root, obstore):  # an older dataset's shards that this one does not have
        if _a_dataset_s(name, ("shard",)) and name not in staged and name not in elsewhere:
            _delete(root, obstore, name)
    return sent


def _listed_shards(local: Path, files: list[Path]) -> dict[str, int]:
    """Return every shard the staged manifests list, by its path under the URL, with its size in bytes."""
    shards = {}
    for path in files:
        if path.name == MANIFEST_NAME:
            folder = path.parent.relative_to(local).as_posix()
            for shard in load_manifest(path.parent).shards:
                shards[shard.file if folder == "." else f"{folder}/{shard.file}"] = shard.bytes
    return shards


def unpublish(url: str, options: StorageOptions) -> None:
    """Delete every manifest and ``splits.json`` under ``url``: the dataset there no longer looks complete.

    Done before a conversion's tasks upload shards under the URL themselves, so that no reader mixes an
    old manifest with new shards (``publish`` does the same before it uploads).
    """
    obstore = _obstore()
    root = RemoteRoot(url, options)
    for name in _manifests_at(root, obstore):
        _delete(root, obstore, name)


def finish_publish(local: Path) -> None:
    """Delete the staging directory of a dataset published whole."""
    remove_staging(local)


def _listed(root: RemoteRoot, obstore: Any) -> list[str]:
    """Return the names of every object under the URL."""
    def names() -> list[str]:
        found = []
        for batch in obstore.list(root.store):
            found += [str(meta["path"]) for meta in batch]
        return found

    return root.call("", "LIST", names)


def first_object(url: str, options: StorageOptions) -> str | None:
    """Return the name of one object under ``url`` (one LIST page), None where it holds none."""
    obstore = _obstore()
    root = RemoteRoot(url, options)

    def first() -> str | None:
        for batch in obstore.list(root.store, chunk_size=1):
            for meta in batch:
                return str(meta["path"])
        return None

    return root.call("", "LIST", first)


def _a_dataset_s(name: str, kinds: tuple[str, ...]) -> bool:
    """Return whether object ``name`` is a file of the dataset at the URL, of ``kinds`` ("json", "shard").

    Its root's manifest and ``splits.json``, its splits' (``train/``, ``val/``) manifests, and the shards
    (``shard-NNNNN.lmdb``) of each: what ``publish`` may delete. Anything else under the URL (another
    dataset in a folder of it, the user's files) is never touched.
    """
    folder, _, file = name.rpartition("/")
    if folder not in ("", *SPLIT_FOLDERS):
        return False
    if "json" in kinds and (file == MANIFEST_NAME or (folder == "" and file == SPLITS_NAME)):
        return True
    return "shard" in kinds and SHARD_FILE.fullmatch(file) is not None


def _manifests_at(root: RemoteRoot, obstore: Any) -> list[str]:
    """Return the dataset's manifests and ``splits.json`` under the URL (its splits' too), splits first."""
    return sorted((n for n in _listed(root, obstore) if _a_dataset_s(n, ("json",))),
                  key=lambda n: (not n.endswith(SPLITS_NAME), n.count("/"), n))


def read_remote_manifest(url: str, options: StorageOptions) -> Manifest:
    """Return the manifest of the dataset at ``url`` (validated as a local one is)."""
    data = RemoteRoot(url, options).read_bytes(MANIFEST_NAME, MAX_MANIFEST_BYTES)
    with tempfile.TemporaryDirectory(prefix="fastload-manifest-") as tmp:
        Path(tmp, MANIFEST_NAME).write_bytes(data)
        try:
            return load_manifest(Path(tmp))
        except DatasetError as err:
            raise DatasetError(str(err).replace(tmp, redact(url))) from None


def read_remote_json(url: str, options: StorageOptions, name: str) -> Any | None:
    """Return the JSON document ``name`` (a manifest or ``splits.json``) under ``url``, None where there is none.

    Read bounded and strict, as a local one is (DatasetError naming the URL otherwise).
    """
    root = RemoteRoot(url, options)
    try:
        data = root.read_bytes(name, MAX_MANIFEST_BYTES)
    except RemoteNotFoundError:
        return None
    with tempfile.TemporaryDirectory(prefix="fastload-manifest-") as tmp:
        path = Path(tmp, name.replace("/", "-"))
        path.write_bytes(data)
        try:
            return load_strict(path, MAX_MANIFEST_BYTES, name)
        except DatasetError as err:
            raise DatasetError(str(err).replace(str(path), root.url_of(name))) from None


def _delete(root: RemoteRoot, obstore: Any, name: str) -> None:
    root.call(name, "DELETE", lambda: obstore.delete(root.store, name))


def upload_file(root: RemoteRoot, name: str, path: Path) -> int:
    """Upload ``path`` as ``name`` under ``root``, check its stored size (HEAD), and return its bytes.

    One PUT, or a multipart upload above obstore's part size (5 MB), which the store makes visible
    only when it completes. RemoteError naming the URL when the upload fails after the retries or
    the stored size differs.
    """
    obstore = _obstore()
    size = path.stat().st_size
    root.call(name, "PUT", lambda: obstore.put(root.store, name, path))
    stored = root.size(name)
    if stored != size:
        raise RemoteError(f"{root.url_of(name)}: {stored} bytes stored after the upload of {size}")
    return size


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)
