"""A cache directory shared with someone hostile: links planted in it are never followed.

Another local user who can create entries in ``cache_dir`` plants symbolic links where fastload keeps
its own directories and files (a dataset's directory, a version's, ``publish/``, lock files) that
point at a *canary* folder outside the cache. Whatever the cache then does (open, make room, evict,
stage a conversion, overwrite it), nothing in the canary changes: its files, their bytes and their
mtimes. A cache directory another user could write to is refused unless shared on purpose.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_remote import BUCKET, batches, s3, same, upload  # noqa: F401  (s3: the module's server fixture)

import fastload
from fastload.errors import FastloadWarning, RemoteError
from fastload.storage._cache import version_dir
from fastload.storage._publish import staging_dir

pytest.importorskip("obstore", reason="fastload[remote] (obstore) is not installed")
pytestmark = [
    pytest.mark.slow,  # tier: the moto S3 server
    pytest.mark.skipif(os.name == "nt", reason="symbolic links and modes as POSIX has them"),
]


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory, s3):  # noqa: F811
    """Two small datasets (4 shards each), local and uploaded: [(local path, URL), ...]."""
    _, client, _ = s3
    made = []
    for k in range(2):
        local = tmp_path_factory.mktemp(f"links{k}") / "ds"
        rng = np.random.default_rng(k)
        fastload.write_arrays(local, {"image": rng.integers(0, 255, (200, 3, 8, 8), dtype=np.uint8),
                                      "label": np.arange(200) % 5}, samples_per_shard=50)
        made.append((local, upload(client, local, f"links{k}")))
    return made


def canary(tmp_path: Path) -> Path:
    """A folder outside the cache, shaped like a dataset version, with a user's files in it."""
    folder = tmp_path / "canary"
    version = folder / ("0" * 16)
    version.mkdir(parents=True)
    (version / "manifest.json").write_text('{"not": "fastload"}')
    (version / ".readers.lock").write_text("")
    (folder / "thesis.tex").write_text("years of work")
    (folder / "shard-00000.lmdb").write_bytes(b"user bytes" * 100)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every entry under ``folder``: its bytes (files), mode and mtime in nanoseconds."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        found[str(path.relative_to(folder))] = (path.read_bytes() if path.is_file() else b"", info.st_mode,
                                                info.st_mtime_ns)
    info = folder.lstat()
    found["."] = (b"", info.st_mode, info.st_mtime_ns)
    return found


def loader(url: str, s3, cache: Path, **kwargs) -> fastload.ShardLoader:  # noqa: F811
    return fastload.ShardLoader(url, storage_options=s3[2], cache_dir=cache, batch_size=40, **kwargs)


def manifest_bytes(local: Path) -> bytes:
    return (local / "manifest.json").read_bytes()


