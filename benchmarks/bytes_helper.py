"""The peers' copies of benchmarks/test_bytes.py's samples: Streaming's MDS and LitData's chunks, each in a process.

``python bytes_helper.py {mds|litdata} SRC OUT [ZSTD_FIELD]``: SRC holds one ``NAME.npy`` per field
(``[N, *shape]``, loaded memory-mapped); OUT receives the peer's files. Every array field is written
as a fixed-shape array column (MDS ``ndarray:DTYPE:SHAPE``, LitData a numpy array), ``label`` as an
int. ``ZSTD_FIELD``, when given, names a field stored instead as the bytes of its zstd compression
(level 3, the library fastload uses, so the same bytes as fastload's records carry), uncompressed by
the peer: both formats hold the same stored bytes and differ only in their own overhead.

The peers are optional (benchmarks/peer_streaming.py and benchmarks/peer_litdata.py say how to
install them); :func:`available` says which import here.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import peer_streaming  # noqa: E402

PEERS = ("mds", "litdata")
CHUNK = "64MB"  # the shard (MDS) and chunk (LitData) size of the other benchmarks
_SOURCE_ENV = "FASTLOAD_BYTES_SOURCE"
_ZSTD_ENV = "FASTLOAD_BYTES_ZSTD"


def available() -> dict[str, bool]:
    """Return, per peer, whether it can be imported here."""
    return {"mds": peer_streaming.available(), "litdata": importlib.util.find_spec("litdata") is not None}


def write_peers(peers: list[str], source: Path, out: dict[str, Path], zstd_field: str | None = None) -> dict[str, str]:
    """Write the samples of ``source`` (one ``NAME.npy`` per field) in each peer's format to ``out[peer]``.

    Each peer runs in a fresh process, all at once (sizes do not depend on the timing). Returns, per
    peer that failed, the last line of its output.
    """
    children = {}
    for peer in peers:
        args = [sys.executable, __file__, peer, str(source), str(out[peer])] + ([zstd_field] if zstd_field else [])
        children[peer] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = {}
    for peer, child in children.items():
        output, _ = child.communicate(timeout=1800)
        if child.returncode != 0:
            lines = output.strip().splitlines()
            failed[peer] = lines[-1] if lines else f"exit status {child.returncode}"
    return failed


def _arrays(source: str) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p, mmap_mode="r") for p in sorted(Path(source).glob("*.npy"))}


def _compressor(level: int = 3) -> Any:
    import zstandard

    return zstandard.ZstdCompressor(level=level)


def _write_mds(source: str, out: str, zstd_field: str | None) -> None:
    found = peer_streaming.streaming_base()
    assert found is not None, "Streaming is not installed"
    mds_writer = found[1]
    arrays = _arrays(source)
    columns = {}
    for name, a in arrays.items():
        if name == "label":
            columns[name] = "int"
        elif name == zstd_field:
            columns[name] = "bytes"
        else:
            columns[name] = f"ndarray:{a.dtype.name}:{','.join(str(n) for n in a.shape[1:])}"
    compress = _compressor().compress if zstd_field else None
    count = len(next(iter(arrays.values())))
    with mds_writer(out=out, columns=columns, size_limit=CHUNK) as writer:
        for i in range(count):
            sample: dict[str, Any] = {}
            for name, a in arrays.items():
                if name == "label":
                    sample[name] = int(a[i])
                elif name == zstd_field:
                    assert compress is not None
                    sample[name] = compress(np.ascontiguousarray(a[i]).data)
                else:
                    sample[name] = np.ascontiguousarray(a[i])
            writer.write(sample)


_LITDATA: dict[str, Any] = {}


def _litdata_sample(index: int) -> dict[str, Any]:
    """Return sample ``index`` as LitData's ``optimize`` stores it (run in its worker processes)."""
    if not _LITDATA:
        _LITDATA["arrays"] = _arrays(os.environ[_SOURCE_ENV])
        _LITDATA["zstd"] = os.environ.get(_ZSTD_ENV) or None
    sample: dict[str, Any] = {}
    for name, a in _LITDATA["arrays"].items():
        if name == "label":
            sample[name] = int(a[index])
        elif name == _LITDATA["zstd"]:
            sample[name] = _compressor().compress(np.ascontiguousarray(a[index]).data)
        else:
            sample[name] = np.ascontiguousarray(a[index])
    return sample


def _write_litdata(source: str, out: str, zstd_field: str | None) -> None:
    from litdata import optimize

    os.environ[_SOURCE_ENV] = source  # LitData's workers read the samples themselves
    os.environ[_ZSTD_ENV] = zstd_field or ""
    count = len(next(iter(_arrays(source).values())))
    optimize(fn=_litdata_sample, inputs=list(range(count)), output_dir=out, chunk_bytes=CHUNK, num_workers=1,
             mode="overwrite")


if __name__ == "__main__":
    peer, src, dst = sys.argv[1:4]
    field = sys.argv[4] if len(sys.argv) > 4 else None
    {"mds": _write_mds, "litdata": _write_litdata}[peer](src, dst, field)
