"""Per-tile sample weights from the class pixel counts of a mask (``<target>_class_pixels``): rare class sampling.

``from_mask_classes`` reads the counts that ``preprocess_tiles --targets NAME=DIR
--num-classes K`` records per tile (int32, shape ``(K,)``) and turns them into
weights for ``ShardLoader(..., sample_weights=w)``. The arithmetic is two pure
functions of the ``(N, K)`` count matrix, :func:`rare_weights` and
:func:`inverse_weights`; the formulas are in :func:`from_mask_classes` and
docs/sampling.md ("Tiles with rare classes").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, DatasetError
from ..format._scenes import CLASS_PIXELS_SUFFIX
from ..sampling._alias import real_weights
from ._compose import ConcatShardDataset, MixedShardDataset
from ._dataset import ShardDataset
from ._subset import ShardSubset
from ._weights import read_field

METHODS = ("rare", "inverse")
DEFAULT_TEMPERATURE = 0.01
CONVERT_HINT = "convert with class counts: preprocess_tiles --targets NAME=DIR --num-classes K"
if TYPE_CHECKING:  # an alias for annotations only: `|` between classes needs Python 3.10 at run time
    Datasets = ShardDataset | ConcatShardDataset | ShardSubset


def from_mask_classes(dataset: Datasets | str | os.PathLike, field: str | None = None, *, method: str = "rare",
                      temperature: float = DEFAULT_TEMPERATURE, min_pixels: int = 1,
                      class_weights: Sequence[float] | np.ndarray | None = None,
                      ignore_classes: int | Sequence[int] = (), split: str | None = None) -> np.ndarray:
    """Return one float64 weight per sample that oversamples tiles holding rare classes of a mask.

    ``dataset`` is a ``ShardDataset``, a ``concat`` of them, a ``subset`` of either, or a
    dataset's path (opened as ``ShardDataset(path, split=split)``). ``field`` is the
    ``<target>_class_pixels`` field (integer, shape ``(K,)``: pixels of class ``0..K-1`` in
    the tile, padding and the ignore index excluded); ``None`` takes the only such field.
    ``ignore_classes`` leaves classes out of the counts (e.g. a background class). Use the
    result as ``ShardLoader(dataset, sample_weights=w, num_samples=n)``; a tile of weight
    0 is never drawn.

    With ``n_ic`` the pixels of class ``c`` in tile ``i`` and ``f_c = sum_i n_ic /
    sum_i sum_c' n_ic'`` the class's share of all labelled pixels:

    - ``method="rare"`` (rare class sampling, as DAFormer, Hoyer et al. 2022):
      ``P(c) = exp((1 - f_c) / T) / sum_c' exp((1 - f_c') / T)`` over the classes present
      (held by at least one tile, ``N_c > 0``; ``P(c) = 0`` for the others), and
      ``w_i = sum_c P(c) * [n_ic >= min_pixels] / N_c`` where ``N_c`` is the number of
      tiles with ``n_ic >= min_pixels``. Drawing ``i`` with probability ``w_i`` is
      exactly: draw a class ``c ~ P``, then a tile uniformly among the ``N_c`` that hold
      it. The weights sum to 1. ``T = temperature``: the smaller, the more the rarest
      classes dominate (DAFormer uses 0.01); a large ``T`` draws every present class
      about equally often.
    - ``method="inverse"`` (pixel-weighted inverse frequency):
      ``w_i = N * u_i / sum_j u_j`` with ``u_i = sum_c n_ic * v_c / sum_c n_ic``, the mean
      over the tile's labelled pixels of ``v_c = 1 / f_c`` (or ``class_weights[c]`` when
      given); ``N`` is the number of samples, so the weights sum to ``N``.
      ``temperature`` and ``min_pixels`` are for ``"rare"`` only.

    A tile without labelled pixels (all padding, ignore index or ignored classes) gets
    weight 0. Raises ArgumentError for a bad argument, a field that is not an integer
    vector per sample, or weights that are all 0; DatasetError for a negative count
    (damaged data).
    """
    if method not in METHODS:
        raise ArgumentError(f"from_mask_classes: method must be one of {list(METHODS)}, not {method!r}")
    check_temperature(temperature)
    check_min_pixels(min_pixels)
    if method == "inverse" and (temperature != DEFAULT_TEMPERATURE or min_pixels != 1):
        raise ArgumentError("from_mask_classes: temperature= and min_pixels= are for method='rare'; "
                            "method='inverse' weighs every labelled pixel")
    if method == "rare" and class_weights is not None:
        raise ArgumentError("from_mask_classes: class_weights= is for method='inverse' (method='rare' derives "
                            "the class probabilities from the temperature)")
    if isinstance(dataset, (str, os.PathLike)):
        dataset = ShardDataset(dataset, split=split)
    elif split is not None:
        raise ArgumentError(f"from_mask_classes: split={split!r} is for a dataset's path; "
                            f"got an open {type(dataset).__name__}")
    if isinstance(dataset, MixedShardDataset) or not isinstance(dataset, (ShardDataset, ConcatShardDataset,
                                                                           ShardSubset)):
        raise ArgumentTypeError(f"from_mask_classes: dataset must be a path, a ShardDataset, a concat or a subset "
                                f"(a mixture draws its own samples), not {type(dataset).__name__}")
    field = pick_field(dataset, field)
    if len(dataset) == 0:
        raise ArgumentError(f"from_mask_classes: {where(dataset)} has no samples to weigh")
    counts = read_field(dataset, field)
    if counts.ndim != 2 or counts.dtype.kind not in "iu":
        raise ArgumentError(f"from_mask_classes: {where(dataset)}: field {field!r} must hold an integer vector "
                            f"per sample, not {counts.dtype}{list(counts.shape[1:])}")
    check_counts(dataset, field, counts)
    left_out = ignored(ignore_classes, counts.shape[1])
    labelled = counts.astype(np.float64)  # exact to 2**53 pixels per class, far past any dataset
    labelled[:, left_out] = 0.0
    if method == "rare":
        weights = rare_weights(labelled, float(temperature), int(min_pixels))
        needed = f"at least min_pixels={min_pixels} pixels of a class"
    else:
        weights = inverse_weights(labelled, None if class_weights is None else
                                  checked_class_weights(class_weights, counts.shape[1]))
        needed = "a labelled pixel of a class with a positive weight"
    if not np.any(weights > 0):
        raise ArgumentError(f"from_mask_classes: {where(dataset)}: every tile has weight 0: none holds {needed} "
                            f"in {field!r} (ignore_classes={left_out})")
    return weights


def rare_weights(counts: np.ndarray, temperature: float, min_pixels: int) -> np.ndarray:
    """Return rare class sampling's ``w_i = sum_c P(c) [n_ic >= min_pixels] / N_c`` for an ``(N, K)`` float array."""
    total = counts.sum()
    if total <= 0:
        return np.zeros(len(counts))
    frequency = counts.sum(axis=0) / total
    holds = counts >= min_pixels
    tiles = holds.sum(axis=0)  # N_c
    present = tiles > 0
    if not present.any():
        return np.zeros(len(counts))
    logits = (1.0 - frequency[present]) / temperature
    p = np.exp(logits - logits.max())  # the softmax, shifted so that no exponential overflows
    prob = np.zeros(counts.shape[1])
    prob[present] = p / p.sum()
    per_tile = np.divide(prob, tiles, out=np.zeros_like(prob), where=present)  # P(c) / N_c
    return holds.astype(np.float64) @ per_tile