def test_eviction_never_deletes_through_a_planted_dataset_link(two_datasets, s3, tmp_path):  # noqa: F811
    (local_a, url_a), (local_b, url_b) = two_datasets
    cache = tmp_path / "cache"
    outside = canary(tmp_path)
    before = snapshot(outside)
    size = sum(p.stat().st_size for p in local_a.iterdir())
    first = loader(url_a, s3, cache)
    assert same(batches(first), batches(fastload.ShardLoader(str(local_a), batch_size=40)))
    del first
    (cache / f"planted-{'a' * 16}").symlink_to(outside, target_is_directory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = loader(url_b, s3, cache, cache_limit=int(1.5 * size))  # room for one: the first is evicted
        assert same(batches(second), batches(fastload.ShardLoader(str(local_b), batch_size=40)))
    assert snapshot(outside) == before
    assert any(issubclass(w.category, FastloadWarning) and f"planted-{'a' * 16}" in str(w.message) for w in caught)
    assert not version_dir(cache, url_a, manifest_bytes(local_a)).exists()  # what the cache made was evicted


@pytest.mark.parametrize("where", ["dataset", "version"])
def test_a_link_at_a_datasets_own_directory_is_refused_naming_it(two_datasets, s3, tmp_path, where):  # noqa: F811
    local, url = two_datasets[0]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    outside = canary(tmp_path)
    before = snapshot(outside)
    version = version_dir(cache, url, manifest_bytes(local))
    if where == "dataset":
        planted = version.parent
    else:
        version.parent.mkdir()
        planted = version
    planted.symlink_to(outside, target_is_directory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FastloadWarning)  # the walks of the cache name the link too
        with pytest.raises(RemoteError, match=f"{planted}.* symbolic link"):
            loader(url, s3, cache)
    assert snapshot(outside) == before


@pytest.mark.parametrize("lock", [".fastload-cache.lock", ".readers.lock", "shard lock"])
def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(two_datasets, s3, tmp_path,  # noqa: F811
                                                                           lock):
    local, url = two_datasets[0]
    cache = tmp_path / "cache"
    expected = batches(fastload.ShardLoader(str(local), batch_size=40))
    assert same(batches(loader(url, s3, cache)), expected)  # the cache's directories exist now
    outside = canary(tmp_path)
    before = snapshot(outside)
    version = version_dir(cache, url, manifest_bytes(local))
    first_shard = sorted(p.name for p in local.glob("*.lmdb"))[0]
    path = {".fastload-cache.lock": cache / lock, ".readers.lock": version / lock,
            "shard lock": version / f".{first_shard}.lock"}[lock]
    (version / first_shard).unlink()  # so that its download (under its lock) comes again
    path.unlink(missing_ok=True)
    path.symlink_to(outside / "thesis.tex")
    with pytest.raises(RemoteError, match="symbolic link"):
        batches(loader(url, s3, cache))
    assert snapshot(outside) == before


def test_a_planted_shard_link_is_never_trusted_nor_written_through(two_datasets, s3, tmp_path):  # noqa: F811
    local, url = two_datasets[0]
    cache = tmp_path / "cache"
    expected = batches(fastload.ShardLoader(str(local), batch_size=40))
    assert same(batches(loader(url, s3, cache)), expected)
    outside = canary(tmp_path)
    version = version_dir(cache, url, manifest_bytes(local))
    first_shard = sorted(p.name for p in local.glob("*.lmdb"))[0]
    fake = outside / "same-size"
    fake.write_bytes(b"\0" * (local / first_shard).stat().st_size)  # the size of the shard: trusted by size before
    before = snapshot(outside)
    (version / first_shard).unlink()
    (version / first_shard).symlink_to(fake)
    assert same(batches(loader(url, s3, cache)), expected)  # downloaded again, the link replaced by the file
    assert not (version / first_shard).is_symlink()
    assert snapshot(outside) == before


@pytest.mark.parametrize("where", ["publish", "staging"])
def test_a_conversion_to_a_url_never_writes_or_deletes_through_a_planted_link(s3, tmp_path, where):  # noqa: F811
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    outside = canary(tmp_path)
    url = f"s3://{BUCKET}/links-out-{where}"
    staging = staging_dir(cache, url)
    if where == "publish":
        staging.parent.symlink_to(outside, target_is_directory=True)
    else:
        staging.parent.mkdir()
        staging.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    samples = [{"image": np.zeros((3, 4, 4), np.uint8), "label": k} for k in range(20)]
    for overwrite in (False, True):
        with pytest.raises(RemoteError, match="symbolic link"):
            fastload.write_dataset(samples, url, storage_options=s3[2], cache_dir=cache, overwrite=overwrite,
                                   progress=False)
    assert snapshot(outside) == before


def test_the_cache_directory_and_its_files_are_private(two_datasets, s3, tmp_path):  # noqa: F811
    local, url = two_datasets[0]
    cache = tmp_path / "new" / "cache"
    batches(loader(url, s3, cache))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    version = version_dir(cache, url, manifest_bytes(local))
    for path in [version.parent, version]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".lmdb") for p in files) and any(p.name == "manifest.json" for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="changing a folder's owner needs root")
def test_a_cache_directory_owned_by_another_user_is_refused_unless_shared(two_datasets, s3, tmp_path,  # noqa: F811
                                                                          monkeypatch):
    local, url = two_datasets[0]
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, 65534, 65534)
    with pytest.raises(RemoteError, match=r"theirs: refused, it is owned by another user.*FASTLOAD_SHARED_CACHE"):
        loader(url, s3, cache)
    assert not any(cache.iterdir())
    monkeypatch.setenv("FASTLOAD_SHARED_CACHE", "1")
    assert same(batches(loader(url, s3, cache)), batches(fastload.ShardLoader(str(local), batch_size=40)))


def test_a_cache_directory_others_may_write_is_refused_unless_sticky_or_shared(two_datasets, s3, tmp_path,  # noqa: F811
                                                                                monkeypatch):
    local, url = two_datasets[0]
    expected = batches(fastload.ShardLoader(str(local), batch_size=40))
    cache = tmp_path / "open"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(RemoteError, match=r"mode 0777\) and it has no sticky bit"):
        loader(url, s3, cache)
    os.chmod(cache, 0o1777)  # like /tmp: others cannot replace what this user made
    assert same(batches(loader(url, s3, cache)), expected)
    os.chmod(cache, 0o775)
    with pytest.raises(RemoteError, match="group or others may write"):
        loader(url, s3, cache)
    monkeypatch.setenv("FASTLOAD_SHARED_CACHE", "1")
    assert same(batches(loader(url, s3, cache)), expected)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making another user's folder needs root")
def test_a_directory_another_user_made_first_in_a_sticky_cache_is_refused(two_datasets, s3, tmp_path,  # noqa: F811
                                                                           monkeypatch):
    """In a cache like /tmp (sticky, world-writable) another user can make a dataset's directories before fastload
    does (their names are predictable): the cache refuses to write into them, unless shared on purpose."""
    local, url = two_datasets[0]
    cache = tmp_path / "sticky"
    cache.mkdir()
    os.chmod(cache, 0o1777)
    version = version_dir(cache, url, manifest_bytes(local))
    for made in (version.parent, version):
        made.mkdir()
        os.chown(made, 65534, 65534)
        os.chmod(made, 0o777)
    with pytest.warns(FastloadWarning, match="not taken for one of fastload's directories, it is owned by another"):
        with pytest.raises(RemoteError, match=rf"{version.parent}: refused, it is owned by another user"):
            loader(url, s3, cache)
    assert list(version.iterdir()) == []
    monkeypatch.setenv("FASTLOAD_SHARED_CACHE", "1")
    assert same(batches(loader(url, s3, cache)), batches(fastload.ShardLoader(str(local), batch_size=40)))
