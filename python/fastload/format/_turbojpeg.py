"""libjpeg-turbo's TurboJPEG API through ctypes: the same library and calls as the native decoder.

The pure-Python reader must decode JPEG payloads bit-identically to
``csrc/format/image_decode.cpp``, so it calls the very functions the extension calls
(``tjDecompressHeader3`` and ``tjDecompress2`` with the same flags), and the
writer encodes with ``tjCompress2``. Warnings are errors (TJFLAG_STOPONWARNING):
a truncated or damaged stream raises, never returns a partly gray image.
Handles are per thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from functools import lru_cache
from typing import Any

import numpy as np

TJPF_RGB, TJPF_GRAY = 0, 6
TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_GRAY = 0, 1, 2, 3
TJCS_YCBCR, TJCS_GRAY = 1, 2
TJFLAG_STOPONWARNING = 8192
TJFLAG_LIMITSCANS = 32768
DECODE_FLAGS = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS  # as csrc/format/image_decode.cpp

_UBYTE_P = ctypes.POINTER(ctypes.c_ubyte)
_INT_P = ctypes.POINTER(ctypes.c_int)


class TurboJPEGError(Exception):
    """The library refused a stream (or is missing); the message is its own."""


@lru_cache(maxsize=1)
def _library() -> Any:
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError as err:
        raise TurboJPEGError(f"jpeg needs libjpeg-turbo's TurboJPEG library ({err})") from None
    lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjInitCompress.restype = ctypes.c_void_p
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    lib.tjGetErrorStr2.restype = ctypes.c_char_p
    lib.tjGetErrorStr2.argtypes = [ctypes.c_void_p]
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong, _INT_P, _INT_P, _INT_P,
                                        _INT_P]
    lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.tjCompress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_int, ctypes.POINTER(_UBYTE_P), ctypes.POINTER(ctypes.c_ulong), ctypes.c_int,
                                ctypes.c_int, ctypes.c_int]
    lib.tjFree.argtypes = [_UBYTE_P]
    return lib


class _Handle:
    """One TurboJPEG handle, destroyed with its owner."""

    def __init__(self, compress: bool) -> None:
        self.lib = _library()
        self.ptr = self.lib.tjInitCompress() if compress else self.lib.tjInitDecompress()
        if not self.ptr:
            raise MemoryError("tjInit failed")

    def error(self, what: str) -> TurboJPEGError:
        return TurboJPEGError(f"jpeg {what}: {self.lib.tjGetErrorStr2(self.ptr).decode(errors='replace')}")

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.tjDestroy(self.ptr)


_local = threading.local()


def _handle(compress: bool) -> _Handle:
    attr = "compressor" if compress else "decompressor"
    handle = getattr(_local, attr, None)
    if handle is None:
        handle = _Handle(compress)
        setattr(_local, attr, handle)
    return handle


def _failed(h: _Handle, what: str) -> TurboJPEGError:
    """Return the handle's error and drop the handle (as ``csrc/format/image_decode.cpp`` does).

    TurboJPEG 2.x leaves a handle whose header read failed mid-stream: the next, intact stream would fail too.
    """
    err = h.error(what)
    _local.decompressor = None
    return err


def decode_header(data: bytes) -> tuple[int, int, int, int]:
    """Return (width, height, subsampling, colorspace) from a JPEG's header."""
    h = _handle(False)
    width, height, subsamp, colorspace = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if h.lib.tjDecompressHeader3(h.ptr, data, len(data), ctypes.byref(width), ctypes.byref(height),
                                 ctypes.byref(subsamp), ctypes.byref(colorspace)) != 0:
        raise _failed(h, "header")
    return width.value, height.value, subsamp.value, colorspace.value


def decode(data: bytes, width: int, height: int, channels: int) -> np.ndarray:
    """Decode into a (height, width, channels) uint8 array: RGB or gray, the native decoder's flags."""
    h = _handle(False)
    out = np.empty((height, width, channels), dtype=np.uint8)
    pixel_format = TJPF_GRAY if channels == 1 else TJPF_RGB
    if h.lib.tjDecompress2(h.ptr, data, len(data), out.ctypes.data, width, 0, height, pixel_format,
                           DECODE_FLAGS) != 0:
        raise _failed(h, "data")
    return out


def encode(image: np.ndarray, quality: int, subsampling: int) -> bytes:
    """Encode a (height, width, 1 or 3) uint8 image as a baseline JPEG (gray, or RGB with ``subsampling``)."""
    image = np.ascontiguousarray(image, dtype=np.uint8)
    height, width, channels = image.shape
    h = _handle(True)
    buf = _UBYTE_P()
    size = ctypes.c_ulong(0)
    gray = channels == 1
    status = h.lib.tjCompress2(h.ptr, image.ctypes.data, width, 0, height, TJPF_GRAY if gray else TJPF_RGB,
                               ctypes.byref(buf), ctypes.byref(size), TJSAMP_GRAY if gray else subsampling, quality, 0)
    try:
        if status != 0:
            raise h.error("encode")
        return ctypes.string_at(buf, size.value)
    finally:
        if buf:
            h.lib.tjFree(buf)