def inverse_weights(counts: np.ndarray, class_weights: np.ndarray | None) -> np.ndarray:
    """Return ``N u_i / sum_j u_j``, ``u_i`` the mean over tile i's labelled pixels of ``1 / f_c`` (or the given)."""
    total = counts.sum()
    if total <= 0:
        return np.zeros(len(counts))
    if class_weights is None:
        pixels = counts.sum(axis=0)
        class_weights = np.divide(total, pixels, out=np.zeros_like(pixels), where=pixels > 0)  # 1 / f_c
    labelled = counts.sum(axis=1)
    u = np.divide(counts @ class_weights, labelled, out=np.zeros(len(counts)), where=labelled > 0)
    s = u.sum()
    return u * (len(u) / s) if s > 0 else u


def pick_field(dataset: Datasets, field: str | None) -> str:
    """Return ``field`` after checking the schema holds it as an integer vector; ``None``: the only counts field."""
    fields = (dataset.dataset if isinstance(dataset, ShardSubset) else dataset).fields
    if field is None:
        found = [f.name for f in fields if f.name.endswith(CLASS_PIXELS_SUFFIX)]
        if len(found) != 1:
            which = f"several ({found}); pass field= one of them" if found else (
                f"none (the fields are {[f.name for f in fields]}); {CONVERT_HINT}")
            raise ArgumentError(f"from_mask_classes: {where(dataset)}: fields named *{CLASS_PIXELS_SUFFIX}: {which}")
        field = found[0]
    spec = next((f for f in fields if f.name == field), None)
    if spec is None:
        raise ArgumentError(f"from_mask_classes: {where(dataset)}: no field {field!r}; the fields are "
                            f"{[f.name for f in fields]} ({CONVERT_HINT})")
    if np.dtype(spec.np_dtype).kind not in "iu" or len(spec.shape) != 1 or spec.shape[0] < 1:
        raise ArgumentError(f"from_mask_classes: {where(dataset)}: field {field!r} is {spec.dtype}"
                            f"{list(spec.shape)}; class pixel counts are an integer vector (K,) per sample")
    return field


