"""Validating a shard's LMDB structure before py-lmdb reads it.

LMDB trusts its file: a bad page size, root page or node offset crashes the
process inside liblmdb. ``validate_shard`` checks the whole structure first,
with the native validator (``csrc/format/lmdb_validator.h``, which documents every
check) when the extension is built and with ``python_walk``, the same checks in
pure Python, otherwise. Both raise ``CorruptShardError`` with the same reasons.

A format v4 shard (``packed``) holds blocks of records (format/_blocks.py): its LMDB
entries are as many blocks as its meta page says (at least one), and each block's
header and index are then checked as ``csrc/format/record_blocks.cpp`` checks them,
in the same order and with the same messages ("block 3: ..."), the records of all
blocks adding up to the manifest's count.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from typing import Any

from ..errors import CorruptShardError, ShardNotFoundError
from ._blocks import BLOCK_VERSION, BlockError, unpack_block

MAGIC, DATA_VERSION = 0xBEEFC0DE, 1
PAGE_HEADER, NODE_HEADER, KEY_BYTES = 16, 8, 8
BRANCH, LEAF, OVERFLOW, META = 0x01, 0x02, 0x04, 0x08
BIGDATA = 0x01
INVALID_PAGE = 2**64 - 1
MAX_DEPTH = 32
MIN_PAGE, MAX_PAGE = 4096, 32768
MIN_SHARD_BYTES = 2 * MIN_PAGE
ENV_FLAGS_REQUIRED, ENV_FLAGS_ALLOWED = 0x0008, 0x0008 | 0x4000
ANY_ENTRY_COUNT = 2**64 - 1  # the native kAnyEntryCount: a v4 shard's entries are blocks, as many as it says


class _Corrupt(Exception):
    """A structure problem; ``plain`` ones are not prefixed as LMDB-level."""

    def __init__(self, reason: str, plain: bool = False) -> None:
        super().__init__(reason)
        self.plain = plain


def _db(b: Any, off: int) -> tuple[int, ...]:
    # pad, flags, depth, branch, leaf, overflow, entries, root
    return struct.unpack_from("<IHHQQQQQ", b, off)


def _meta(b: Any, offset: int, index: int) -> dict[str, Any]:
    name = f"meta page {index}"
    if offset + PAGE_HEADER + 136 > len(b):
        raise _Corrupt(f"{name} lies past the end of the file")
    pgno, _pad, flags = struct.unpack_from("<QHH", b, offset)
    if flags != META:
        raise _Corrupt(f"{name}: page flags are not P_META")
    if pgno != index:
        raise _Corrupt(f"{name}: wrong page number in its header")
    magic, version = struct.unpack_from("<II", b, offset + PAGE_HEADER)
    if magic != MAGIC:
        raise _Corrupt(f"{name}: bad magic (not an LMDB file)")
    if version != DATA_VERSION:
        raise _Corrupt(f"{name}: format version {version}, expected 1")
    free = _db(b, offset + PAGE_HEADER + 24)
    main = _db(b, offset + PAGE_HEADER + 72)
    last_page, txnid = struct.unpack_from("<QQ", b, offset + PAGE_HEADER + 120)
    psize, env_flags = free[0], free[1]
    if psize & (psize - 1) or not MIN_PAGE <= psize <= MAX_PAGE:
        raise _Corrupt(f"{name}: page size {psize} is not a power of two in [4096, 32768]")
    if env_flags & ENV_FLAGS_REQUIRED != ENV_FLAGS_REQUIRED or env_flags & ~ENV_FLAGS_ALLOWED:
        raise _Corrupt(f"{name}: unexpected environment flags {env_flags}")
    if main[1] != 0 or main[0] != 0:
        raise _Corrupt(f"{name}: the database has flags {main[1]} (fastload writes one plain database)")
    return {"psize": psize, "main": main, "last_page": last_page, "txnid": txnid}


def _check_last_page(m: dict[str, Any], index: int, used: bool, size: int, expected: int) -> int:
    """Check one meta page's last page and, for the used one, its database; return the entries to walk."""
    name = f"meta page {index}"
    last = m["last_page"]
    needed = (last + 1) * m["psize"]
    if last < 1 or last + 1 >= 2**64 or needed >= 2**64:
        raise _Corrupt(f"{name}: last page {last} is impossible")
    if needed > size:
        raise _Corrupt(f"truncated: the file has {size} bytes, its LMDB pages need {needed}", plain=True)
    _pad, _flags, depth, _b, _l, _o, entries, root = m["main"]
    if not used:
        if root != INVALID_PAGE and not 2 <= root <= last:
            raise _Corrupt(f"{name}: root page out of range")
        return expected
    if expected == ANY_ENTRY_COUNT:  # v4: the entries are blocks, as many as the file says (at least one)
        if entries in (0, ANY_ENTRY_COUNT):
            raise _Corrupt(f"holds {entries} blocks", plain=True)
        expected = entries
    elif entries != expected:
        raise _Corrupt(f"holds {entries} records, the manifest says {expected}", plain=True)
    if expected == 0:
        if root != INVALID_PAGE or depth != 0:
            raise _Corrupt(f"{name}: an empty database with a root page")
        return expected
    if not 2 <= root <= last:
        raise _Corrupt(f"{name}: root page {root} is not in [2, {last}]")
    if not 1 <= depth <= MAX_DEPTH:
        raise _Corrupt(f"{name}: tree depth {depth}")
    return expected


