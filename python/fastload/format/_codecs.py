"""The codecs of a field's payload (docs/FORMAT.md): which fields each can hold, and encoding and decoding one payload.

The record itself (header, entries, checksums) is ``_format.py``. Encoders use
fixed settings that the manifest records in ``codec_options``, so the bytes
written depend only on the data and those options (never on the worker or the
run). Decoders raise :class:`PayloadError` with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._dtypes import NUMPY_DTYPES

CODECS = {"raw": 0, "zstd": 1, "zstd-shuffle": 2, "lz4": 3, "lz4-shuffle": 4, "png": 5, "jpeg": 6}
IMAGE_CODECS = ("png", "jpeg")
LOSSY_CODECS = ("jpeg",)
LAYOUTS = ("chw", "hwc")
LZ4_MAX_BYTES = 0x7E000000  # LZ4_MAX_INPUT_SIZE: the largest block lz4 compresses
PNG_LEVEL = 6  # zlib level of PNG's deflate stream
JPEG_QUALITY = 90
JPEG_SUBSAMPLING = ("444", "422", "420")  # chroma subsampling of 3-channel JPEGs
JPEG_DEFAULT_SUBSAMPLING = "420"
# The codec_options each codec takes; ``layout`` is every field's (raw fields of 3-D images record it too).
OPTION_KEYS = {"raw": ("layout",), "zstd": ("layout", "level"), "zstd-shuffle": ("layout", "level"),
               "lz4": ("layout", "level"), "lz4-shuffle": ("layout", "level"), "png": ("layout", "level"),
               "jpeg": ("layout", "quality", "subsampling")}


class PayloadError(Exception):
    """A payload does not decode to the field; the caller adds field, shard and record."""


class Geometry(NamedTuple):
    """The image an image codec's payload holds: height, width, channels, and chw (planar) or not."""

    height: int
    width: int
    channels: int
    planar: bool


def image_geometry(shape: Sequence[int], layout: Any) -> Geometry | None:
    """Return the image of a field of ``shape`` in ``layout`` ('chw' or 'hwc'; unused for 2-D), or None."""
    if len(shape) == 2:
        return Geometry(shape[0], shape[1], 1, False)
    if len(shape) == 3 and layout == "chw":
        return Geometry(shape[1], shape[2], shape[0], True)
    if len(shape) == 3 and layout == "hwc":
        return Geometry(shape[0], shape[1], shape[2], False)
    return None


def codec_problem(codec: str, dtype: str, shape: Sequence[int], options: Mapping[str, Any]) -> str | None:
    """Return why ``codec`` cannot hold a field of ``dtype`` and ``shape`` (with ``options``), or None if it can."""
    if codec not in CODECS:
        return f"unknown codec {codec!r}"
    nbytes = float(np.prod(shape, dtype=np.float64)) * NUMPY_DTYPES[dtype].itemsize
    if codec in ("lz4", "lz4-shuffle") and nbytes > LZ4_MAX_BYTES:
        return f"{codec} holds at most {LZ4_MAX_BYTES} bytes per field"
    if codec not in IMAGE_CODECS:
        return None
    if len(shape) == 3 and options.get("layout") not in LAYOUTS:
        return f"{codec} needs codec_options layout 'chw' or 'hwc' for a 3-D field"
    geometry = image_geometry(shape, options.get("layout"))
    if geometry is None:
        return f"{codec} holds images (2-D, or 3-D chw/hwc), not shape {tuple(shape)}"
    if codec == "png":
        if dtype not in ("uint8", "uint16"):
            return f"png holds uint8 or uint16, not {dtype}"
        if not 1 <= geometry.channels <= 4:
            return f"png holds 1 to 4 channels, not {geometry.channels}"
        limit = 2**31 - 1
    else:
        if dtype != "uint8":
            return f"jpeg holds uint8, not {dtype}"
        if geometry.channels not in (1, 3):
            return f"jpeg holds 1 or 3 channels, not {geometry.channels}"
        limit = 65535
    if not (1 <= geometry.height <= limit and 1 <= geometry.width <= limit):
        return f"{codec} holds images of 1 to {limit} pixels a side, not {geometry.height}x{geometry.width}"
    return None