def check_counts(dataset: Datasets, field: str, counts: np.ndarray) -> None:
    """Raise DatasetError naming the first sample and class with a negative pixel count."""
    if counts.dtype.kind == "i":
        bad = np.argwhere(counts < 0)
        if bad.size:
            i, c = (int(v) for v in bad[0])
            raise DatasetError(f"from_mask_classes: {locate(dataset, i)}: field {field!r} counts {int(counts[i, c])} "
                               f"pixels of class {c}; a count is never negative (damaged data?)")


def ignored(ignore_classes: int | Sequence[int], k: int) -> list[int]:
    """Return ``ignore_classes`` as a list of class indices in ``[0, k)``; quote a bad one."""
    values = [ignore_classes] if isinstance(ignore_classes, (int, np.integer)) else ignore_classes
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, set, frozenset)):
        raise ArgumentTypeError(f"from_mask_classes: ignore_classes must be class indices, not {ignore_classes!r}")
    out = []
    for c in values:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or not 0 <= c < k:
            raise ArgumentError(f"from_mask_classes: ignore_classes holds {c!r}; classes are integers in [0, {k})")
        out.append(int(c))
    return out


def checked_class_weights(class_weights: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    """Return ``class_weights`` as float64 after checking there are ``k`` of them, finite and non-negative."""
    w = real_weights(class_weights, "from_mask_classes: class_weights")
    if w.shape != (k,):
        raise ArgumentError(f"from_mask_classes: class_weights must hold one weight per class ({k}), "
                            f"got shape {w.shape}")
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise ArgumentError(f"from_mask_classes: class_weights[{int(bad[0])}] is {float(w[bad[0]])!r}; "
                            "class weights are finite and non-negative")
    return w


def check_temperature(temperature: Any) -> None:
    """Refuse a temperature that is not a finite positive real number."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, (int, float, np.integer,
                                                                                 np.floating)):
        raise ArgumentTypeError(f"from_mask_classes: temperature must be a positive number, not {temperature!r}")
    if not (math.isfinite(float(temperature)) and temperature > 0):
        raise ArgumentError(f"from_mask_classes: temperature must be finite and > 0, not {temperature!r}")


def check_min_pixels(min_pixels: Any) -> None:
    """Refuse a ``min_pixels`` that is not an integer >= 1."""
    if isinstance(min_pixels, (bool, np.bool_)) or not isinstance(min_pixels, (int, np.integer)):
        raise ArgumentTypeError(f"from_mask_classes: min_pixels must be an integer >= 1, not {min_pixels!r}")
    if min_pixels < 1:
        raise ArgumentError(f"from_mask_classes: min_pixels must be >= 1, not {min_pixels!r}")


def where(dataset: Datasets) -> str:
    """Return the dataset's path (or URL), a concat's paths, or a subset's dataset, for messages."""
    if isinstance(dataset, ShardSubset):
        return f"a subset of {where(dataset.dataset)}"
    if isinstance(dataset, ConcatShardDataset):
        return "concat of " + ", ".join(where(ds) for ds in dataset.datasets)
    return dataset.url or str(dataset.path)


def locate(dataset: Datasets, i: int) -> str:
    """Return where sample ``i`` of ``dataset`` is stored: its dataset's path and its index there."""
    prefix = ""
    if isinstance(dataset, ShardSubset):
        prefix, i, dataset = f"position {i} of a subset: ", int(dataset.indices[i]), dataset.dataset
    if isinstance(dataset, ConcatShardDataset):
        j = int(np.searchsorted(dataset.offsets, i, side="right")) - 1
        i, dataset = i - dataset.offsets[j], dataset.datasets[j]
    return f"{prefix}{where(dataset)}: sample {i}"