class _Walk:
    def __init__(self, b: Any, psize: int, last_page: int, keep_values: bool = False) -> None:
        self.b, self.psize, self.last = b, psize, last_page
        self.used = bytearray(last_page + 1)
        self.next_key = 0
        self.branch = self.leaf = self.overflow = 0
        self.keep_values = keep_values
        self.values: list[tuple[int, int]] = []  # with keep_values, per key: (file offset, size) of its value

    def page(self, pgno: int, what: str) -> int:
        if not 2 <= pgno <= self.last:
            raise _Corrupt(f"{what} page number {pgno} is not in [2, {self.last}]")
        return pgno * self.psize

    def claim(self, pgno: int, what: str) -> None:
        if self.used[pgno]:
            raise _Corrupt(f"{what} page {pgno} is used twice")
        self.used[pgno] = 1

    def node_count(self, p: int, pgno: int) -> int:
        lower, upper = struct.unpack_from("<HH", self.b, p + 12)
        if lower < PAGE_HEADER or lower & 1 or lower > upper or upper > self.psize:
            raise _Corrupt(f"page {pgno}: mp_lower {lower} / mp_upper {upper} are not a valid free range")
        return (lower - PAGE_HEADER) // 2

    def node_offset(self, p: int, pgno: int, i: int) -> int:
        upper = struct.unpack_from("<H", self.b, p + 14)[0]
        off = struct.unpack_from("<H", self.b, p + PAGE_HEADER + 2 * i)[0]
        if off < upper or off & 1 or off + NODE_HEADER > self.psize:
            raise _Corrupt(f"page {pgno}: node {i} offset {off} lies outside the page's node area")
        return off

    def run(self, root: int, depth: int) -> None:
        stack: list[tuple[int, int, int, int | None]] = [(root, 0, 0, None)]
        while stack:
            pgno, level, lo, hi = stack.pop()
            p = self.page(pgno, "tree")
            self.claim(pgno, "tree")
            head, _pad, flags = struct.unpack_from("<QHH", self.b, p)
            if head != pgno:
                raise _Corrupt(f"page {pgno}: wrong page number in its header")
            leaf_level = level + 1 == depth
            if flags != (LEAF if leaf_level else BRANCH):
                kind = "leaf" if leaf_level else "branch"
                raise _Corrupt(f"page {pgno}: flags {flags}, expected a {kind} page at depth {level}")
            if leaf_level:
                self.leaf += 1
                self.leaf_page(p, pgno, lo, hi)
            else:
                self.branch += 1
                stack.extend(reversed(self.branch_page(p, pgno, level, lo, hi)))

    def branch_page(self, p: int, pgno: int, level: int, lo: int,
                    hi: int | None) -> list[tuple[int, int, int, int | None]]:
        n = self.node_count(p, pgno)
        if n < 2:
            raise _Corrupt(f"branch page {pgno} has {n} children")
        children: list[list[Any]] = []
        for i in range(n):
            off = self.node_offset(p, pgno, i)
            c_lo, c_hi, c_flags, ksize = struct.unpack_from("<HHHH", self.b, p + off)
            if off + NODE_HEADER + ksize > self.psize or (i > 0 and ksize != KEY_BYTES):
                raise _Corrupt(f"branch page {pgno}: node {i} key size {ksize}")
            if i > 0:
                sep = int.from_bytes(self.b[p + off + NODE_HEADER:p + off + NODE_HEADER + 8], "big")
                if sep <= lo or (hi is not None and sep >= hi):
                    raise _Corrupt(f"branch page {pgno}: separator key {sep} out of order")
                children[-1][3] = sep
                lo = sep
            children.append([c_lo | c_hi << 16 | c_flags << 32, level + 1, lo, hi])
        return [(c[0], c[1], c[2], c[3]) for c in children]

    def leaf_page(self, p: int, pgno: int, lo: int, hi: int | None) -> None:
        n = self.node_count(p, pgno)
        if n < 1:
            raise _Corrupt(f"leaf page {pgno} is empty")
        for i in range(n):
            off = self.node_offset(p, pgno, i)
            where = f"leaf page {pgno} node {i}"
            d_lo, d_hi, nflags, ksize = struct.unpack_from("<HHHH", self.b, p + off)
            dsize = d_lo | d_hi << 16
            if nflags not in (0, BIGDATA):
                raise _Corrupt(f"{where}: node flags {nflags}")
            if ksize != KEY_BYTES or off + NODE_HEADER + KEY_BYTES > self.psize:
                raise _Corrupt(f"{where}: key size {ksize}, expected 8")
            key = int.from_bytes(self.b[p + off + NODE_HEADER:p + off + NODE_HEADER + 8], "big")
            if key != self.next_key or key < lo or (hi is not None and key >= hi):
                raise _Corrupt(f"{where}: key {key} where key {self.next_key} belongs")
            data_off = off + NODE_HEADER + KEY_BYTES
            if nflags == BIGDATA:
                if data_off + 8 > self.psize:
                    raise _Corrupt(f"{where}: overflow page number outside the page")
                run = struct.unpack_from("<Q", self.b, p + data_off)[0]
                self.overflow_run(run, dsize, where)
                value = run * self.psize + PAGE_HEADER
            elif data_off + dsize > self.psize:
                raise _Corrupt(f"{where}: value of {dsize} bytes runs past the page")
            else:
                value = p + data_off
            if self.keep_values:
                self.values.append((value, dsize))
            self.next_key += 1

    def overflow_run(self, pgno: int, dsize: int, where: str) -> None:
        p = self.page(pgno, "overflow")
        head, _pad, flags, pages = struct.unpack_from("<QHHI", self.b, p)
        if flags != OVERFLOW or head != pgno:
            raise _Corrupt(f"{where}: page {pgno} is not the start of an overflow run")
        needed = (PAGE_HEADER - 1 + dsize) // self.psize + 1
        if pages != needed or pgno + pages - 1 > self.last:
            raise _Corrupt(f"{where}: overflow run of {pages} pages at page {pgno} does not fit a "
                           f"{dsize}-byte value inside the file")
        for q in range(pgno, pgno + pages):
            self.claim(q, "overflow")
        self.overflow += pages


