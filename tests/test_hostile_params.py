"""Hostile parameter values (issue 22, items 8 to 10): each is refused with a typed FastloadError naming it.

One row per case: what to call, the FastloadError subclass it must raise, and
text the message must hold (the parameter and the value as given). Loader rows
run on both backends and must raise the same type with the same message, when
the loader is built (nothing is read).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import fastload
from fastload.errors import (
    ArgumentError,
    ArgumentIndexError,
    ArgumentTypeError,
    FastloadError,
    ImageReadError,
    PreprocessError,
    SchemaMismatchError,
    SourceError,
    TransformError,
)
from fastload.loading._state import StateError
from fastload.transforms import (
    AxisMasks,
    CenterCrop,
    Normalize,
    Pad,
    RandomCrop,
    RandomErasing,
    RandomFlip,
    RandomResizedCrop,
    Resize,
    SelectChannels,
    ToDtype,
)

N = 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "ds"
    images = np.arange(N * 3 * 16 * 16, dtype=np.uint32).astype(np.uint8).reshape(N, 3, 16, 16)
    fastload.write_arrays(out, {"image": images, "label": np.arange(N, dtype=np.int64)})
    return out


def loader(ds, backend="native", **kwargs):
    kwargs.setdefault("batch_size", 4)
    if backend == "torch":
        kwargs.setdefault("num_workers", 0)
    return fastload.ShardLoader(ds, backend=backend, **kwargs)


# (id, make the error, expected type, substrings of the message)
TRANSFORM_ROWS = [
    ("pad-30000", lambda: [Pad(30000)], TransformError, ["Pad", "30000", "FASTLOAD_MAX_SAMPLE_BYTES"]),
    ("resize-60000", lambda: [Resize(60000)], TransformError, ["Resize", "60000", "FASTLOAD_MAX_SAMPLE_BYTES"]),
    ("select-channels-wide", lambda: [Pad(200), SelectChannels([0] * 60_000)], TransformError,
     ["SelectChannels", "FASTLOAD_MAX_SAMPLE_BYTES"]),
]

CONSTRUCTION_ROWS = [
    ("randomcrop-padding-2**31", lambda: RandomCrop(8, padding=2**31), TransformError,
     ["RandomCrop: padding", "2147483648"]),
    ("axismasks-count-1e7", lambda: AxisMasks("height", 3, count=10**7), TransformError,
     ["AxisMasks: count", "10000000"]),
    ("axismasks-max-width-float", lambda: AxisMasks("height", 2.5), TransformError, ["max_width", "2.5"]),
    ("normalize-mean-nan", lambda: Normalize(mean=math.nan, std=1), TransformError, ["Normalize: mean", "nan"]),
    ("normalize-mean-inf-list", lambda: Normalize(mean=[0, math.inf, 0], std=1), TransformError,
     ["Normalize: mean", "inf"]),
    ("normalize-std-1e300", lambda: Normalize(mean=0, std=1e300), TransformError, ["Normalize: std", "1e+300"]),
    ("normalize-std-tiny", lambda: Normalize(mean=0, std=1e-300), TransformError, ["Normalize: std", "1e-300"]),
    ("todtype-scale-nan", lambda: ToDtype(scale=math.nan), TransformError, ["ToDtype: scale", "nan"]),
    ("todtype-float16-1e300", lambda: ToDtype("float16", scale=1e300), TransformError, ["scale", "1e+300"]),
    ("todtype-float16-1e5", lambda: ToDtype("float16", scale=1e5), TransformError,
     ["scale 100000.0", "float16"]),
    ("select-channels-float", lambda: SelectChannels([1.5]), TransformError, ["SelectChannels", "1.5"]),
    ("select-channels-bool", lambda: SelectChannels([True, False]), TransformError, ["SelectChannels", "True"]),
    ("rrc-ratio-inf", lambda: RandomResizedCrop(8, ratio=(math.inf, math.inf)), TransformError,
     ["RandomResizedCrop: ratio", "inf"]),
    ("rrc-scale-nan", lambda: RandomResizedCrop(8, scale=(math.nan, 1)), TransformError,
     ["RandomResizedCrop: scale", "nan"]),
    ("erasing-ratio-inf", lambda: RandomErasing(ratio=(1, math.inf)), TransformError,
     ["RandomErasing: ratio", "inf"]),
    ("erasing-value-str", lambda: RandomErasing(value="0"), TransformError, ["RandomErasing: value", "'0'"]),
    ("flip-p-nan", lambda: RandomFlip(p=math.nan), TransformError, ["RandomFlip: p", "nan"]),
    ("pad-value-str", lambda: Pad(2, pad_value="0"), TransformError, ["Pad: pad_value", "'0'"]),
    ("randomcrop-pad-value-dict-str", lambda: RandomCrop(8, pad_value={"image": "x"}), TransformError,
     ["RandomCrop: pad_value", "'x'"]),
    ("pad-bool", lambda: Pad(True), TransformError, ["Pad: padding", "True"]),
    ("pad-huge", lambda: Pad((1, 2**40)), TransformError, ["Pad: padding", str(2**40)]),
    ("centercrop-huge", lambda: CenterCrop(2**21), TransformError, ["CenterCrop: size", str(2**21)]),
    ("resize-float-pair", lambda: Resize((8, 8.5)), TransformError, ["Resize: size", "8.5"]),
]


@pytest.mark.parametrize("make, kind, parts", [r[1:] for r in CONSTRUCTION_ROWS],
                         ids=[r[0] for r in CONSTRUCTION_ROWS])
def test_transform_parameters_are_refused_at_construction(make, kind, parts):
    with pytest.raises(kind) as err:
        make()
    assert isinstance(err.value, FastloadError) and isinstance(err.value, ValueError)
    for part in parts:
        assert part in str(err.value), (part, str(err.value))


@pytest.mark.parametrize("make, kind, parts", [r[1:] for r in TRANSFORM_ROWS], ids=[r[0] for r in TRANSFORM_ROWS])
def test_transform_output_bound_is_one_error_on_both_backends_when_built(ds, make, kind, parts):
    messages = []
    for backend in ("native", "torch"):
        with pytest.raises(kind) as err:
            loader(ds, backend, transforms=make())
        assert type(err.value) is kind
        messages.append(str(err.value))
        for part in parts:
            assert part in str(err.value), (part, str(err.value))
    assert messages[0] == messages[1]


def test_transform_output_under_the_bound_still_reads(ds):
    for backend in ("native", "torch"):
        batch = next(iter(loader(ds, backend, transforms=[Pad(4), AxisMasks("width", 3, count=1024)])))
        assert tuple(batch["image"].shape) == (4, 3, 24, 24)


LOADER_ROWS = [
    ("num_samples-2**63", dict(sample_weights=[1.0] * N, num_samples=2**63), ArgumentError,
     ["num_samples=9223372036854775808"]),
    ("num_samples-1e15", dict(sample_weights=[1.0] * N, num_samples=10**15), ArgumentError,
     ["num_samples=1000000000000000"]),
    ("num_samples-float", dict(sample_weights=[1.0] * N, num_samples=4.0), ArgumentTypeError,
     ["num_samples", "4.0"]),
    ("weights-strings", dict(sample_weights=["1"] * N), ArgumentTypeError, ["sample_weights", "'1'"]),
    ("weights-complex", dict(sample_weights=[1 + 1j] * N), ArgumentTypeError, ["sample_weights", "(1+1j)"]),
    ("weights-bool", dict(sample_weights=[True] * N), ArgumentTypeError, ["sample_weights", "True"]),
    ("weights-bool-array", dict(sample_weights=np.ones(N, bool)), ArgumentTypeError, ["sample_weights", "True"]),
    ("indices-uint64-max", dict(indices=np.array([2**64 - 1], np.uint64)), ArgumentIndexError,
     ["indices[0] = 18446744073709551615"]),
    ("batch_size-huge", dict(batch_size=2**40), ArgumentError, ["batch_size", str(2**40)]),
    ("num_threads-huge", dict(num_threads=10**6), ArgumentError, ["num_threads", "1000000"]),
    ("prefetch-huge", dict(prefetch=10**6), ArgumentError, ["prefetch", "1000000"]),
    ("num_workers-huge", dict(num_workers=10**6), ArgumentError, ["num_workers", "1000000"]),
    ("num_workers-negative", dict(num_workers=-1), ArgumentError, ["num_workers", "-1"]),
    ("prefetch_factor-huge", dict(prefetch_factor=10**6), ArgumentError, ["prefetch_factor", "1000000"]),
    ("world_size-bool", dict(world_size=True, rank=0), ArgumentError, ["world_size", "True"]),
]


@pytest.mark.parametrize("kwargs, kind, parts", [r[1:] for r in LOADER_ROWS], ids=[r[0] for r in LOADER_ROWS])
def test_loader_parameters_are_refused_when_built_on_both_backends(ds, kwargs, kind, parts):
    messages = []
    for backend in ("native", "torch"):
        with pytest.raises(kind) as err:
            loader(ds, backend, **kwargs)
        assert type(err.value) is kind and isinstance(err.value, FastloadError)
        messages.append(str(err.value))
        for part in parts:
            assert part in str(err.value), (part, str(err.value))
    assert messages[0] == messages[1]


def test_set_epoch_past_uint64_is_refused(ds):
    with pytest.raises(ArgumentError, match=re.escape(f"not {2**64}")):
        loader(ds).set_epoch(2**64)


MIX_ROWS = [
    ("stop-1e15", dict(weights=[1, 1], stop=10**15), ArgumentError, ["stop=1000000000000000"]),
    ("weights-strings", dict(weights=["1", "1"]), ArgumentTypeError, ["mix weights", "'1'"]),
    ("all-exhausted-tiny-weight", dict(weights=[1, 1e-15], stop="all_exhausted"), ArgumentError,
     ["all_exhausted", "1e-15"]),
]


@pytest.mark.parametrize("kwargs, kind, parts", [r[1:] for r in MIX_ROWS], ids=[r[0] for r in MIX_ROWS])
def test_mix_parameters_are_refused(ds, kwargs, kind, parts):
    with pytest.raises(kind) as err:
        fastload.mix([ds, ds], **kwargs)
    assert isinstance(err.value, FastloadError)
    for part in parts:
        assert part in str(err.value), (part, str(err.value))


STATE_ROWS = [
    ("epoch-2**64", {"epoch": 2**64}, ["epoch", str(2**64)]),
    ("epoch-bool", {"epoch": True}, ["epoch True"]),
    ("position-bool", {"position": True}, ["position True"]),
    ("world_size-0", {"world_size": 0}, ["world_size 0"]),
    ("world_size-negative", {"world_size": -2}, ["world_size -2"]),
    ("batch_size-0", {"batch_size": 0}, ["batch_size 0"]),
    ("batch_size-str", {"batch_size": "4"}, ["batch_size '4'"]),
]


@pytest.mark.parametrize("change, parts", [r[1:] for r in STATE_ROWS], ids=[r[0] for r in STATE_ROWS])
def test_hostile_state_values_are_refused_at_load(ds, change, parts):
    for backend in ("native", "torch"):
        state = {**loader(ds, backend).state_dict(), **change}
        fresh = loader(ds, backend)
        with pytest.raises(StateError) as err:
            fresh.load_state_dict(state)
        for part in parts:
            assert part in str(err.value), (part, str(err.value))


def test_write_dataset_refuses_duplicate_names(tmp_path):
    with pytest.raises(ArgumentError, match=re.escape("names=['a', 'a']: duplicate field name(s) ['a']")):
        fastload.write_dataset([(np.zeros(2), 0)], tmp_path / "out", names=["a", "a"], samples_per_shard=4)
    assert not (tmp_path / "out").exists()


def test_a_bad_sample_bound_setting_is_typed(ds, monkeypatch):
    monkeypatch.setenv("FASTLOAD_MAX_SAMPLE_BYTES", "-5")
    with pytest.raises(ArgumentError, match=re.escape("FASTLOAD_MAX_SAMPLE_BYTES='-5'")):
        fastload.ShardDataset(ds)


def test_write_dataset_bounds_its_workers(tmp_path):
    with pytest.raises(ArgumentError, match=re.escape("workers must be an integer in [1, 1024], not 1000000")):
        fastload.write_dataset([np.zeros(2)], tmp_path / "out", workers=10**6, samples_per_shard=4)


def test_writers_refuse_a_sample_over_the_readers_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_MAX_SAMPLE_BYTES", "1000")
    samples = [{"x": np.zeros(1001, np.uint8)}] * 2
    with pytest.raises(SchemaMismatchError, match=r"write_dataset: a sample is 1001 bytes .*1000 bytes"):
        fastload.write_dataset(samples, tmp_path / "a", samples_per_shard=4)
    with pytest.raises(SchemaMismatchError, match=r"write_arrays: a sample is 1001 bytes .*1000 bytes"):
        fastload.write_arrays(tmp_path / "b", {"x": np.zeros((2, 1001), np.uint8)})
    fastload.write_dataset([{"x": np.zeros(1000, np.uint8)}] * 2, tmp_path / "c", samples_per_shard=4)
    assert len(fastload.ShardDataset(tmp_path / "c")) == 2  # at the bound: written and read


@pytest.mark.parametrize("cls", [TransformError, PreprocessError, SourceError, ImageReadError, ArgumentError])
def test_error_classes_are_fastload_errors_exported_from_fastload_errors(cls):
    import fastload.errors

    assert issubclass(cls, FastloadError)
    assert cls.__name__ in fastload.errors.__all__
    assert fastload.transforms.TransformError is TransformError
