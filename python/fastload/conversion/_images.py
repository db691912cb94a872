"""Reading source images and rasters (PNG, JPEG, TIFF, NPY, HDF5) as height x width x channels arrays."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from ..errors import ArgumentError, ImageReadError, PreprocessError
from ..format._georef import read_georef
from ._layouts import LayoutError, npy_hwc_shape, npy_layout_of

IMAGE_SUFFIXES = {".png": "pillow", ".jpg": "pillow", ".jpeg": "pillow", ".tif": "tiff", ".tiff": "tiff", ".npy": "npy",
                  ".h5": "hdf5", ".hdf5": "hdf5"}

# Tiles are cut from rasters far larger than Pillow's decompression-bomb limit.
Image.MAX_IMAGE_PIXELS = None

# Pillow mode -> (mode to convert to, or None to keep).
_PILLOW_CONVERT = {"1": "L", "P": None, "PA": "RGBA", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB"}
_CHANNEL_AXES = "SCQIZ"  # tifffile axis codes that can stand for bands


@dataclass(frozen=True)
class ImageInfo:
    """Shape (height, width, channels) and dtype of a source image, read from its header."""

    height: int
    width: int
    channels: int
    dtype: str
    georef: dict | None = field(default=None, compare=False, hash=False)  # GeoTIFF/OME (format/_georef.py)

    @property
    def shape(self) -> tuple[int, int, int]:
        """Return (height, width, channels)."""
        return (self.height, self.width, self.channels)


def is_image_file(path: str | os.PathLike) -> bool:
    """Return whether the file's suffix is one preprocess_tiles reads."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


PILLOW_MODES = ("keep", "RGB", "RGBA", "L")


def probe_image(path: str | os.PathLike, npy_layout: str = "auto", mode: str = "keep") -> ImageInfo:
    """Read the header of an image, check the file is whole, and return its shape and dtype.

    The check is cheap (no pixel decoding): PNG chunk CRCs, the JPEG end
    marker, TIFF strip offsets within the file, the NPY/HDF5 data size; so
    truncated files are all found in one pass before anything is written.
    Raises ImageReadError.
    """
    try:
        kind = IMAGE_SUFFIXES[Path(path).suffix.lower()]
        if kind == "pillow":
            _check_png_depth(path)
            with Image.open(path) as img:
                arr_mode = _pillow_target_mode(img, mode, path)
                size = img.size
                img.verify()
            _check_jpeg_end(path)
            return _pillow_info(size, arr_mode)
        if kind == "tiff":
            with tifffile.TiffFile(path) as tif:
                series = tif.series[0]
                shape = _tiff_hwc_shape(series.shape, series.axes)
                _check_tiff_extent(path, tif)
                return ImageInfo(*shape, dtype=np.dtype(series.dtype).name, georef=_georef_or_none(tif))
        if kind == "hdf5":
            from ._hdf5 import probe_raster

            (h, w, c), dtype = probe_raster(path, npy_layout)
            return ImageInfo(h, w, c, dtype)
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        return ImageInfo(*npy_hwc_shape(arr.shape, npy_layout), dtype=arr.dtype.name)
    except ImageReadError:
        raise
    except LayoutError as err:
        raise ImageReadError(path, str(err)) from None
    except Exception as err:  # every reader has its own exception types
        raise ImageReadError(path, f"unreadable image ({type(err).__name__}: {err})") from None


def _georef_or_none(tif: tifffile.TiffFile) -> dict | None:
    """Return a TIFF's georeferencing, or None when its tags cannot be read (the pixels still can)."""
    try:
        return read_georef(tif)
    except Exception:  # a malformed GeoKeyDirectory or OME-XML loses the georeferencing, not the scene
        return None


def read_image(path: str | os.PathLike, npy_layout: str = "auto", mode: str = "keep") -> np.ndarray:
    """Read a whole image as a C-contiguous (height, width, channels) array; raise ImageReadError."""
    try:
        kind = IMAGE_SUFFIXES[Path(path).suffix.lower()]
        if kind == "pillow":
            _check_png_depth(path)
            with Image.open(path) as img:
                img.load()
                target = _pillow_target_mode(img, mode, path)
                if mode == "labels" and img.mode == "1":  # a 1-bit mask: classes 0 and 1 (convert("L") gives 255)
                    arr = np.asarray(img).astype(np.uint8)
                else:
                    arr = np.asarray(img.convert(target) if target != img.mode else img)
        elif kind == "tiff":
            with tifffile.TiffFile(path) as tif:
                series = tif.series[0]
                arr = _tiff_to_hwc(series.asarray(), series.axes)
        elif kind == "hdf5":
            from ._hdf5 import read_raster

            arr = read_raster(path, npy_layout)
        else:
            arr = np.load(path, allow_pickle=False)
            if arr.ndim == 3 and npy_layout_of(arr.shape, npy_layout) == "chw":
                arr = arr.transpose(1, 2, 0)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.ndim != 3:
            raise ImageReadError(path, f"expected a 2-D or 3-D image, got shape {arr.shape}")
        return np.ascontiguousarray(arr)
    except ImageReadError:
        raise
    except LayoutError as err:
        raise ImageReadError(path, str(err)) from None
    except Exception as err:
        raise ImageReadError(path, f"unreadable image ({type(err).__name__}: {err})") from None