def check_blocks(b: Any, values: list[tuple[int, int]], expected: int, version: int = BLOCK_VERSION) -> None:
    """Check the blocks of a v4 shard, whose LMDB values lie at ``values`` (file offset, size) in ``b``.

    Raises ``_Corrupt`` (plain: "block B: ...") on the first problem: each block as ``_blocks.unpack_block``
    checks it (the native ``unpack_blocks``' checks and messages), then the blocks' records adding up to
    ``expected``. Each block's overflow run header was checked by the walk (as the native validator's
    RunHeaders::now).
    """
    key, problem = 0, ""
    with memoryview(b) as view:  # released before the caller closes its mapping, also on an error
        for number, (offset, size) in enumerate(values):
            with view[offset:offset + size] as value:
                try:
                    key += len(unpack_block(value, number, key, version, expected - key))
                except BlockError as err:
                    problem = str(err)
            if problem:
                break
    if problem:
        raise _Corrupt(problem, plain=True)
    if key != expected:
        raise _Corrupt(f"holds {key} records, the manifest says {expected}", plain=True)


def python_walk(b: Any, expected: int, packed: bool = False) -> dict[str, int]:
    """Validate the bytes of a whole shard file in pure Python; raise ``_Corrupt`` on the first problem.

    With ``packed`` (format v4) the LMDB entries are blocks, as many as the file says, and ``expected``
    is the number of records they hold (:func:`check_blocks`).
    """
    size = len(b)
    if size == 0:
        raise _Corrupt("the file is empty (0 bytes)")
    if size < MIN_SHARD_BYTES:
        raise _Corrupt(f"{size} bytes, too short for an LMDB file")
    m0 = _meta(b, 0, 0)
    psize = m0["psize"]
    if size < 2 * psize:
        raise _Corrupt("the file is shorter than its two meta pages")
    m1 = _meta(b, psize, 1)
    if m1["psize"] != psize:
        raise _Corrupt(f"meta pages disagree on the page size ({psize} and {m1['psize']})")
    second = m1["txnid"] > m0["txnid"]
    entries = ANY_ENTRY_COUNT if packed else expected
    _check_last_page(m0 if second else m1, 0 if second else 1, False, size, entries)
    meta = m1 if second else m0
    entries = _check_last_page(meta, 1 if second else 0, True, size, entries)
    _pad, _flags, depth, n_branch, n_leaf, n_overflow, _entries, root = meta["main"]
    walk = _Walk(b, psize, meta["last_page"], keep_values=packed)
    if entries:
        walk.run(root, depth)
        if walk.next_key != entries:
            raise _Corrupt(f"the tree holds {walk.next_key} records")
        if (walk.branch, walk.leaf, walk.overflow) != (n_branch, n_leaf, n_overflow):
            raise _Corrupt(f"the database record says {n_branch}/{n_leaf}/{n_overflow} branch/leaf/overflow "
                           f"pages, the tree has {walk.branch}/{walk.leaf}/{walk.overflow}")
    if packed:
        check_blocks(b, walk.values, expected)
    return {"page_size": psize, "last_page": meta["last_page"], "depth": depth if entries else 0,
            "branch_pages": walk.branch, "leaf_pages": walk.leaf, "overflow_pages": walk.overflow}


