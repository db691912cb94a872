"""Shard files written in aligned 2 MiB writes, so that readers map them 2 MiB at a time (issue 26).

Whether the page cache then holds 2 MiB folios depends on the kernel and the filesystem: the mapping
test first writes a probe file in one large write and skips, saying so, where even that is not mapped
in 2 MiB pieces.
"""

from __future__ import annotations

import mmap
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.format._manifest import file_hash
from fastload.format._page_cache import LARGE_WRITE, copy_hashed, write_aligned


class RecordingFile:
    """A binary file that records where each write lands and may write less than asked, as a raw file may."""

    def __init__(self, short_every: int = 0) -> None:
        self.data = bytearray()
        self.writes: list[tuple[int, int]] = []  # (offset, size)
        self._short_every, self._calls = short_every, 0

    def write(self, view) -> int:
        self._calls += 1
        size = len(view)
        if self._short_every and self._calls % self._short_every == 0 and size > 1:
            size //= 2
        self.writes.append((len(self.data), size))
        self.data += bytes(view[:size])
        return size


@pytest.mark.parametrize("chunking", ["small", "large-views"])
def test_write_aligned_writes_whole_aligned_pieces_and_every_byte(chunking):
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, 11 * LARGE_WRITE + 12345, dtype=np.uint8).tobytes()
    if chunking == "small":
        cuts = sorted(rng.integers(0, len(payload), 40).tolist())
    else:  # as a download streams them: views of chunks of several MiB (written from the chunk, no copy)
        cuts = [3 * LARGE_WRITE + 5, 3 * LARGE_WRITE + 9, 7 * LARGE_WRITE, 9 * LARGE_WRITE + 1]
    chunks = [memoryview(payload)[a:b] if chunking != "small" else payload[a:b]
              for a, b in zip([0, *cuts], [*cuts, len(payload)])]
    out = RecordingFile()
    assert write_aligned(out, iter(chunks)) == len(payload)
    assert bytes(out.data) == payload
    for offset, size in out.writes[:-1]:
        assert offset % LARGE_WRITE == 0 and size % LARGE_WRITE == 0 and size > 0
    short = RecordingFile(short_every=3)  # short writes are retried until every byte is out
    write_aligned(short, iter(chunks))
    assert bytes(short.data) == payload


def test_copy_hashed_copies_and_hashes(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(os.urandom(2 * LARGE_WRITE + 77))
    digest = copy_hashed(source, tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes() == source.read_bytes()
    assert digest == file_hash(source)
    (tmp_path / "empty").write_bytes(b"")
    assert copy_hashed(tmp_path / "empty", tmp_path / "empty2") == file_hash(tmp_path / "empty")


def pmd_mapped_kb(path: Path) -> int:
    """Map ``path``, touch every page, and return how many KiB of it the kernel mapped in 2 MiB pieces."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            sum(mapped[i] for i in range(0, len(mapped), 4096))
            return smaps_field(str(path), "FilePmdMapped")
        finally:
            mapped.close()


def smaps_field(path: str, field: str) -> int:
    """Return ``field`` (KiB) of this process's mapping of ``path`` in /proc/self/smaps, 0 if none."""
    current = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            current = line
        elif line.startswith(field + ":") and current.endswith(" " + path):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="2 MiB file mappings are a Linux page-cache feature")
def test_a_written_shard_is_mapped_in_2_mib_pieces(tmp_path):
    probe = tmp_path / "probe.bin"
    probe.write_bytes(os.urandom(4 * LARGE_WRITE))  # one large write: the best case of this filesystem
    if pmd_mapped_kb(probe) == 0:
        pytest.skip("this kernel or filesystem does not keep files in 2 MiB page-cache folios "
                    "(ext4 from Linux 6.16, XFS): there is nothing to gain here")
    out = tmp_path / "ds"
    fastload.write_arrays(out, {"x": np.arange(6 * 2**20, dtype=np.uint8).reshape(-1, 4096)})  # > 4 MiB of blocks
    shards = sorted(out.glob("shard-*.lmdb"))
    assert shards and shards[0].stat().st_size > 2 * LARGE_WRITE
    # Every whole 2 MiB piece of the shard is mapped at once (the tail below 2 MiB cannot be).
    assert pmd_mapped_kb(shards[0]) >= (shards[0].stat().st_size // LARGE_WRITE) * LARGE_WRITE // 1024 - 2048