def _check_jpeg_end(path: str | os.PathLike) -> None:
    if Path(path).suffix.lower() not in (".jpg", ".jpeg"):
        return
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        tail = f.read()
    if b"\xff\xd9" not in tail:
        raise ImageReadError(path, "truncated JPEG (no end-of-image marker)")


def _check_tiff_extent(path: str | os.PathLike, tif: tifffile.TiffFile) -> None:
    size = os.path.getsize(path)
    for page in tif.pages:
        offsets = getattr(page, "dataoffsets", ()) or ()
        counts = getattr(page, "databytecounts", ()) or ()
        for offset, count in zip(offsets, counts):
            if offset + count > size:
                raise ImageReadError(path, f"truncated TIFF: data at {offset}+{count} bytes runs past the "
                                           f"end of the {size}-byte file")


def _pillow_target_mode(img: Image.Image, mode: str = "keep", path: str | os.PathLike = "") -> str:
    if mode == "labels":  # a target: palette indices are the labels, never expanded to colours
        if img.mode in ("P", "L", "1", "I", "F") or img.mode.startswith("I;16"):
            return "L" if img.mode == "1" else img.mode
        raise ImageReadError(path, f"a {img.mode} image is not a label raster (expected one band: L, P, I, "
                                   "I;16 or F; save colour-coded masks as class indices)")
    if mode != "keep":
        if img.mode.startswith(("I", "F")):
            raise ImageReadError(path, f"--mode {mode} would reduce this {img.mode} image to 8 bits; "
                                       "use --mode keep for high-bit-depth images")
        return mode
    if img.mode == "P":
        return "RGBA" if "transparency" in img.info else "RGB"
    if img.mode.startswith("I;16"):
        return img.mode
    return _PILLOW_CONVERT.get(img.mode) or img.mode


def _pillow_info(size: tuple[int, int], mode: str) -> ImageInfo:
    width, height = size
    if mode.startswith("I;16"):
        return ImageInfo(height, width, 1, "uint16")
    channels, dtype = {"L": (1, "uint8"), "LA": (2, "uint8"), "RGB": (3, "uint8"), "RGBA": (4, "uint8"),
                       "CMYK": (4, "uint8"), "I": (1, "int32"), "F": (1, "float32"),
                       "P": (1, "uint8")}.get(mode, (0, ""))
    if not channels:
        raise ArgumentError(f"unsupported Pillow image mode {mode!r}")
    return ImageInfo(height, width, channels, dtype)


def _check_png_depth(path: str | os.PathLike) -> None:
    """Refuse 16-bit colour PNGs, which Pillow would silently reduce to 8 bits per channel."""
    with open(path, "rb") as f:
        head = f.read(26)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) == 26 and head[24] == 16 and head[25] in (2, 4, 6):
        raise ImageReadError(path, "16-bit colour PNG would lose precision in Pillow; save it as TIFF or NPY")


def _tiff_channel_axis(shape: tuple[int, ...], axes: str) -> int:
    """Return the index of the band axis (-1 for none); refuse stacks that are not one multi-band image."""
    if "Y" not in axes or "X" not in axes:
        raise ArgumentError(f"TIFF axes {axes!r} lack Y and X")
    others = [i for i, a in enumerate(axes) if a not in "YX" and shape[i] != 1]
    if len(others) > 1 or (others and axes[others[0]] not in _CHANNEL_AXES):
        raise ArgumentError(f"TIFF with axes {axes!r} and shape {shape} is not a single multi-band image")
    return others[0] if others else -1


def _tiff_hwc_shape(shape: tuple[int, ...], axes: str) -> tuple[int, int, int]:
    channel_axis = _tiff_channel_axis(shape, axes)
    channels = shape[channel_axis] if channel_axis >= 0 else 1
    return (shape[axes.index("Y")], shape[axes.index("X")], channels)


def _tiff_to_hwc(arr: np.ndarray, axes: str) -> np.ndarray:
    channel_axis = _tiff_channel_axis(arr.shape, axes)
    order = [axes.index("Y"), axes.index("X")] + ([channel_axis] if channel_axis >= 0 else [])
    singles = [i for i in range(arr.ndim) if i not in order]
    arr = arr.transpose(order + singles)
    return arr.reshape(arr.shape[: len(order)])


def undecodable_error(failures: list[str], skippable: bool = True) -> PreprocessError:
    """Return the error of a run that met images it could not decode (``failures``: their messages, in order).

    ``skippable``: whether ``--skip-bad`` could have skipped them (not in a shuffled order, where
    a file's samples are spread over the shards).
    """
    more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
    remedy = ("pass --skip-bad" if skippable else "pass --order source --skip-bad (the shuffled order spreads a "
              "file's samples over the shards, so it cannot skip a file that fails only in decoding)")
    return PreprocessError(f"{len(failures)} image(s) failed to decode (nothing after the first was written; the "
                           f"shards before it are kept for --resume); fix or remove them, or {remedy}:\n  "
                           + "\n  ".join(failures[:20]) + more)
