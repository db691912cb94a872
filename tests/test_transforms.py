"""fastload.transforms: op semantics against plain numpy, validation, golden draws, and C++ == reference bitwise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.transforms import (
    AxisMasks,
    CenterCrop,
    Normalize,
    Pad,
    Program,
    RandomCrop,
    RandomDihedral,
    RandomErasing,
    RandomFlip,
    RandomResizedCrop,
    RandomRot90,
    Resize,
    SelectChannels,
    ToDtype,
    TransformError,
)
from fastload.transforms._reference import apply, float32_to
from fastload.transforms._rng import TRANSFORMS_VERSION, draw, mix64, op_keys, randint

VECTORS = json.loads((Path(__file__).parent / "data" / "transform_vectors.json").read_text())
DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]
SEEDS = [0, 7, 2**63 + 5]


def run(ops, sample: dict[str, np.ndarray], seed=0, epoch=0, index=0, layout="chw"):
    fields = [(k, str(v.dtype), v.shape) for k, v in sample.items()]
    program = Program(ops, fields, layout)
    params = program.params(seed, epoch, np.array([index], np.uint64))
    out = apply(program, {k: v[None] for k, v in sample.items()}, params)
    return {k: v[0] for k, v in out.items()}


IMG = np.arange(3 * 6 * 6, dtype=np.uint8).reshape(3, 6, 6)


# ---- golden vectors ----------------------------------------------------------------------------

def test_vectors_are_for_this_version():
    assert VECTORS["transforms_version"] == TRANSFORMS_VERSION == 1


def test_mix64_is_splitmix64():
    assert int(mix64(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("case", VECTORS["keys"], ids=lambda c: f"s{c['seed']}-e{c['epoch']}-p{c['position']}")
def test_keys_and_draws_reproduce_committed_vectors(case):
    keys = op_keys(case["seed"], case["epoch"], np.array(case["indices"], np.uint64), case["position"])
    assert [int(k) for k in keys] == case["keys"]
    assert [int(v) for v in draw(keys, 0)] == case["draw0"]
    assert [int(v) for v in draw(keys, 1)] == case["draw1"]


def test_op_parameters_reproduce_committed_vectors():
    chain = VECTORS["chain"]
    ops = [RandomCrop((6, 6), padding=2), RandomFlip(horizontal=True, vertical=True), RandomRot90(), RandomDihedral()]
    assert [repr(op) for op in ops] == chain["ops"]
    program = Program(ops, [("image", "uint8", (3, 9, 9))])
    params = program.params(chain["seed"], chain["epoch"], np.array(chain["indices"], np.uint64))
    assert params.tolist() == chain["params"]


def test_fill_parameters_reproduce_committed_vectors():
    chain = VECTORS["fill_chain"]
    ops = [RandomErasing(p=0.8), AxisMasks("width", 4, count=2), AxisMasks("height", 3)]
    assert [repr(op) for op in ops] == chain["ops"]
    program = Program(ops, [("image", "uint8", (2, 12, 16))])
    params = program.params(chain["seed"], chain["epoch"], np.array(chain["indices"], np.uint64))
    assert params.tolist() == chain["params"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float_rounding_reproduces_committed_vectors(dtype):
    case = VECTORS[dtype]
    bits = float32_to(np.array(case["in"], np.float32), dtype)
    assert bits.view(np.uint16).tolist() == case["bits"]


def test_float16_rounding_matches_numpy_and_bfloat16_matches_torch():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(20000) * 1e-6, rng.standard_normal(20000) * 7e4,
                        rng.standard_normal(20000)]).astype(np.float32)
    with np.errstate(over="ignore"):
        assert np.array_equal(float32_to(x, "float16").view(np.uint16), x.astype(np.float16).view(np.uint16))
    torch_bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(float32_to(x, "bfloat16"), torch_bits)


def test_draws_depend_on_every_key_part():
    base = op_keys(1, 2, np.array([3], np.uint64), 4)
    for other in (op_keys(0, 2, np.array([3], np.uint64), 4), op_keys(1, 3, np.array([3], np.uint64), 4),
                  op_keys(1, 2, np.array([4], np.uint64), 4), op_keys(1, 2, np.array([3], np.uint64), 5)):
        assert other[0] != base[0]


def test_randint_is_in_range_and_covers_it():
    u = draw(op_keys(0, 0, np.arange(4000, dtype=np.uint64), 0), 0)
    values = randint(u, 7)
    assert values.min() == 0 and values.max() == 6
    assert np.all(np.bincount(values) > 450)


# ---- op semantics against plain numpy ----------------------------------------------------------

def keys_for(index, position, seed=0, epoch=0):
    return op_keys(seed, epoch, np.array([index], np.uint64), position)


@pytest.mark.parametrize("index", range(8))
def test_random_crop_is_a_window_of_the_padded_sample(index):
    out = run([RandomCrop((4, 5), padding=2, pad_value=9)], {"image": IMG}, index=index)["image"]
    k = keys_for(index, 0)
    top, left = int(randint(draw(k, 0), 6 + 4 - 4 + 1)[0]), int(randint(draw(k, 1), 6 + 4 - 5 + 1)[0])
    padded = np.pad(IMG, ((0, 0), (2, 2), (2, 2)), constant_values=9)
    assert np.array_equal(out, padded[:, top:top + 4, left:left + 5])


def test_center_crop_and_pad():
    assert np.array_equal(run([CenterCrop((3, 4))], {"image": IMG})["image"], IMG[:, 1:4, 1:5])
    out = run([Pad((1, 2, 3, 4), pad_value=7)], {"image": IMG})["image"]
    assert np.array_equal(out, np.pad(IMG, ((0, 0), (2, 4), (1, 3)), constant_values=7))
    assert np.array_equal(run([Pad(1)], {"image": IMG})["image"], np.pad(IMG, ((0, 0), (1, 1), (1, 1))))


@pytest.mark.parametrize("index", range(8))
def test_rot90_and_dihedral_are_numpys(index):
    k = int(randint(draw(keys_for(index, 0), 0), 4)[0])
    assert np.array_equal(run([RandomRot90()], {"image": IMG}, index=index)["image"], np.rot90(IMG, k, axes=(1, 2)))
    t = int(randint(draw(keys_for(index, 0), 0), 8)[0])
    expected = np.rot90(IMG, t % 4, axes=(1, 2))
    expected = expected[:, :, ::-1] if t >= 4 else expected
    assert np.array_equal(run([RandomDihedral()], {"image": IMG}, index=index)["image"], expected)


def test_dihedral_reaches_all_eight_symmetries():
    seen = {run([RandomDihedral()], {"image": IMG}, index=i)["image"].tobytes() for i in range(64)}
    assert len(seen) == 8


def test_flip_frequency_follows_p():
    ops = [RandomFlip(horizontal=True, vertical=False, p=0.25)]
    program = Program(ops, [("image", "uint8", (1, 2, 2))])
    params = program.params(5, 0, np.arange(4000, dtype=np.uint64))
    flipped = (params[:, 4] == -1).mean()
    assert 0.22 < flipped < 0.28
    assert np.all(params[:, 0] == 1)  # never vertical
    never = Program([RandomFlip(p=0.0)], [("image", "uint8", (1, 2, 2))]).params(0, 0, np.arange(100))
    assert np.all(never[:, 4] == 1)


def test_select_to_dtype_and_normalize_are_numpys():
    img = np.random.default_rng(0).integers(0, 65535, (4, 5, 5)).astype(np.uint16)
    assert np.array_equal(run([SelectChannels([3, 0, 3])], {"image": img})["image"], img[[3, 0, 3]])
    out = run([ToDtype("float32", scale=1 / 65535)], {"image": img})["image"]
    assert out.dtype == np.float32 and np.array_equal(out, img.astype(np.float32) * np.float32(1 / 65535))
    mean, std = [100.0, 200.0, 300.0, 400.0], [10.0, 20.0, 30.0, 40.0]
    out = run([Normalize(mean, std, dtype=torch.float16)], {"image": img})["image"]
    m, s = np.array(mean, np.float32)[:, None, None], np.array(std, np.float32)[:, None, None]
    with np.errstate(over="ignore"):
        assert np.array_equal(out, ((img.astype(np.float32) - m) / s).astype(np.float16))


def test_hwc_layout_gives_the_transposed_result():
    ops = [RandomCrop(4, padding=1), RandomDihedral(), SelectChannels([2, 1]), Normalize([1, 2], [3, 4])]
    for index in range(6):
        chw = run(ops, {"image": IMG}, index=index)["image"]
        hwc = run(ops, {"image": IMG.transpose(1, 2, 0).copy()}, index=index, layout="hwc")["image"]
        assert np.array_equal(hwc, chw.transpose(1, 2, 0))


def test_joint_ops_keep_a_mask_aligned_with_its_image():
    img = np.random.default_rng(3).integers(0, 255, (3, 10, 10)).astype(np.uint8)
    ops = [RandomCrop(8, padding=2), RandomDihedral(), RandomFlip(vertical=True), CenterCrop(6)]
    for index in range(20):
        out = run(ops, {"image": img, "mask": (img[0] > 127).astype(np.uint8)}, index=index)
        assert np.array_equal(out["mask"], (out["image"][0] > 127).astype(np.uint8))


def test_random_erasing_fills_one_drawn_rectangle():
    img = np.full((2, 12, 16), 5, np.uint8)
    op = RandomErasing(p=0.75, scale=(0.05, 0.2), value=9)
    erased = 0
    for index in range(40):
        out = run([op], {"image": img}, index=index)["image"]
        top, bottom, left, right = op.rects(keys_for(index, 0), 12, 16)[0]
        expected = img.copy()
        expected[:, top:bottom, left:right] = 9
        assert np.array_equal(out, expected)
        if bottom > top:
            erased += 1
            area = (bottom - top) * (right - left) / (12 * 16)
            assert 0.02 < area < 0.3 and bottom <= 12 and right <= 16
    assert 20 < erased < 40
    assert np.array_equal(run([RandomErasing(p=0.0)], {"image": img})["image"], img)


def test_axis_masks_fill_whole_bands():
    img = np.full((12, 16), 5, np.uint8)
    for index in range(20):
        out = run([AxisMasks("width", 4, count=2, value=0)], {"image": img}, index=index)["image"]
        masked = np.all(out == 0, axis=0)
        assert np.array_equal(np.any(out == 0, axis=0), masked)  # whole columns only
        assert masked.sum() <= 8
        rows = run([AxisMasks("height", 3, value=0)], {"image": img}, index=index)["image"]
        masked_rows = np.all(rows == 0, axis=1)
        assert np.array_equal(np.any(rows == 0, axis=1), masked_rows) and masked_rows.sum() <= 3


def test_resize_identity_nearest_and_bilinear_against_torch():
    img = np.random.default_rng(5).integers(0, 256, (3, 8, 12)).astype(np.uint8)
    assert np.array_equal(run([Resize((8, 12))], {"image": img})["image"], img)
    assert np.array_equal(run([Resize((4, 6), interpolation="nearest")], {"image": img})["image"], img[:, 1::2, 1::2])
    halves = run([Resize((4, 6))], {"image": img})["image"]  # a 2x2 mean, rounded half to even
    block = img.reshape(3, 4, 2, 6, 2).astype(np.float32).mean(axis=(2, 4))
    assert np.array_equal(halves, np.rint(block).astype(np.uint8))
    x = np.random.default_rng(6).standard_normal((3, 9, 7)).astype(np.float32)
    for size in [(5, 4), (13, 20), (9, 3)]:
        ours = run([Resize(size)], {"image": x})["image"]
        theirs = torch.nn.functional.interpolate(torch.from_numpy(x)[None], size=size, mode="bilinear",
                                                 align_corners=False, antialias=False)[0].numpy()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_random_resized_crop_is_a_resized_box():
    img = np.random.default_rng(7).integers(0, 256, (3, 20, 16)).astype(np.uint8)
    op = RandomResizedCrop((6, 8), scale=(0.1, 0.9))
    sizes = set()
    for index in range(30):
        top, left, bh, bw = op.boxes(keys_for(index, 0), 20, 16)[0]
        assert 0 <= top and top + bh <= 20 and 0 <= left and left + bw <= 16
        sizes.add((bh, bw))
        crop = np.ascontiguousarray(img[:, top:top + bh, left:left + bw])
        expected = run([Resize((6, 8))], {"image": crop})["image"]
        assert np.array_equal(run([op], {"image": img}, index=index)["image"], expected)
    assert len(sizes) > 20


def test_resize_keeps_masks_nearest_and_aligned():
    img = np.random.default_rng(8).integers(0, 256, (3, 12, 12)).astype(np.uint8)
    mask = (img[0] > 127).astype(np.uint8)
    for index in range(10):
        out = run([RandomResizedCrop(7, interpolation="nearest")], {"image": img, "mask": mask}, index=index)
        assert np.array_equal(out["mask"], (out["image"][0] > 127).astype(np.uint8))
    out = run([Resize(5)], {"image": img, "mask": mask})  # default: images bilinear, masks nearest
    assert set(np.unique(out["mask"])) <= {0, 1}


# ---- validation ---------------------------------------------------------------------------------

FIELDS = [("image", "uint8", (3, 8, 8)), ("mask", "uint8", (8, 8)), ("label", "int64", ())]


@pytest.mark.parametrize("ops, match", [
    ([RandomCrop(9)], r"RandomCrop.*field 'image'.*larger than the sample"),
    ([RandomCrop(11, padding=1)], r"RandomCrop.*field 'image'.*plus padding 1"),
    ([CenterCrop((4, 9))], r"CenterCrop.*field 'image'.*larger"),
    ([SelectChannels([0, 3])], r"SelectChannels.*field 'image'.*\[3\] out of range for 3 channels"),
    ([SelectChannels([0], fields="mask")], r"SelectChannels.*field 'mask'.*no channel axis"),
    ([Normalize(0, 1, fields="depth")], r"Normalize.*field 'depth'.*no such field"),
    ([RandomFlip(fields=["image", "seg"])], r"RandomFlip.*field 'seg'.*no such field"),
    ([RandomFlip(fields=["label"])], r"RandomFlip.*field 'label'.*not an image"),
    ([Normalize([1, 2], [1, 2])], r"Normalize.*field 'image'.*2 mean values for 3 channels"),
    ([CenterCrop(6, fields="image"), RandomRot90()], r"RandomRot90.*field 'mask'.*differs from 'image'"),
    ([RandomCrop((4, 6)), RandomDihedral()], r"RandomDihedral.*field 'image'.*not square"),
    ([Pad(1, pad_value=-1)], r"Pad.*field 'image'.*pad value -1.0 does not fit dtype uint8"),
    (["flip"], r"transforms\[0\] is 'flip'"),
    ([AxisMasks("width", 9)], r"AxisMasks.*field 'image'.*max_width 9 exceeds the width 8"),
    ([RandomErasing(fields="label")], r"RandomErasing.*field 'label'.*not an image"),
])
def test_ops_that_cannot_apply_name_the_op_and_the_field(ops, match):
    with pytest.raises(TransformError, match=match):
        Program(ops, FIELDS)


def test_bad_arguments_and_dtypes():
    with pytest.raises(TransformError, match="std must be finite and non-zero"):
        Normalize([0.0], [0.0])
    with pytest.raises(TransformError, match="dtype must be one of"):
        ToDtype("int32")
    with pytest.raises(TransformError, match="p must be in"):
        RandomFlip(p=1.5)
    with pytest.raises(TransformError, match="ToDtype.*field 'image'.*dtype bool is not numeric"):
        Program([ToDtype()], [("image", "bool", (1, 4, 4))])
    with pytest.raises(TransformError, match="Resize.*field 'image'.*bilinear interpolation does not take dtype int32"):
        Program([Resize(4)], [("image", "int32", (1, 8, 8))])
    with pytest.raises(TransformError, match="interpolation must be 'bilinear' or 'nearest'"):
        Resize(4, interpolation="cubic")
    with pytest.raises(TransformError, match="layout of field 'image' must be"):
        Program([RandomFlip()], [("image", "uint8", (1, 4, 4))], layout="nchw")


# ---- C++ kernels == numpy reference, bitwise ----------------------------------------------------

def sample_values(dtype: str, shape, rng) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 300.0, 1e5], shape)).astype(dt)
        flat = x.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65520.0]
    return x


@pytest.fixture(scope="module", params=[(d, lay) for d in DTYPES for lay in ("chw", "hwc")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def dtype_dataset(request, tmp_path_factory):
    dtype, layout = request.param
    rng = np.random.default_rng(DTYPES.index(dtype))
    shape = (3, 8, 8) if layout == "chw" else (8, 8, 3)
    out = tmp_path_factory.mktemp(f"tf-{dtype}-{layout}") / "ds"
    fastload.write_arrays(out, {"image": sample_values(dtype, (12, *shape), rng),
                                "mask": rng.integers(0, 4, (12, 8, 8)).astype(np.uint8),
                                "label": np.arange(12)}, codec={"image": "zstd"}, samples_per_shard=5)
    return out, dtype, layout


def chains(dtype: str) -> list[list]:
    spatial = [Pad((1, 2, 0, 3), pad_value=1), RandomCrop(7, padding=2, pad_value={"image": 1, "mask": 3}),
               RandomFlip(horizontal=True, vertical=True), RandomRot90(), RandomDihedral(), CenterCrop(5)]
    bilinear_ok = dtype in ("uint8", "int8", "uint16", "int16", "float16", "float32")
    image_mode = "bilinear" if bilinear_ok else "nearest"
    out_resize = [[Resize((5, 11), interpolation={"image": image_mode}), RandomFlip()],
                  [RandomResizedCrop(6, scale=(0.2, 1.0), interpolation={"image": image_mode, "mask": "nearest"})],
                  [Resize(16, interpolation="nearest")]]
    fills = [RandomErasing(p=0.7, value=1), AxisMasks("width", 3, count=2, value=1),
             AxisMasks("height", 2, value=1, fields=["image", "mask"]), RandomCrop(6)]
    out = [spatial, [SelectChannels([2, 0, 2]), RandomDihedral()], fills, *out_resize]
    if dtype != "bool":
        for target in ("float32", "float16", "bfloat16"):
            out.append([ToDtype(target, scale=1 / 255), RandomCrop(6)])
            out.append([SelectChannels([1, 2]), Normalize([1.5, -2.0], [0.5, 3.0], dtype=target)])
        out.append([ToDtype("float16"), Normalize([1.0, 2.0, 3.0], [7.0, 0.25, 3.0], dtype="bfloat16")])
        out.append([ToDtype("bfloat16", scale=0.5), Normalize(3.0, 9.0, dtype="float16")])
    return out


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.numpy().tobytes()


def test_native_kernels_equal_the_reference_bitwise(dtype_dataset):
    path, dtype, layout = dtype_dataset
    dataset = fastload.ShardDataset(path)
    checked = 0
    for ops in chains(dtype):
        for seed in SEEDS:
            loader = fastload.ShardLoader(path, batch_size=5, shuffle=True, seed=seed, transforms=ops, layout=layout,
                                          backend="native", num_threads=2)
            loader.set_epoch(1)
            for b, batch in enumerate(loader):
                indices = loader._order(1).at(loader._plan(0).batch_positions(b))
                raw = {k: v.numpy() for k, v in dataset.read_batch(indices.tolist()).items()}
                program = loader.augment.program
                expected = apply(program, raw, program.params(seed, 1, indices))
                for name, tensor in batch.items():
                    assert tensor.shape == (len(indices), *program.outputs[name].shape)
                    assert bits(tensor) == np.ascontiguousarray(expected[name]).tobytes(), (ops, seed, name)
                    checked += 1
    assert checked > 0


def test_normalize_with_0_1_statistics_on_uint8_input_warns_naming_the_unit_mismatch(small_dataset):
    import warnings

    from fastload import FastloadWarning, ShardLoader
    from fastload.transforms import Normalize, ToDtype

    imagenet = Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    with pytest.warns(FastloadWarning, match=r"Normalize.*0-1.*'image' is uint8.*0-255.*ToDtype\(scale=1 / 255\)"):
        ShardLoader(small_dataset, batch_size=10, transforms=[imagenet])
    assert issubclass(FastloadWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardLoader(small_dataset, batch_size=10, transforms=[ToDtype(scale=1 / 255), imagenet])  # units agree
        ShardLoader(small_dataset, batch_size=10, transforms=[Normalize([123.7, 116.3, 103.5], [58.4, 57.1, 57.4])])
