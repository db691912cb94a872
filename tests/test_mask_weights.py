"""fastload.weights.from_mask_classes (loading/_mask_weights.py): tile weights from ``<target>_class_pixels`` counts.

The data: 102 tiles of 100 labelled pixels in three classes, counts made by hand so the
formulas can be checked in closed form: tiles 0-89 hold class 0 only, 90-98 hold 40 pixels
of class 0 and 60 of class 1, tile 99 holds 90 of class 0 and 10 of class 2, and tiles 100
and 101 hold no labelled pixel (padding or the ignore index only). Class totals: 9450, 540
and 10 of 10000 pixels, so f = (0.945, 0.054, 0.001).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastload
import fastload.weights
from fastload import ShardDataset, ShardLoader
from fastload.errors import ArgumentError, ArgumentTypeError, DatasetError
from fastload.loading._mask_weights import rare_weights

ROOT = Path(__file__).resolve().parents[1]
N = 102
F = (0.945, 0.054, 0.001)
CLASS0, CLASS1, CLASS2, EMPTY = range(0, 90), range(90, 99), [99], [100, 101]


def class_counts() -> np.ndarray:
    counts = np.zeros((N, 3), np.int32)
    counts[list(CLASS0), 0] = 100
    counts[list(CLASS1)] = (40, 60, 0)
    counts[99] = (90, 0, 10)
    return counts


def write(path: Path, counts: np.ndarray, ids: np.ndarray, **extra: np.ndarray) -> Path:
    fastload.write_arrays(path, {"id": ids, "masks_class_pixels": counts, **extra}, samples_per_shard=40)
    return path


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("mask_weights") / "ds", class_counts(), np.arange(N, dtype=np.int64))


@pytest.fixture(scope="module")
def halves(tmp_path_factory) -> list[Path]:
    root, counts = tmp_path_factory.mktemp("mask_halves"), class_counts()
    return [write(root / name, counts[part], np.arange(N, dtype=np.int64)[part])
            for name, part in (("a", slice(0, 51)), ("b", slice(51, N)))]


def rare_by_hand(temperature: float, classes=(0, 1, 2), f=F, tiles_per_class=(100, 9, 1)) -> np.ndarray:
    """The closed form: P(c) = softmax((1 - f_c) / T) over the classes given, w_i = sum_c P(c) [i holds c] / N_c."""
    e = {c: math.exp((1 - f[c]) / temperature - max((1 - f[k]) / temperature for k in classes)) for c in classes}
    p = {c: e[c] / sum(e.values()) for c in classes}
    share = {c: p.get(c, 0.0) / tiles_per_class[c] for c in range(3)}
    w = np.zeros(N)
    w[list(CLASS0)] = share[0] if 0 in classes else 0.0
    w[list(CLASS1)] = (share[0] if 0 in classes else 0.0) + share[1]
    w[99] = (share[0] if 0 in classes else 0.0) + share[2]
    return w


def drawn_ids(loader: ShardLoader) -> np.ndarray:
    return np.concatenate([b["id"].numpy() for b in loader])


@pytest.mark.parametrize("temperature", [0.01, 0.1, 1.0, 100.0])
def test_rare_matches_the_closed_form(tiles, temperature):
    w = fastload.weights.from_mask_classes(ShardDataset(tiles), temperature=temperature)
    assert w.dtype == np.float64 and w.shape == (N,)
    np.testing.assert_allclose(w, rare_by_hand(temperature), rtol=1e-12, atol=1e-300)
    assert math.isclose(w.sum(), 1.0, rel_tol=1e-12) and np.all(w[EMPTY] == 0)


def test_rare_draws_a_class_then_a_tile(tiles):
    """Exact expected mixes from the weights: P(draw holds class c), against the unweighted 9/102 and 1/102."""
    holds = class_counts() > 0

    def mix(w: np.ndarray) -> np.ndarray:
        return (w / w.sum()) @ holds

    uniform = mix(np.ones(N))
    assert np.allclose(uniform, [100 / N, 9 / N, 1 / N])
    sharp = mix(fastload.weights.from_mask_classes(tiles, temperature=0.01))  # DAFormer's T: the rarest dominates
    assert sharp[2] > 0.99 and math.isclose(sharp[2], 1 / (1 + math.exp(-5.3) + math.exp(-94.4)), rel_tol=1e-9)
    flat = mix(fastload.weights.from_mask_classes(tiles, temperature=100.0))  # a large T: every class about 1/3
    p = np.exp((1 - np.array(F)) / 100.0)
    p /= p.sum()
    np.testing.assert_allclose(flat, [1.0, p[1] + p[0] * 9 / 100, p[2] + p[0] / 100], rtol=1e-12)
    assert np.all(np.abs(p - 1 / 3) < 0.005) and flat[2] > 30 * uniform[2] and flat[1] > 3.5 * uniform[1]


def test_the_loader_draws_by_the_weights_and_never_a_zero(tiles):
    w = fastload.weights.from_mask_classes(tiles, temperature=1.0)
    expected = rare_by_hand(1.0)[99]
    assert math.isclose(expected, 0.4294814, rel_tol=1e-6)  # P(2) + P(0) / 100 with P = softmax(0.055, 0.946, 0.999)
    ids = drawn_ids(ShardLoader(tiles, batch_size=256, fields=["id"], sample_weights=w, num_samples=2000, seed=0))
    plain = drawn_ids(ShardLoader(tiles, batch_size=256, fields=["id"], sample_weights=np.ones(N), num_samples=2000,
                                  seed=0))
    sd = math.sqrt(2000 * expected * (1 - expected))
    assert abs(np.sum(ids == 99) - 2000 * expected) < 4 * sd, np.sum(ids == 99)
    assert np.sum(plain == 99) < 60 and not np.isin(ids, EMPTY).any()
    # Without replacement too: only the 10 tiles holding class 1 or 2 are positive once class 0 is ignored.
    rare_only = fastload.weights.from_mask_classes(tiles, temperature=1.0, ignore_classes=[0])
    assert np.all(rare_only[list(CLASS0) + EMPTY] == 0) and np.all(rare_only[90:100] > 0)
    ids = drawn_ids(ShardLoader(tiles, batch_size=4, fields=["id"], sample_weights=rare_only, num_samples=10,
                                replacement=False, seed=3))
    assert sorted(ids.tolist()) == list(range(90, 100))


def test_ignore_classes_and_min_pixels(tiles):
    w = fastload.weights.from_mask_classes(tiles, temperature=0.1, ignore_classes=(0,))
    f = (0.0, 540 / 550, 10 / 550)  # the frequencies without class 0
    np.testing.assert_allclose(w, rare_by_hand(0.1, classes=(1, 2), f=f), rtol=1e-12)
    assert np.array_equal(fastload.weights.from_mask_classes(tiles, ignore_classes=0),  # one index alone
                          fastload.weights.from_mask_classes(tiles, ignore_classes=[0]))
    # min_pixels=20: tile 99's 10 pixels of class 2 do not count, class 2 is absent (P = 0), f stays the same.
    w = fastload.weights.from_mask_classes(tiles, temperature=0.1, min_pixels=20)
    np.testing.assert_allclose(w, rare_by_hand(0.1, classes=(0, 1)), rtol=1e-12)
    with pytest.raises(ArgumentError, match=r"every tile has weight 0: none holds at least min_pixels=101 pixels"):
        fastload.weights.from_mask_classes(tiles, min_pixels=101)
    with pytest.raises(ArgumentError, match=r"every tile has weight 0.*ignore_classes=\[0, 1, 2\]"):
        fastload.weights.from_mask_classes(tiles, ignore_classes=[0, 1, 2])


def test_inverse_matches_the_closed_form(tiles):
    v = [1 / f for f in F]
    u = np.zeros(N)
    u[list(CLASS0)] = v[0]
    u[list(CLASS1)] = (40 * v[0] + 60 * v[1]) / 100
    u[99] = (90 * v[0] + 10 * v[2]) / 100
    w = fastload.weights.from_mask_classes(tiles, method="inverse")
    np.testing.assert_allclose(w, u * N / u.sum(), rtol=1e-12)
    assert math.isclose(w.sum(), N, rel_tol=1e-12) and np.all(w[EMPTY] == 0)
    u = np.zeros(N)
    u[list(CLASS1)], u[99] = 0.6, 0.2  # class_weights (0, 1, 2): the mean over the labelled pixels
    np.testing.assert_allclose(fastload.weights.from_mask_classes(tiles, method="inverse", class_weights=[0, 1, 2]),
                               u * N / u.sum(), rtol=1e-12)
    u = np.zeros(N)
    u[list(CLASS1)], u[99] = 550 / 540, 550 / 10  # class 0 left out of the counts, its frequencies too
    np.testing.assert_allclose(fastload.weights.from_mask_classes(tiles, method="inverse", ignore_classes=[0]),
                               u * N / u.sum(), rtol=1e-12)


def test_concat_subset_and_path(tiles, halves):
    whole = fastload.weights.from_mask_classes(tiles)
    concat = fastload.concat(halves)
    np.testing.assert_allclose(fastload.weights.from_mask_classes(concat), whole, rtol=1e-12)
    np.testing.assert_allclose(fastload.weights.from_mask_classes(concat, method="inverse"),
                               fastload.weights.from_mask_classes(tiles, method="inverse"), rtol=1e-12)
    picked = [99, 0, 1, 95, 100, 50]
    expected = rare_weights(class_counts()[picked].astype(np.float64), 0.01, 1)  # the subset's own frequencies
    for subset in (ShardDataset(tiles).subset(picked), concat.subset(picked)):
        w = fastload.weights.from_mask_classes(subset)
        np.testing.assert_allclose(w, expected, rtol=1e-12)
        assert w[4] == 0 and w[0] > w[3] > w[1] == w[2] == w[5] > 0
    # ShardLoader refuses a subset with sample_weights (indices= and sample_weights= both); the subset's weights
    # spread onto its dataset draw the same samples.
    spread = np.zeros(N)
    np.add.at(spread, picked, rare_weights(class_counts()[picked].astype(np.float64), 1.0, 1))
    ids = drawn_ids(ShardLoader(concat, batch_size=64, fields=["id"], num_samples=200, seed=0, sample_weights=spread))
    assert set(ids.tolist()) == {99, 0, 1, 95, 50}
    assert np.array_equal(fastload.weights.from_mask_classes(str(tiles)), whole)
    assert np.array_equal(fastload.weights.from_mask_classes(Path(tiles), "masks_class_pixels"), whole)
    with pytest.raises(DatasetError, match="not a dataset root with splits"):
        fastload.weights.from_mask_classes(tiles, split="train")  # split= reaches ShardDataset
    with pytest.raises(ArgumentError, match=r"split='train' is for a dataset's path; got an open ShardDataset"):
        fastload.weights.from_mask_classes(ShardDataset(tiles), split="train")


def test_the_counts_field_is_found_or_the_error_says_how(tmp_path):
    counts, ids = class_counts(), np.arange(N, dtype=np.int64)
    two = write(tmp_path / "two", counts, ids, roads_class_pixels=counts[:, :2].copy())
    with pytest.raises(ArgumentError, match=r"several \(\['masks_class_pixels', 'roads_class_pixels'\]\); pass "
                                            r"field="):
        fastload.weights.from_mask_classes(two)
    assert np.array_equal(fastload.weights.from_mask_classes(two, "masks_class_pixels"),
                          fastload.weights.from_mask_classes(write(tmp_path / "one", counts, ids)))
    fastload.write_arrays(tmp_path / "none", {"id": ids, "label": ids})
    with pytest.raises(ArgumentError, match=r"none \(the fields are \['id', 'label'\]\); convert with class "
                                            r"counts: preprocess_tiles --targets NAME=DIR --num-classes K"):
        fastload.weights.from_mask_classes(tmp_path / "none")
    with pytest.raises(ArgumentError, match=r"no field 'roads_class_pixels'; the fields are \['id', 'label'\]"):
        fastload.weights.from_mask_classes(tmp_path / "none", "roads_class_pixels")
    for name, bad in (("float", counts.astype(np.float32)), ("grid", counts.reshape(N, 3, 1)), ("scalar", ids)):
        path = tmp_path / name
        fastload.write_arrays(path, {"id": ids, "masks_class_pixels": bad})
        with pytest.raises(ArgumentError, match=r"field 'masks_class_pixels' is .*; class pixel counts are an "
                                                r"integer vector \(K,\) per sample"):
            fastload.weights.from_mask_classes(path)


def test_negative_counts_name_the_sample(tmp_path, halves):
    counts = class_counts()
    counts[7, 1] = -3
    damaged = write(tmp_path / "damaged", counts, np.arange(N, dtype=np.int64))
    where = re.escape(str(damaged))
    with pytest.raises(DatasetError, match=rf"{where}: sample 7: field 'masks_class_pixels' counts -3 pixels of "
                                           r"class 1; a count is never negative"):
        fastload.weights.from_mask_classes(damaged)
    concat = fastload.concat([halves[0], damaged])
    with pytest.raises(DatasetError, match=rf"position 1 of a subset: {where}: sample 7: .* counts -3"):
        fastload.weights.from_mask_classes(concat.subset([0, 51 + 7]))


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"method": "sqrt"}, ArgumentError, r"method must be one of \['rare', 'inverse'\], not 'sqrt'"),
    ({"temperature": 0}, ArgumentError, "temperature must be finite and > 0, not 0"),
    ({"temperature": -0.5}, ArgumentError, r"temperature must be finite and > 0, not -0.5"),
    ({"temperature": float("nan")}, ArgumentError, "temperature must be finite and > 0, not nan"),
    ({"temperature": float("inf")}, ArgumentError, "temperature must be finite and > 0, not inf"),
    ({"temperature": "0.1"}, ArgumentTypeError, "temperature must be a positive number, not '0.1'"),
    ({"temperature": True}, ArgumentTypeError, "temperature must be a positive number, not True"),
    ({"min_pixels": 0}, ArgumentError, "min_pixels must be >= 1, not 0"),
    ({"min_pixels": 1.5}, ArgumentTypeError, r"min_pixels must be an integer >= 1, not 1.5"),
    ({"min_pixels": True}, ArgumentTypeError, "min_pixels must be an integer >= 1, not True"),
    ({"method": "inverse", "class_weights": [1, 2]}, ArgumentError,
     r"class_weights must hold one weight per class \(3\), got shape \(2,\)"),
    ({"method": "inverse", "class_weights": [1, -2, 1]}, ArgumentError, r"class_weights\[1\] is -2.0"),
    ({"method": "inverse", "class_weights": [1, 1, float("nan")]}, ArgumentError, r"class_weights\[2\] is nan"),
    ({"method": "inverse", "class_weights": [1, "a", 1]}, ArgumentTypeError, "class_weights must be real numbers"),
    ({"method": "inverse", "class_weights": [0, 0, 0]}, ArgumentError,
     "every tile has weight 0: none holds a labelled pixel of a class with a positive weight"),
    ({"class_weights": [1, 1, 1]}, ArgumentError, r"class_weights= is for method='inverse'"),
    ({"method": "inverse", "temperature": 0.5}, ArgumentError, "temperature= and min_pixels= are for method='rare'"),
    ({"method": "inverse", "min_pixels": 5}, ArgumentError, "temperature= and min_pixels= are for method='rare'"),
    ({"ignore_classes": [3]}, ArgumentError, r"ignore_classes holds 3; classes are integers in \[0, 3\)"),
    ({"ignore_classes": [-1]}, ArgumentError, r"ignore_classes holds -1"),
    ({"ignore_classes": [1.0]}, ArgumentError, r"ignore_classes holds 1.0"),
    ({"ignore_classes": "0"}, ArgumentTypeError, "ignore_classes must be class indices, not '0'"),
])
def test_argument_errors(tiles, kwargs, error, message):
    with pytest.raises(error, match=message):
        fastload.weights.from_mask_classes(tiles, **kwargs)


def test_datasets_it_refuses(tiles, tmp_path):
    with pytest.raises(ArgumentTypeError, match="a mixture draws its own samples"):
        fastload.weights.from_mask_classes(fastload.mix([tiles, tiles], weights=[1, 1]))
    with pytest.raises(ArgumentTypeError, match="not list"):
        fastload.weights.from_mask_classes([tiles])  # type: ignore[arg-type]
    empty = tmp_path / "empty"
    fastload.write_arrays(empty, {"masks_class_pixels": np.zeros((0, 3), np.int32)})
    with pytest.raises(ArgumentError, match="has no samples to weigh"):
        fastload.weights.from_mask_classes(empty)


def test_fastload_weights_after_a_plain_import():
    """``fastload.weights`` is a public module reached lazily: ``import fastload`` alone still skips torch."""
    code = ("import sys, fastload\n"
            "assert 'torch' not in sys.modules and 'weights' in dir(fastload)\n"
            "w = fastload.weights\n"
            "from fastload.loading import _mask_weights, _weights\n"
            "assert w.from_mask_classes is _mask_weights.from_mask_classes\n"
            "assert w.class_balanced_weights is _weights.class_balanced_weights is fastload.class_balanced_weights\n"
            "assert sorted(w.__all__) == ['class_balanced_weights', 'from_mask_classes']\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
