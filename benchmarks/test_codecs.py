"""Codecs side by side: ratio, conversion speed, native decode at 1 and 2 threads, and the library's own floor.

Run: ``pytest benchmarks/test_codecs.py --benchmark-only`` (part of ``make bench``; ``report.py``
adds the "codecs" table). Datasets: ``photo`` (3x128x128 uint8 tiles of scikit-image's
photographs, stride 32), ``multispectral`` (13x64x64 uint16 of 12-bit values, smooth waves plus
sensor noise of 8 levels) and
``small`` (3x32x32 uint8, the same generator). Each codec that fits the data is written with
``write_arrays`` (its time gives the conversion MB/s, one process) and read for one shuffled
epoch by ``ShardLoader`` with 1 and 2 threads (batch 256, checksums verified). Floors, measured
in the same run: ``floor-memcpy`` (numpy copying the decoded bytes) and ``floor-<codec>-library-1t``
(the codec's library alone over the same payloads laid end to end: ``LZ4_decompress_safe``,
``ZSTD_decompress``, libspng's and TurboJPEG's decode into interleaved pixels, no checks, no checksum).

Why: raw and lz4 are bound by memory bandwidth and the per-sample XXH3; zstd decodes several times
slower than lz4 for a better ratio; png pays for zlib's inflate and the PNG filters and is the
slowest per byte; jpeg's IDCT costs about as much as png's inflate per pixel but it reads ten
times fewer bytes. A codec's ``vs floor`` is native-1t over its library floor: the cost of the
record parsing, the layout (chw planes) and the checksum on top of the library.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from conftest import BATCH, SEED
from datasets import CACHE, QUICK, smooth_noisy
from measure import EpochResult, MemorySampler, extra_info, one_call_round, run_epoch

import fastload
from fastload import _native
from fastload.format._codecs import fitting_codecs
from fastload.format._record import Field, RecordEncoder

ROUNDS = {"rounds": 1, "warmup_rounds": 0} if QUICK else {"rounds": 3, "warmup_rounds": 1}


def photo_tiles() -> np.ndarray:
    photos = [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea(), skimage.data.rocket()]
    tiles = [p[y:y + 128, x:x + 128] for p in photos for y in range(0, p.shape[0] - 127, 32)
             for x in range(0, p.shape[1] - 127, 32)]
    return np.stack(tiles[:60] if QUICK else tiles).transpose(0, 3, 1, 2).copy()


def multispectral() -> np.ndarray:
    """13-band 12-bit rasters (values below 4096, as Sentinel-2's): smooth waves plus sensor noise of 8 levels."""
    rng = np.random.default_rng(0)
    n = 200 if QUICK else 2000
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    out = np.empty((n, 13, 64, 64), np.uint16)
    for i in range(n):
        fx, fy, phase = rng.uniform(0.02, 0.2, size=3)
        wave = np.sin(xx * fx + yy * fy + phase * 10)[None] * rng.uniform(300, 900, size=(13, 1, 1))
        level = rng.uniform(1000, 2500, size=(13, 1, 1))
        out[i] = np.clip(level + wave + rng.normal(0, 8, size=(13, 64, 64)), 0, 4095).astype(np.uint16)
    return out


KINDS = {
    "photo": photo_tiles,
    "multispectral": multispectral,
    "small": lambda: smooth_noisy(np.random.default_rng(0), 1000 if QUICK else 10000, (3, 32, 32), "uint8"),
}
QUICK_CODECS = {"raw", "lz4", "png"}


@cache
def images(kind: str) -> np.ndarray:
    return KINDS[kind]()


def codecs_of(kind: str) -> list[str]:
    data = images(kind)
    found = fitting_codecs(str(data.dtype), data.shape[1:], "chw")
    if data.dtype.itemsize == 1:
        found = [c for c in found if not c.endswith("-shuffle")]
    return [c for c in found if not QUICK or c in QUICK_CODECS]


CASES = [(kind, codec) for kind in KINDS for codec in codecs_of(kind)]


@dataclass
class Written:
    """A dataset written once per session: where, its ratio and its conversion speed."""

    path: Path
    ratio: float
    convert_mb_s: float


@cache
def written(kind: str, codec: str) -> Written:
    data = images(kind)
    path = CACHE / f"codecs-{kind}-{len(data)}-{codec}"
    start = time.perf_counter()
    m = fastload.write_arrays(path, {"image": data, "label": np.arange(len(data))}, codec={"image": codec},
                              layout="chw", samples_per_shard=4096, overwrite=True)
    elapsed = time.perf_counter() - start
    decoded = data.nbytes + 8 * len(data)
    return Written(path, decoded / sum(s.bytes for s in m.shards), decoded / 1e6 / elapsed)


@cache
def library_floor(kind: str, codec: str):
    """Return (closure decoding every payload once with the library alone, samples/s of its best of 3)."""
    data = images(kind)
    source = data.transpose(0, 2, 3, 1) if codec in ("png", "jpeg") else data  # the libraries decode interleaved
    field = Field("image", str(data.dtype), source.shape[1:], codec,
                  {"layout": "hwc"} if codec in ("png", "jpeg") else {})
    encoder = RecordEncoder([field])
    payloads = [encoder.encode({"image": np.ascontiguousarray(s)})[48:] for s in source]
    offsets = np.cumsum([0] + [len(p) for p in payloads], dtype=np.uint64)
    blob = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    out = np.empty(field.nbytes * len(payloads), dtype=np.uint8)
    c, h, w = data.shape[1:]

    def run() -> None:
        _native.library_decode(field.codec_id, blob, offsets, out, field.nbytes, h, w, c)

    return run, len(data) / min(_timed(run) for _ in range(3))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@cache
def memcpy_floor(kind: str):
    data = images(kind)
    src = np.full(data.nbytes, 7, dtype=np.uint8)
    dst = np.ones_like(src)

    def run() -> None:
        np.copyto(dst, src)

    return run, len(data) / min(_timed(run) for _ in range(3))


def floor_rate(kind: str, codec: str) -> float:
    return memcpy_floor(kind)[1] if codec == "raw" else library_floor(kind, codec)[1]


def record(benchmark, kind: str, codec: str, result: EpochResult, memory: MemorySampler, extra: dict) -> float:
    """Record the common figures (measure.extra_info) with the codec's floor and ``extra``; return samples/s."""
    sample_bytes = images(kind)[0].nbytes + 8
    benchmark.extra_info.update(extra_info(result, sample_bytes, floor_rate(kind, codec), memory))
    benchmark.extra_info.update({"codec": codec, **extra})
    return benchmark.extra_info["samples_per_s"]


@pytest.mark.parametrize("threads", [1, 2], ids=["native-1t", "native-2t"])
@pytest.mark.parametrize(("kind", "codec"), CASES, ids=[f"codecs-{k}-{c}" for k, c in CASES])
def test_codec_epoch(benchmark, kind, codec, threads):
    w = written(kind, codec)
    loader = fastload.ShardLoader(w.path, batch_size=BATCH, shuffle=True, seed=SEED, num_threads=threads,
                                  backend="native")
    result = EpochResult()
    benchmark.group = f"codecs-{kind}"
    with MemorySampler() as memory:
        benchmark.pedantic(lambda: run_epoch(lambda: loader, result), **ROUNDS)
    record(benchmark, kind, codec, result, memory, {"ratio": w.ratio, "convert_mb_s": w.convert_mb_s,
                                                    "threads": threads})
    assert result.samples == len(images(kind))


FLOOR_IDS = [f"codecs-{k}-floor-" + ("memcpy" if c == "raw" else f"{c}-library-1t") for k, c in CASES]


@pytest.mark.parametrize(("kind", "codec"), CASES, ids=FLOOR_IDS)
def test_codec_floor(benchmark, kind, codec):
    run = memcpy_floor(kind)[0] if codec == "raw" else library_floor(kind, codec)[0]
    benchmark.group = f"codecs-{kind}"
    result = EpochResult()
    with MemorySampler() as memory:
        benchmark.pedantic(one_call_round(run, len(images(kind)), result), **ROUNDS)
    assert record(benchmark, kind, codec, result, memory, {}) > 0
