"""Planning the partner rasters of a run: probe every pair, check it, and give each partner its field.

Every pair is checked before anything is written: a partner that is unreadable, of another
height and width than its image, or of other bands or dtype than the same partner of the
first scene is listed with all the others in one error (or skipped with ``--skip-bad``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._progress import Progress
from ..errors import ImageReadError, PreprocessError
from ..format._codecs import CODECS, IMAGE_CODECS, default_options
from ..format._dtypes import dtype_name
from ..format._record import Field
from ..format._scenes import CLASS_PIXELS_SUFFIX, SCENE_FIELD, WINDOW_FIELD
from ._cli_options import UsageError
from ._images import ImageInfo
from ._partners import Partner
from ._preprocess_plan import listed, probe_map
from ._scene_tiles import MAX_CLASSES, DenseSpec
from ._sources import Source

TARGET_CODEC = "zstd"  # a target's default: lossless, and masks compress well
LOSSY = ("jpeg",)


def probe_partners(partners: Sequence[Partner], sources: list[Source], image_infos: dict[str, ImageInfo],
                   npy_layout: str, workers: int, skip_bad: bool, client: Any = None,
                   progress: bool = False) -> tuple[list[Source], dict[str, list[ImageInfo]], list[dict]]:
    """Probe every partner file of ``sources``; return (sources whose pairs are good, their partners' infos, bad).

    A pair is bad when a partner is unreadable or its height and width differ from its image's.
    Raises PreprocessError listing every bad pair unless ``skip_bad``. With ``progress``, the
    files probed are counted as a step ``probe partners`` (``_progress``).
    """
    args = [(p.data_dir, p.remote, rel, npy_layout, "labels" if p.role == "target" else "keep")
            for s in sources for p, rel in zip(partners, s.partners)]
    remote = any(p.remote is not None for p in partners)
    outcomes = iter(probe_map(iter(args), workers, client, remote))
    good: list[Source] = []
    infos: dict[str, list[ImageInfo]] = {}
    bad: list[dict] = []
    with Progress("probe partners", len(sources), unit="scenes", enabled=progress, leave=False) as bar:
        for src in sources:
            image = image_infos[src.relpath]
            found: list[ImageInfo] = []
            errors: list[str] = []
            for partner, rel in zip(partners, src.partners):
                info, err = next(outcomes)
                if err is not None or info is None:
                    if not isinstance(err, ImageReadError):
                        raise err if err is not None else AssertionError("a probe gave neither info nor error")
                    errors.append(f"{partner.name} {partner.where(rel)}: {err.reason}")
                    continue
                if (info.height, info.width) != (image.height, image.width):
                    errors.append(f"{partner.name} {partner.where(rel)} is {info.height}x{info.width}, its image "
                                  f"{src.relpath} {image.height}x{image.width}")
                elif partner.role == "target" and rel.lower().endswith((".jpg", ".jpeg")):
                    errors.append(f"{partner.name} {partner.where(rel)} is a JPEG: its lossy compression has changed "
                                  "label values (save masks as PNG or TIFF)")
                elif not same_place(image.georef, info.georef):
                    errors.append(f"{partner.name} {partner.where(rel)} is georeferenced elsewhere than its image "
                                  f"{src.relpath}: {_place(info.georef)} against {_place(image.georef)}")
                found.append(info)
            if errors:
                bad.append({"path": src.relpath, "error": "; ".join(errors)})
            else:
                good.append(src)
                infos[src.relpath] = found
            bar.update(1)
    if bad and not skip_bad:
        lines = listed([f"{b['path']}: {b['error']}" for b in bad])
        raise PreprocessError(f"{len(bad)} scene(s) whose partner rasters do not fit their image; fix them, or pass "
                              f"--skip-bad to skip those scenes:{lines}")
    for b in bad:
        print(f"skipping {b['path']}: {b['error']}", file=sys.stderr)
    return good, infos, bad


def same_place(a: dict | None, b: dict | None) -> bool:
    """Return whether two rasters' georeferencing agree (a raster without any agrees with everything).

    Both with an affine transform: the same within 1e-9 of the pixel size; both with a CRS: the same.
    A mask of the right size on another grid or in another CRS is misaligned, whatever its size says.
    """
    if not a or not b:
        return True
    ta, tb = a.get("transform"), b.get("transform")
    if ta is not None and tb is not None:
        scale = max(abs(v) for v in (ta[0], ta[1], ta[3], ta[4])) or 1.0
        if any(abs(x - y) > 1e-9 * scale for x, y in zip(ta, tb)):
            return False
    ca, cb = a.get("crs"), b.get("crs")
    return ca is None or cb is None or ca == cb


def _place(georef: dict | None) -> str:
    if not georef:
        return "none"
    return f"transform {georef.get('transform')}, CRS {georef.get('crs')}"


def check_partners_consistent(partners: Sequence[Partner], sources: list[Source],
                              infos: dict[str, list[ImageInfo]]) -> list[ImageInfo]:
    """Return each partner's info of the first scene; raise PreprocessError listing scenes whose partner differs."""
    first = infos[sources[0].relpath]
    for k, partner in enumerate(partners):
        ref = first[k]
        odd = [f"{partner.where(s.partners[k])} ({infos[s.relpath][k].channels} band(s), {infos[s.relpath][k].dtype})"
               for s in sources if (infos[s.relpath][k].channels, infos[s.relpath][k].dtype) != (ref.channels,
                                                                                                   ref.dtype)]
        if odd:
            raise PreprocessError(f"--{partner.role}s {partner.name}: rasters differ in bands or dtype: "
                                  f"{partner.where(sources[0].partners[k])} has {ref.channels} band(s), {ref.dtype}; "
                                  f"these differ:{listed(odd)}")
    return first


def parse_field_codecs(texts: Sequence[str], partners: Sequence[Partner]) -> dict[str, str]:
    """Parse ``--field-codec NAME=CODEC``; a NAME must be a partner field, jpeg is refused for a target."""
    names = {p.name: p for p in partners}
    codecs: dict[str, str] = {}
    for text in texts:
        name, _, codec = text.partition("=")
        if name not in names:
            raise UsageError(f"--field-codec {text!r}: {name!r} is not an --inputs or --targets field "
                             f"({', '.join(names) or 'none given'}); the image's codec is --codec")
        if codec not in CODECS:
            raise UsageError(f"--field-codec {text!r}: unknown codec {codec!r} (one of {', '.join(CODECS)})")
        if codec in LOSSY and names[name].role == "target":
            raise UsageError(f"--field-codec {text!r}: jpeg is lossy and would change labels and targets; pick a "
                             "lossless codec (zstd, lz4, png, raw)")
        codecs[name] = codec
    return codecs


def parse_num_classes(texts: Sequence[str], partners: Sequence[Partner], infos: Sequence[ImageInfo]) -> dict[str, int]:
    """Parse ``--num-classes K`` (every one-band integer target) or ``NAME=K``; return target name -> K."""
    targets = {p.name: info for p, info in zip(partners, infos) if p.role == "target"}
    counted: dict[str, int] = {}
    for text in texts:
        name, sep, number = text.rpartition("=")
        try:
            k = int(number)
        except ValueError:
            raise UsageError(f"--num-classes {text!r}: expected K or NAME=K") from None
        if not 1 <= k <= MAX_CLASSES:
            raise UsageError(f"--num-classes {text!r}: K must be 1 to {MAX_CLASSES}")
        names = [name] if sep else [n for n, i in targets.items() if i.channels == 1 and _is_integer(i.dtype)]
        if sep and name not in targets:
            raise UsageError(f"--num-classes {text!r}: {name!r} is not a --targets field ({', '.join(targets)})")
        if not names:
            raise UsageError(f"--num-classes {text}: no --targets field is a one-band integer mask")
        for n in names:
            info = targets[n]
            if info.channels != 1 or not _is_integer(info.dtype):
                raise UsageError(f"--num-classes {text!r}: target {n!r} is {info.channels} band(s) of {info.dtype}; "
                                 "class counts need a one-band integer mask")
            counted[n] = k
    return counted


def _is_integer(dtype: str) -> bool:
    return np.dtype(dtype).kind in "iub"


def check_ignore_index(value: float | None, partners: Sequence[Partner], infos: Sequence[ImageInfo]) -> None:
    """Raise UsageError when ``--ignore-index`` cannot be held exactly by a target's dtype."""
    if value is None:
        return
    for partner, info in zip(partners, infos):
        if partner.role != "target":
            continue
        dtype = np.dtype(info.dtype)
        if dtype.kind in "iub":
            limits = np.iinfo(dtype) if dtype.kind != "b" else None
            if not float(value).is_integer() or (limits is not None and not limits.min <= value <= limits.max):
                raise UsageError(f"--ignore-index {value:g} is not a value of target {partner.name!r} ({dtype})")
        elif not math.isfinite(value) or float(dtype.type(value)) != value:
            raise UsageError(f"--ignore-index {value:g} is not exactly a {dtype} value of target {partner.name!r}")


def dense_fields(partners: Sequence[Partner], infos: Sequence[ImageInfo], layout: str, codec: str,
                 codecs: dict[str, str], spec: DenseSpec, tile: tuple[int, int]) -> tuple[Field, ...]:
    """Return the fields of the partners (after ``image``), then ``scene``, ``window`` and the class counts.

    An input takes ``--codec`` (zstd when it is ``auto``, which picks the image's); a target zstd;
    ``--field-codec`` names another.
    """
    fields: list[Field] = []
    for partner, info in zip(partners, infos):
        default = TARGET_CODEC if partner.role == "target" else ("zstd" if codec == "auto" else codec)
        chosen = codecs.get(partner.name, default)
        if chosen in LOSSY and partner.role == "target":
            raise UsageError(f"--codec {chosen} is lossy; targets are never written with it (--field-codec names "
                             "another codec per field)")
        one_band = partner.role == "target" and info.channels == 1
        shape = ((tile[0], tile[1]) if one_band else
                 (info.channels, *tile) if layout == "chw" else (*tile, info.channels))
        options = default_options(chosen, None, (layout if not one_band else None) if chosen in IMAGE_CODECS else None,
                                  None, None)
        try:
            fields.append(Field(partner.name, dtype_name(np.dtype(info.dtype)), shape, chosen, options))
        except ValueError as err:
            raise UsageError(f"{partner.role} {partner.name!r} ({info.channels} band(s), {info.dtype}): codec "
                             f"{chosen}: {err}; pass --field-codec {partner.name}=zstd") from None
    if spec.windows:
        fields += [Field(SCENE_FIELD, "int64", ()), Field(WINDOW_FIELD, "int64", (4,))]
    fields += [Field(name + CLASS_PIXELS_SUFFIX, "int32", (k,)) for name, k in spec.classes]
    return tuple(fields)
