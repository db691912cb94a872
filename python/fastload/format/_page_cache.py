"""Writing shard files so that the page cache can hold them in 2 MiB pieces (issue 26).

Readers map shards. In a fresh process every page of a mapping faults once; the kernel then maps
16 small pages per fault, or a whole 2 MiB piece at once when the file sits in the page cache as
2 MiB folios. Linux (ext4 from 6.16 and XFS, among others) makes a write's folios as large as the
write and its alignment allow, so a file written in aligned writes of 2 MiB is cached in 2 MiB
folios. Measured on 50,000 small records (206 MB, page cache warm; docs/benchmarks.md): a fresh
process's first epoch took 4,600 page faults against 1,600, and ran at 0.84 of its steady state
against 0.67 (1 thread, with the reader's other changes of issue 26). Elsewhere these are ordinary
writes; nothing depends on the folio size.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import BinaryIO

import xxhash

from ._manifest import HASH_ALGORITHM

LARGE_WRITE = 2 * 2**20  # one page-table entry of the level above 4 KiB pages on x86-64 and arm64 (4 KiB granule)
# Where a shard is copied once more for it (the copy costs the writer 10 to 35 % of its rate on this VM); other
# systems' page caches do not map files in larger pieces than their pages.
REWRITE_SHARDS = sys.platform.startswith("linux")


def copy_hashed(source: str | os.PathLike, dest: str | os.PathLike) -> str:
    """Copy ``source`` into a new file ``dest`` in aligned 2 MiB writes; return its content hash (manifest form)."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(LARGE_WRITE)
    view = memoryview(buffer)
    with open(source, "rb", buffering=0) as src, open(dest, "wb", buffering=0) as dst:
        while size := src.readinto(buffer):
            digest.update(view[:size])
            write_all(dst, view[:size])
    return f"{HASH_ALGORITHM}:{digest.hexdigest()}"


def write_aligned(out: BinaryIO, chunks: Iterable[bytes | memoryview]) -> int:
    """Write ``chunks`` to the binary file ``out`` from offset 0 in aligned 2 MiB writes; return the bytes written."""
    pending = bytearray()
    written = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        if pending:  # complete the 2 MiB piece begun before
            take = min(len(view), LARGE_WRITE - len(pending))
            pending += view[:take]
            view = view[take:]
            if len(pending) < LARGE_WRITE:
                continue
            write_all(out, pending)
            written += len(pending)
            pending.clear()
        whole = len(view) - len(view) % LARGE_WRITE
        write_all(out, view[:whole])  # straight from the chunk: no copy in this process
        written += whole
        pending += view[whole:]
    write_all(out, pending)
    return written + len(pending)


def write_all(out: BinaryIO, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` (an unbuffered file may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view):]