def guess_layout(shape: Sequence[int]) -> str | None:
    """Return 'chw' or 'hwc' when exactly one reading of a 3-D shape has 1 to 4 channels, else None."""
    chw, hwc = 1 <= shape[0] <= 4, 1 <= shape[2] <= 4
    return "chw" if chw and not hwc else "hwc" if hwc and not chw else None


def fitting_codecs(dtype: str, shape: Sequence[int], layout: str | None) -> list[str]:
    """Return the codecs that can hold a field of ``dtype`` and ``shape`` laid out as ``layout``."""
    options = {"layout": layout} if layout else {}
    return [c for c in CODECS if codec_problem(c, dtype, shape, options) is None]


def default_options(codec: str, level: int | None = None, layout: str | None = None, quality: int | None = None,
                    subsampling: str | None = None) -> dict[str, Any]:
    """Return the encoder settings a field of ``codec`` records in the manifest (the defaults where None)."""
    if codec in ("zstd", "zstd-shuffle"):
        return {"level": 3 if level is None else level}
    if codec in ("lz4", "lz4-shuffle"):
        return {"level": 0 if level is None else level}
    options: dict[str, Any] = {"layout": layout} if layout else {}
    if codec == "png":
        options["level"] = PNG_LEVEL if level is None else level
    elif codec == "jpeg":
        options["quality"] = JPEG_QUALITY if quality is None else quality
        options["subsampling"] = subsampling or JPEG_DEFAULT_SUBSAMPLING
    return options


def options_problem(codec: str, options: Mapping[str, Any]) -> str | None:
    """Return what is wrong with ``codec``'s options (an unknown name, a value out of range), or None."""
    known = OPTION_KEYS.get(codec, ())
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        return f"unknown option {unknown[0][:40]!r} for codec {codec!r}; it takes {', '.join(known)}"
    level = options.get("level")
    if level is not None and (not isinstance(level, int) or isinstance(level, bool)):
        return f"level {level!r} is not an integer"
    if codec in ("lz4", "lz4-shuffle") and level is not None and not 0 <= level <= 12:
        return f"lz4 level {level} is not 0 (fast) to 12 (high compression)"
    if codec == "png" and level is not None and not 0 <= level <= 9:
        return f"png level {level} is not 0 to 9"
    if codec == "jpeg":
        quality = options.get("quality", JPEG_QUALITY)
        if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
            return f"jpeg quality {quality!r} is not an integer from 1 to 100"
        if options.get("subsampling", JPEG_DEFAULT_SUBSAMPLING) not in JPEG_SUBSAMPLING:
            return f"jpeg subsampling {options.get('subsampling')!r} is not one of {list(JPEG_SUBSAMPLING)}"
    if "layout" in options and options["layout"] not in LAYOUTS:
        return f"layout {options['layout']!r} is not one of {list(LAYOUTS)}"
    return None


def shuffle_bytes(raw: np.ndarray, itemsize: int) -> bytes:
    """Group byte k of every element together (k = 0..itemsize-1): the shuffle filter.

    ``raw`` is the flat uint8 view of the elements.
    """
    if itemsize == 1:
        return raw.tobytes()
    return raw.reshape(-1, itemsize).T.tobytes()


def unshuffle_bytes(data: bytes | np.ndarray, itemsize: int) -> np.ndarray:
    """Invert :func:`shuffle_bytes`; returns a writable uint8 array."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if itemsize == 1:
        return raw.copy()
    return raw.reshape(itemsize, -1).T.copy().reshape(-1)


def to_hwc(arr: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Return a field's array as the (height, width, channels) image its codec stores."""
    if arr.ndim == 2:
        return arr[:, :, None]
    return arr.transpose(1, 2, 0) if geometry.planar else arr


def from_hwc(image: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Return the flat, writable uint8 bytes of a decoded (height, width, channels) image in the field's layout."""
    if geometry.planar:
        image = image.transpose(2, 0, 1)
    return np.ascontiguousarray(image).reshape(-1).view(np.uint8).copy()
