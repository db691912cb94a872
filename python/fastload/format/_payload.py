"""Encoding and decoding one field's payload, per codec (docs/FORMAT.md, "Payload by codec").

The writers encode with fixed settings (a field's ``codec_options``), so equal
data gives equal bytes in any process and any run. The decoders are the pure
Python reader's; ``csrc/format/record_decoder.cpp`` and ``csrc/format/image_decode.cpp`` are
the native ones and decode to the same bytes: lz4 and png are exact, and jpeg
goes through the same library (libjpeg-turbo's TurboJPEG, via ctypes:
``_turbojpeg.py``) with the same calls and flags. Every decoder checks the payload's declared size or
image header against the field before decoding and raises PayloadError.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _turbojpeg
from ._codecs import (
    JPEG_DEFAULT_SUBSAMPLING,
    JPEG_QUALITY,
    PNG_LEVEL,
    Geometry,
    PayloadError,
    from_hwc,
    to_hwc,
)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# length, "IHDR", width, height, depth, color type, compression, filter, interlace
_PNG_IHDR = struct.Struct(">I4sIIBBBBB")
_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> gray, gray+alpha, RGB, RGBA
_PIL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
_TJ_SUBSAMPLING = {"444": _turbojpeg.TJSAMP_444, "422": _turbojpeg.TJSAMP_422, "420": _turbojpeg.TJSAMP_420}


def lz4_compress(data: bytes | memoryview, level: int) -> bytes:
    """Return one lz4 block (no size prefix) of ``data``: fast mode at level 0, LZ4HC at levels 1 to 12."""
    import lz4.block

    if level == 0:
        return lz4.block.compress(data, mode="default", store_size=False)
    return lz4.block.compress(data, mode="high_compression", compression=level, store_size=False)


def lz4_decompress(payload: memoryview, expected: int) -> np.ndarray:
    """Decompress one lz4 block that must hold exactly ``expected`` bytes."""
    import lz4.block

    try:
        # returns fewer bytes without an error when the block holds fewer
        data = lz4.block.decompress(payload, uncompressed_size=expected)
    except lz4.block.LZ4BlockError as err:
        raise PayloadError(f"lz4 block malformed or truncated ({err})") from None
    if len(data) != expected:
        raise PayloadError(f"lz4 block holds {len(data)} bytes, expected {expected}")
    return np.frombuffer(data, dtype=np.uint8).copy()


def png_encode(arr: np.ndarray, geometry: Geometry, options: Mapping[str, Any]) -> bytes:
    """Return a PNG of the field's array: Pillow for 8-bit samples, pypng for 16-bit; no ancillary chunks."""
    image = np.ascontiguousarray(to_hwc(arr, geometry))
    level = int(options.get("level", PNG_LEVEL))
    buf = io.BytesIO()
    if image.dtype == np.uint8:
        from PIL import Image

        Image.fromarray(image[:, :, 0] if geometry.channels == 1 else image).save(
            buf, format="PNG", compress_level=level)
    else:
        import png

        c = geometry.channels
        writer = png.Writer(width=geometry.width, height=geometry.height, greyscale=c <= 2, alpha=c in (2, 4),
                            bitdepth=16, compression=level)
        writer.write_array(buf, image.astype(np.uint16).reshape(-1))
    return buf.getvalue()


def png_check_header(payload: memoryview, geometry: Geometry, itemsize: int) -> None:
    """Check a PNG's signature and IHDR against the field, as the native decoder does, before decoding."""
    head = bytes(payload[: len(_PNG_SIGNATURE) + _PNG_IHDR.size])
    if len(head) < len(_PNG_SIGNATURE) + _PNG_IHDR.size or not head.startswith(_PNG_SIGNATURE):
        raise PayloadError("png header: not a png")
    length, kind, width, height, depth, color, _comp, _filter, interlace = _PNG_IHDR.unpack_from(
        head, len(_PNG_SIGNATURE))
    if kind != b"IHDR" or length != 13:
        raise PayloadError("png header: IHDR missing")
    if (width, height) != (geometry.width, geometry.height):
        raise PayloadError(f"png of {width}x{height} pixels, the field has {geometry.width}x{geometry.height}")
    if depth != 8 * itemsize:
        raise PayloadError(f"png of bit depth {depth}, the field has {8 * itemsize}")
    if color != _PNG_COLOR_TYPE[geometry.channels]:
        raise PayloadError(f"png color type {color} does not hold the field's {geometry.channels} channels")
    if interlace != 0:
        raise PayloadError("interlaced png (fastload writes none)")


def png_decode(payload: memoryview, geometry: Geometry, itemsize: int) -> np.ndarray:
    """Decode a PNG payload into the field's bytes (flat uint8, in the field's layout)."""
    png_check_header(payload, geometry, itemsize)
    shape = (geometry.height, geometry.width, geometry.channels)
    image: np.ndarray
    try:
        if itemsize == 1:
            from PIL import Image

            with Image.open(io.BytesIO(payload), formats=["PNG"]) as img:
                if img.mode != _PIL_MODES[geometry.channels]:
                    raise PayloadError(f"png decodes to mode {img.mode}")
                img.load()
                image = np.asarray(img, dtype=np.uint8).reshape(shape)
        else:
            import png

            width, height, rows, _info = png.Reader(bytes=bytes(payload)).read_flat()
            image = np.asarray(rows, dtype=np.uint16).reshape(shape)
    except PayloadError:
        raise
    except Exception as err:  # Pillow and pypng raise many kinds (OSError, SyntaxError, zlib.error, png.Error, ...)
        raise PayloadError(f"png data: {type(err).__name__}: {err}") from None
    return from_hwc(image, geometry)


def jpeg_encode(arr: np.ndarray, geometry: Geometry, options: Mapping[str, Any]) -> bytes:
    """Return a baseline JPEG of the field's array (libjpeg-turbo, the quality and subsampling in ``options``)."""
    quality = int(options.get("quality", JPEG_QUALITY))
    subsampling = _TJ_SUBSAMPLING[str(options.get("subsampling", JPEG_DEFAULT_SUBSAMPLING))]
    try:
        return _turbojpeg.encode(to_hwc(arr, geometry), quality, subsampling)
    except _turbojpeg.TurboJPEGError as err:
        raise PayloadError(str(err)) from None


def jpeg_decode(payload: memoryview, geometry: Geometry) -> np.ndarray:
    """Decode a JPEG payload into the field's bytes with the native reader's library, calls and flags."""
    data = bytes(payload)
    try:
        width, height, _subsampling, colorspace = _turbojpeg.decode_header(data)
        if (width, height) != (geometry.width, geometry.height):
            raise PayloadError(f"jpeg of {width}x{height} pixels, the field has {geometry.width}x{geometry.height}")
        gray = colorspace == _turbojpeg.TJCS_GRAY
        if (geometry.channels == 1) != gray or (geometry.channels == 3 and colorspace != _turbojpeg.TJCS_YCBCR):
            raise PayloadError(f"jpeg colorspace {colorspace} does not hold the field's {geometry.channels} channels")
        image = _turbojpeg.decode(data, width, height, geometry.channels)
    except _turbojpeg.TurboJPEGError as err:
        raise PayloadError(str(err)) from None
    return from_hwc(image, geometry)
