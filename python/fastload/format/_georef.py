"""Where a scene lies: GeoTIFF tags and OME pixel sizes read with tifffile, checked, and written back.

A scene's ``georef`` (docs: issue 43's contract) is a small JSON object, every key optional:

- ``transform``: the affine ``[a, b, c, d, e, f]`` in rasterio's order, ``x = a*col + b*row + c`` and
  ``y = d*col + e*row + f`` for the upper-left corner of pixel ``(col, row)``; from ModelTransformation,
  else from ModelPixelScale and the first ModelTiepoint (north up: ``a = sx, e = -sy``), shifted by half a
  pixel when the GeoKeys say RasterPixelIsPoint (as GDAL does);
- ``crs``: ``{"epsg": n}`` from ProjectedCSTypeGeoKey (3072) or GeographicTypeGeoKey (2048) when not
  user-defined (32767), else ``{"citation": "..."}`` from the citation keys' GeoAsciiParams text;
- ``tiff_tags``: ``[[code, dtype, count, value], ...]``, the GeoTIFF tags of ``GEO_TAGS`` copied verbatim
  so that an output TIFF (``fastload.Mosaic``) carries the same georeferencing (``georef_extratags``);
  ``dtype`` is tifffile's extratags code, one per tag (``GEO_TAGS``); ``count`` the TIFF count (a
  string's includes its terminating NUL);
- ``pixel_size``: ``{"x", "y", "unit"}``, an OME-TIFF's PhysicalSizeX/Y (microscopy; unit default "µm").

No GDAL: tifffile reads the tags. A tag that does not parse is an ``ImageReadError`` naming the file, never
a silently shifted map. ``check_georef`` validates an untrusted one (a manifest's) before it is used.
"""

from __future__ import annotations

import math
import os
import warnings
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from typing import Any

from ..errors import FastloadWarning, ImageReadError

# code -> (name, tifffile extratags dtype): the tags copied verbatim; each has one dtype here.
# GDAL's metadata (band scales, offsets, statistics) and nodata value describe the source's pixels, not
# a prediction's: never copied (a nodata of 0 would hide class 0), nor read (their text may be UTF-8).
NOT_COPIED = (42112, 42113)
GEO_TAGS: dict[int, tuple[str, str]] = {
    33550: ("ModelPixelScale", "d"),
    33922: ("ModelTiepoint", "d"),
    34264: ("ModelTransformation", "d"),
    34735: ("GeoKeyDirectory", "H"),
    34736: ("GeoDoubleParams", "d"),
    34737: ("GeoAsciiParams", "s"),
    42112: ("GDAL_METADATA", "s"),
    42113: ("GDAL_NODATA", "s"),
}
MAX_TAG_VALUES = 4096  # numbers in one numeric tag (a GeoKeyDirectory of 1,023 keys)
MAX_TEXT_CHARS = 1 << 16  # one string tag, a WKT
MAX_CITATION_CHARS = 4096
MAX_UNIT_CHARS = 16
MAX_EPSG = 2**31 - 1
USER_DEFINED = 32767
_CRS_KEYS = ((3072, 3073), (2048, 2049))  # (the CRS code key, its citation key): projected, then geographic
_GT_CITATION = 1026
_RASTER_TYPE, _PIXEL_IS_POINT = 1025, 2
_GEOREF_KEYS = {"transform", "crs", "tiff_tags", "pixel_size"}


class GeorefProblem(ValueError):
    """One value of a georef is refused; ``str()`` says where (``georef.transform[2]: ...``)."""


def read_georef(tif: Any) -> dict[str, Any] | None:
    """Return the georef of an open ``tifffile.TiffFile`` (its first page), or None when it has none.

    Raises ImageReadError naming the file when a GeoTIFF tag or the OME pixel size does not parse.
    """
    name = str(getattr(tif, "filename", "") or "TIFF")
    try:
        georef = _read(tif)
        if georef:
            check_georef(georef)
    except GeorefProblem as err:
        raise ImageReadError(name, f"georeferencing: {err}") from None
    return georef or None