def open_regular(path: str) -> int:
    """Open ``path`` read-only without blocking (a FIFO never waits) and check it is a non-empty regular file.

    Windows has no ``O_NONBLOCK`` (nor FIFOs in the file system): the flag is used where it exists.
    """
    try:
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ShardNotFoundError(path) from None
    except OSError as err:
        raise CorruptShardError(path, f"open: {path}: cannot open the file ({err.strerror})") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif st.st_size == 0:
        problem = "the file is empty (0 bytes)"
    if problem:
        os.close(fd)
        raise CorruptShardError(path, f"open: {path}: {problem}")
    return fd


def validate_python(path: str, expected: int, packed: bool = False) -> dict[str, int]:
    """Validate shard ``path`` with the pure-Python walk; raise ``CorruptShardError`` naming the problem.

    ``packed``: a format v4 shard, whose ``expected`` records lie in blocks (:func:`check_blocks`).
    """
    fd = open_regular(path)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as b:
            return python_walk(b, expected, packed)
    except _Corrupt as err:
        reason = str(err) if err.plain else f"not a readable LMDB file: {err}"
        raise CorruptShardError(path, f"open: {path}: {reason}") from None
    finally:
        os.close(fd)


def _native_module() -> Any:
    from .._extension import native

    return native


def validate_shard(path: str, expected: int, use_native: bool | None = None, packed: bool = False) -> dict[str, int]:
    """Validate shard ``path`` (natively when the extension is built, unless ``use_native`` says otherwise).

    ``packed``: a format v4 shard (``Manifest.packed``), whose LMDB entries are blocks holding the
    ``expected`` records; their headers and indexes are checked too.
    """
    native = _native_module() if use_native is not False else None
    if use_native and native is None:
        raise ImportError("fastload._native is not available")
    if native is not None:
        return dict(native.validate_shard(path, expected, packed))
    return validate_python(path, expected, packed)