def read_scene_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return ``{"height", "width", "georef"}`` of the TIFF at ``path`` (its first page's size).

    ImageReadError naming the file when it is not a readable TIFF or its georeferencing does not parse.
    """
    import tifffile  # a dependency of fastload; imported here so the format layer starts without it

    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            height, width = int(page.imagelength), int(page.imagewidth)
            georef = read_georef(tif)
    except ImageReadError:
        raise
    except (OSError, ValueError, tifffile.TiffFileError) as err:
        raise ImageReadError(path, f"not a readable TIFF: {err}") from None
    return {"height": height, "width": width, "georef": georef}


def _read(tif: Any) -> dict[str, Any]:
    georef: dict[str, Any] = {}
    tags = tif.pages.first.tags
    raw: dict[int, Any] = {}
    rows = []
    for code, (tag_name, dtype) in GEO_TAGS.items():
        tag = tags.get(code)
        if tag is None or code in NOT_COPIED:
            continue
        value = _tag_value(tag.value, dtype, tag_name)
        raw[code] = value
        count = len(value.encode("ascii")) + 1 if isinstance(value, str) else len(value)
        rows.append([code, dtype, count, value])
    if rows:
        georef["tiff_tags"] = rows
    keys = _geo_keys(raw.get(34735))
    transform = _transform(raw, keys)
    if transform is not None:
        georef["transform"] = transform
    crs = _crs(keys, raw.get(34737))
    if crs is not None:
        georef["crs"] = crs
    if getattr(tif, "is_ome", False):
        size = _ome_pixel_size(tif.ome_metadata)
        if size is not None:
            georef["pixel_size"] = size
    return georef


def _tag_value(value: Any, dtype: str, name: str) -> list[float] | list[int] | str:
    """Return a tag's value in its canonical form: a str for ASCII tags, a list of numbers else."""
    if dtype == "s":
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                raise GeorefProblem(f"{name}: not ASCII text") from None
        if not isinstance(value, str):
            raise GeorefProblem(f"{name}: expected text, not {type(value).__name__}")
        return value.rstrip("\0")
    values = [value] if isinstance(value, (int, float)) else list(value)
    try:
        if dtype == "H":
            out_int = [int(v) for v in values]
            if any(v != w for v, w in zip(out_int, values)):
                raise GeorefProblem(f"{name}: not whole numbers")
            return out_int
        return [float(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        raise GeorefProblem(f"{name}: not a list of numbers") from None


def _geo_keys(directory: list[int] | None) -> dict[int, tuple[int, int, int]]:
    """Return the GeoKeyDirectory as key id -> (tag location, count, value or offset)."""
    if directory is None:
        return {}
    if len(directory) < 4 or len(directory) != 4 + 4 * directory[3]:
        raise GeorefProblem(f"GeoKeyDirectory: {len(directory)} values do not hold a header and "
                            f"{directory[3] if len(directory) >= 4 else '?'} keys")
    return {directory[i]: (directory[i + 1], directory[i + 2], directory[i + 3])
            for i in range(4, len(directory), 4)}


def _transform(raw: Mapping[int, Any], keys: Mapping[int, tuple[int, int, int]]) -> list[float] | None:
    if 34264 in raw:
        m = raw[34264]
        if len(m) != 16:
            raise GeorefProblem(f"ModelTransformation: {len(m)} values, not 16")
        t = [m[0], m[1], m[3], m[4], m[5], m[7]]
    elif 33550 in raw and 33922 in raw:
        scale, tie = raw[33550], raw[33922]
        if len(scale) < 2 or len(tie) < 6 or len(tie) % 6:
            raise GeorefProblem(f"ModelPixelScale ({len(scale)} values) or ModelTiepoint ({len(tie)}) malformed")
        sx, sy = scale[0], scale[1]
        i, j, x, y = tie[0], tie[1], tie[3], tie[4]
        t = [sx, 0.0, x - i * sx, 0.0, -sy, y + j * sy]
    else:
        return None
    if keys.get(_RASTER_TYPE, (0, 0, 0))[2] == _PIXEL_IS_POINT:  # the tiepoint names a pixel's centre
        t[2] -= 0.5 * (t[0] + t[1])
        t[5] -= 0.5 * (t[3] + t[4])
    return t


def _crs(keys: Mapping[int, tuple[int, int, int]], ascii_params: str | None) -> dict[str, Any] | None:
    """Return the CRS of the GeoKeys: the projected one if any, else the geographic one, else a citation."""
    for code_key, citation_key in _CRS_KEYS:
        entry = keys.get(code_key)
        if entry is None:
            continue
        if entry[0] == 0 and entry[2] != USER_DEFINED:
            return {"epsg": int(entry[2])}
        citation = _citation(keys.get(citation_key), ascii_params) or _citation(keys.get(_GT_CITATION),
                                                                                   ascii_params)
        return {"citation": citation} if citation else None  # user-defined: never its base CRS's code
    citation = _citation(keys.get(_GT_CITATION), ascii_params)
    return {"citation": citation} if citation else None


def _citation(entry: tuple[int, int, int] | None, ascii_params: str | None) -> str | None:
    if entry is None or entry[0] != 34737 or ascii_params is None:
        return None
    location, count, offset = entry
    if offset + count > len(ascii_params) + 1:
        raise GeorefProblem(f"GeoAsciiParams: a key's text [{offset}, {offset + count}) is past its end")
    text = ascii_params[offset:offset + count].rstrip("|\0").strip()
    return text[:MAX_CITATION_CHARS] or None


def _ome_pixel_size(xml: str | None) -> dict[str, Any] | None:
    if not xml:
        return None
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as err:
        raise GeorefProblem(f"OME-XML does not parse: {err}") from None
    pixels = next((e for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "Pixels"), None)
    if pixels is None or "PhysicalSizeX" not in pixels.attrib or "PhysicalSizeY" not in pixels.attrib:
        return None
    unit_x = pixels.attrib.get("PhysicalSizeXUnit", "µm")
    unit_y = pixels.attrib.get("PhysicalSizeYUnit", "µm")
    if unit_x != unit_y:
        raise GeorefProblem(f"OME PhysicalSizeXUnit {unit_x!r} differs from PhysicalSizeYUnit {unit_y!r}")
    try:
        x, y = float(pixels.attrib["PhysicalSizeX"]), float(pixels.attrib["PhysicalSizeY"])
    except ValueError:
        raise GeorefProblem("OME PhysicalSizeX/PhysicalSizeY are not numbers") from None
    return {"x": x, "y": y, "unit": unit_x}


def georef_extratags(georef: Mapping[str, Any] | None) -> list[tuple[int, str, int, Any, bool]]:
    """Return the georef's ``tiff_tags`` as ``tifffile.imwrite(extratags=...)`` entries (empty without any)."""
    if not georef:
        return []
    tags: list[tuple[int, str, int, Any, bool]] = []
    for code, dtype, count, value in georef.get("tiff_tags", []):
        if code in NOT_COPIED:
            continue
        if dtype == "s":
            tags.append((int(code), "s", 0, str(value), True))  # tifffile counts a string itself
        else:
            tags.append((int(code), dtype, int(count), tuple(value), True))
    placed = {t[0] for t in tags} & {33550, 33922, 34264}
    transform = georef.get("transform")
    if transform is not None and not placed:  # a georef given as an affine only (write_arrays(scenes=...))
        a, b, c, d, e, f = (float(v) for v in transform)
        tags.append((34264, "d", 16, (a, b, 0.0, c, d, e, 0.0, f, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0), True))
    if georef.get("crs") and not any(t[0] == 34735 for t in tags):
        warnings.warn(f"the CRS {georef['crs']} is not written (no GeoKeyDirectory was recorded with it; read "
                      "the scenes' georeferencing from GeoTIFFs to copy theirs)", FastloadWarning, stacklevel=3)
    return tags


# ---- validation of an untrusted georef (a manifest's) ----

def check_georef(doc: Any, where: str = "georef") -> dict[str, Any]:
    """Validate a georef (a manifest's: untrusted) and return it; raise GeorefProblem naming the key.

    Finite numbers, a transform that can be inverted, only the tags of ``GEO_TAGS`` each with its dtype,
    each code once, counts that match the values, strings of ASCII without NUL and bounded in length.
    """
    if not isinstance(doc, dict):
        raise GeorefProblem(f"{where}: expected an object, not {type(doc).__name__}")
    unknown = sorted(set(doc) - _GEOREF_KEYS)
    if unknown:
        raise GeorefProblem(f"{where}: unknown key {unknown[0][:40]!r}")
    if "transform" in doc:
        t = doc["transform"]
        if not isinstance(t, list) or len(t) != 6:
            raise GeorefProblem(f"{where}.transform: expected 6 numbers")
        for i, v in enumerate(t):
            _number(v, f"{where}.transform[{i}]")
        if t[0] * t[4] - t[1] * t[3] == 0:
            raise GeorefProblem(f"{where}.transform: {t} cannot be inverted (a pixel of zero area)")
    if "crs" in doc:
        _check_crs(doc["crs"], f"{where}.crs")
    if "tiff_tags" in doc:
        _check_tags(doc["tiff_tags"], f"{where}.tiff_tags")
    if "pixel_size" in doc:
        _check_pixel_size(doc["pixel_size"], f"{where}.pixel_size")
    return doc


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GeorefProblem(f"{where}: {str(value)[:40]!r} is not a number")
    if not math.isfinite(value) or abs(value) > 1.8e308:
        raise GeorefProblem(f"{where}: {value} is not finite")
    return float(value)


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise GeorefProblem(f"{where}: expected a string, not {type(value).__name__}")
    if len(value) > limit:
        raise GeorefProblem(f"{where}: {len(value)} characters; at most {limit}")
    if "\0" in value:
        raise GeorefProblem(f"{where}: contains a NUL character")
    return value


def _check_crs(crs: Any, where: str) -> None:
    if not isinstance(crs, dict) or len(crs) != 1 or next(iter(crs)) not in ("epsg", "wkt", "citation"):
        raise GeorefProblem(f"{where}: expected one of {{'epsg': n}}, {{'wkt': text}}, {{'citation': text}}")
    if "epsg" in crs:
        code = crs["epsg"]
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= MAX_EPSG:
            raise GeorefProblem(f"{where}.epsg: {str(code)[:40]!r} is not an EPSG code (an integer in [1, 2**31))")
    elif "wkt" in crs:
        _text(crs["wkt"], f"{where}.wkt", MAX_TEXT_CHARS)
    else:
        _text(crs["citation"], f"{where}.citation", MAX_CITATION_CHARS)


def _check_tags(tags: Any, where: str) -> None:
    if not isinstance(tags, list) or len(tags) > len(GEO_TAGS):
        raise GeorefProblem(f"{where}: expected a list of at most {len(GEO_TAGS)} tags")
    seen: set[int] = set()
    for i, row in enumerate(tags):
        at = f"{where}[{i}]"
        if not isinstance(row, list) or len(row) != 4:
            raise GeorefProblem(f"{at}: expected [code, dtype, count, value]")
        code, dtype, count, value = row
        if isinstance(code, bool) or not isinstance(code, int) or code not in GEO_TAGS:
            raise GeorefProblem(f"{at}: tag code {str(code)[:40]!r} is not one of the GeoTIFF tags {sorted(GEO_TAGS)}")
        if code in seen:
            raise GeorefProblem(f"{at}: tag {code} appears twice")
        seen.add(code)
        name, wanted = GEO_TAGS[code]
        if dtype != wanted:
            raise GeorefProblem(f"{at}: {name} ({code}) has dtype {wanted!r}, not {str(dtype)[:8]!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise GeorefProblem(f"{at}: count {str(count)[:40]!r} is not a positive integer")
        if dtype == "s":
            text = _text(value, f"{at}.value", MAX_TEXT_CHARS)
            if not text.isascii():
                raise GeorefProblem(f"{at}: {name} is not ASCII text")
            if count != len(text) + 1:
                raise GeorefProblem(f"{at}: count {count} for {len(text)} characters (the count includes the NUL)")
            continue
        if not isinstance(value, list) or len(value) > MAX_TAG_VALUES:
            raise GeorefProblem(f"{at}: expected a list of at most {MAX_TAG_VALUES} numbers")
        if count != len(value):
            raise GeorefProblem(f"{at}: count {count} for {len(value)} values")
        for j, v in enumerate(value):
            if dtype == "H":
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
                    raise GeorefProblem(f"{at}.value[{j}]: {str(v)[:40]!r} is not an unsigned 16-bit integer")
            else:
                _number(v, f"{at}.value[{j}]")
        if code == 34735:
            _geo_keys(value)


def _check_pixel_size(size: Any, where: str) -> None:
    if not isinstance(size, dict) or set(size) != {"x", "y", "unit"}:
        raise GeorefProblem(f"{where}: expected an object with keys x, y and unit")
    for axis in ("x", "y"):
        if _number(size[axis], f"{where}.{axis}") <= 0:
            raise GeorefProblem(f"{where}.{axis}: {size[axis]} is not positive")
    unit = _text(size["unit"], f"{where}.unit", MAX_UNIT_CHARS)
    if not unit or not unit.isprintable():
        raise GeorefProblem(f"{where}.unit: {unit!r} is not 1 to {MAX_UNIT_CHARS} printable characters")
