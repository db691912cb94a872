"""Masks and targets through the transforms: every spatial op applies one draw to the image, 2-D masks of
uint8/int32/int64/float32 and a 3-D float32 target; masks are never interpolated; non-image fields (`window`,
`scene`, `<target>_class_pixels`) pass through untouched; native == numpy reference bitwise, for 1, 2 and 4
threads, on the torch backend, and after a mid-epoch resume.

Every field is a function of the pixel's coordinates (y, x) and the sample s, so the pairing after an op can be
read back: ``m64 = 2^40 + 1000 s + (y W + x)`` names the source pixel of every output pixel, and every other
field there must hold its own function of that same (s, y, x), or its pad value where m64 holds its pad.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import ShardDataset, ShardLoader
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
from fastload.transforms._reference import apply

N, H, W = 36, 24, 20
BASE = 2**40  # beyond float32's exact integers: an int64 mask that went through float would not survive
MASKS = ("m8", "m32", "m64", "mf")  # 2-D targets: uint8, int32, int64, float32
PASSIVE = ("window", "scene", "mask_class_pixels", "index")  # not images: spatial ops must leave them alone
PADS = {"image": 0, "m8": 255, "m32": -1, "m64": -1, "mf": -1.0, "t3": -7.0}  # none is a value of the data
SEED, EPOCH = 3, 1


def coordinate_fields(s: np.ndarray, y: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    """Return every spatial field's value at sample ``s``, pixel ``(y, x)`` (broadcast arrays)."""
    code = y * W + x
    s, y, x, code = np.broadcast_arrays(s, y, x, code)
    return {
        "image": np.stack([y + 1, x + 1, s + 1], axis=-3).astype(np.uint8),
        "m8": (code % 250 + 1).astype(np.uint8),
        "m32": (-(code + 2 + 1000 * s)).astype(np.int32),
        "m64": (BASE + 1000 * s + code).astype(np.int64),
        "mf": (y + x / 32 + 100 * s).astype(np.float32),
        "t3": np.stack([y * 0.5 + s, -x * 0.25], axis=-3).astype(np.float32),
    }


def write(path, layout: str = "chw"):
    s = np.arange(N)[:, None, None]
    y, x = np.indices((H, W))
    arrays = coordinate_fields(s, y[None], x[None])
    if layout == "hwc":
        arrays["image"] = np.ascontiguousarray(arrays["image"].transpose(0, 2, 3, 1))
        arrays["t3"] = np.ascontiguousarray(arrays["t3"].transpose(0, 2, 3, 1))
    rng = np.random.default_rng(0)
    arrays.update(window=np.stack([np.arange(N) * H, np.full(N, 7), np.full(N, H), np.full(N, W)], 1).astype(np.int64),
                  scene=(np.arange(N) // 4).astype(np.int64),
                  mask_class_pixels=rng.integers(0, 500, (N, 5)).astype(np.int32),
                  index=np.arange(N, dtype=np.int64))
    fastload.write_arrays(path, arrays, codec={"image": "zstd", "m64": "zstd", "t3": "zstd"}, samples_per_shard=10)
    return path


@pytest.fixture(scope="module")
def masks_dataset(tmp_path_factory):
    """36 samples of 24x20: image (3, H, W) uint8, masks m8/m32/m64/mf (H, W), target t3 (2, H, W) float32,
    window (4,), scene (), mask_class_pixels (5,) and index () int64; 4 shards, some fields zstd."""
    return write(tmp_path_factory.mktemp("masks") / "ds")


# (ops, image resampled nearest or gathered, t3 nearest or gathered): where both are, the image pairs too.
CASES = {
    "pad": ([Pad((1, 2, 3, 4), pad_value=PADS)], True, True),
    "center_crop": ([CenterCrop((16, 12))], True, True),
    "random_crop": ([RandomCrop((16, 12))], True, True),
    "random_crop_padded": ([RandomCrop((20, 22), padding=3, pad_value=PADS)], True, True),
    "flip": ([RandomFlip(horizontal=True, vertical=True)], True, True),
    "rot90": ([CenterCrop(20), RandomRot90()], True, True),
    "dihedral": ([CenterCrop(20), RandomDihedral()], True, True),
    "resize_default": ([Resize((12, 10))], False, False),  # image and t3 bilinear, 2-D masks nearest
    "resize_up_nearest": ([Resize((30, 26), interpolation="nearest")], True, True),
    "random_resized_crop_default": ([RandomResizedCrop((12, 10), scale=(0.2, 1.0))], False, False),
    "random_resized_crop_nearest": ([RandomResizedCrop(14, scale=(0.1, 1.0), ratio=(0.5, 2.0),
                                                       interpolation={"image": "nearest", "t3": "nearest"})],
                                    True, True),
    "chain": ([RandomCrop(20, padding=2, pad_value=PADS), RandomDihedral(), RandomFlip(vertical=True),
               RandomResizedCrop(16, interpolation={"t3": "nearest"}), RandomErasing(p=1.0, value=0),
               Normalize([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])], False, True),
}


def load(path, ops, backend: str = "native", threads: int = 1, **kwargs) -> list[dict[str, torch.Tensor]]:
    loader = ShardLoader(path, batch_size=8, shuffle=True, seed=SEED, transforms=ops, backend=backend,
                         num_threads=threads, num_workers=0, **kwargs)
    loader.set_epoch(EPOCH)
    return list(loader)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.numpy().tobytes()


def same_bits(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and bits(x[k]) == bits(y[k]) for k in x)
        for x, y in zip(a, b))


def check_pairing(batch: dict[str, np.ndarray], image_paired: bool, t3_paired: bool) -> None:
    """Every output pixel's fields come from one source pixel of the sample itself (or are all padding)."""
    m64 = batch["m64"]
    pad = m64 == PADS["m64"]
    rel = np.where(pad, 0, m64 - BASE)
    s, code = rel // 1000, rel % 1000
    assert np.all((s == batch["index"][:, None, None]) | pad), "a pixel from another sample"
    assert np.all((code < H * W) | pad)
    expected = coordinate_fields(s, code // W, code % W)
    paired = [*MASKS] + (["image"] if image_paired else []) + (["t3"] if t3_paired else [])
    for name in paired:
        value = batch[name]
        where_pad = pad[:, None] if value.ndim == 4 else pad
        want = np.where(where_pad, np.array(PADS[name]).astype(value.dtype), expected[name])
        assert np.array_equal(value, want), f"{name} is not paired with m64's pixel"


def check_labels_subset(batch: dict[str, np.ndarray], raw: dict[str, np.ndarray]) -> None:
    """Every mask value after the op is one of that sample's input values or the pad value: no interpolation."""
    for name in MASKS:
        for out, src in zip(batch[name], raw[name]):
            allowed = np.append(src.ravel(), np.array(PADS[name], src.dtype))
            assert np.all(np.isin(out, allowed)), f"{name}: values not in the input: {np.setdiff1d(out, allowed)}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_spatial_op_moves_every_mask_with_the_image_and_matches_the_reference(masks_dataset, case):
    ops, image_paired, t3_paired = CASES[case]
    dataset = ShardDataset(masks_dataset)
    native = load(masks_dataset, ops)
    program = Program(ops, [(f.name, f.dtype, f.shape) for f in dataset.fields])
    seen = 0
    for batch in native:
        indices = batch["index"].numpy()
        raw = {k: v.numpy() for k, v in dataset.read_batch(indices.tolist()).items()}
        expected = apply(program, raw, program.params(SEED, EPOCH, indices.astype(np.uint64)))
        out = {k: v.numpy() for k, v in batch.items()}
        for name, value in out.items():
            assert value.dtype == expected[name].dtype and value.shape == expected[name].shape, name
            assert value.tobytes() == np.ascontiguousarray(expected[name]).tobytes(), (case, name)
        for name in MASKS:
            assert out[name].dtype == raw[name].dtype, f"{name} changed dtype"
        for name in PASSIVE:
            assert np.array_equal(out[name], raw[name]), f"{name} was changed by a spatial op"
        check_pairing(out, image_paired, t3_paired)
        check_labels_subset(out, raw)
        seen += len(indices)
    assert seen == N
    for threads in (2, 4):
        assert same_bits(load(masks_dataset, ops, threads=threads), native), f"{threads} threads differ"
    assert same_bits(load(masks_dataset, ops, backend="torch"), native), "the torch backend differs"


@pytest.mark.parametrize("case", ["random_crop_padded", "dihedral", "random_resized_crop_default", "chain"])
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_mid_epoch_resume_gives_the_same_masks(masks_dataset, case, backend):
    ops = CASES[case][0]
    kwargs = dict(batch_size=8, shuffle=True, seed=SEED, transforms=ops, backend=backend, num_threads=2,
                  num_workers=0)
    full = ShardLoader(masks_dataset, **kwargs)
    full.set_epoch(EPOCH)
    every = list(full)
    first = ShardLoader(masks_dataset, **kwargs)
    first.set_epoch(EPOCH)
    it = iter(first)
    head = [next(it) for _ in range(2)]
    state = first.state_dict()
    resumed = ShardLoader(masks_dataset, **kwargs)
    resumed.load_state_dict(state)
    assert same_bits(head + list(resumed), every)


def test_resize_takes_the_documented_nearest_source_pixels(masks_dataset):
    """Nearest: output row i reads source row min(floor((i + 0.5) * H / oh), H - 1), in float32 (TRANSFORMS.md)."""
    for oh, ow in [(12, 10), (30, 26), (7, 13)]:
        batch = load(masks_dataset, [Resize((oh, ow))])[0]
        code = (batch["m64"].numpy() - BASE) % 1000
        rows = np.minimum(np.floor((np.arange(oh, dtype=np.float32) + np.float32(0.5))
                                   * (np.float32(H) / np.float32(oh))), H - 1).astype(np.int64)
        cols = np.minimum(np.floor((np.arange(ow, dtype=np.float32) + np.float32(0.5))
                                   * (np.float32(W) / np.float32(ow))), W - 1).astype(np.int64)
        assert np.array_equal(code // W, np.broadcast_to(rows[:, None], code.shape))
        assert np.array_equal(code % W, np.broadcast_to(cols[None, :], code.shape))


def test_hwc_layout_moves_masks_and_targets_like_chw(tmp_path, masks_dataset):
    path = write(tmp_path / "hwc", layout="hwc")
    ops = [RandomCrop(20, padding=2, pad_value=PADS), RandomDihedral(),
           RandomResizedCrop(12, interpolation={"image": "nearest", "t3": "nearest"})]
    chw = load(masks_dataset, ops, threads=2)
    hwc = load(path, ops, layout="hwc", threads=2)
    assert same_bits(load(path, ops, layout="hwc", backend="torch"), hwc)
    for a, b in zip(chw, hwc):
        for name in a:
            want = a[name].permute(0, 2, 3, 1) if name in ("image", "t3") else a[name]
            assert torch.equal(want, b[name]), name


def test_value_ops_leave_masks_and_targets_alone_by_default(masks_dataset):
    dataset = ShardDataset(masks_dataset)
    raw = {k: v.numpy() for k, v in dataset.read_batch(list(range(8))).items()}
    fields = [(f.name, f.dtype, f.shape) for f in dataset.fields]
    for op in [Normalize([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]), ToDtype(scale=0.5), SelectChannels([2, 0]),
               RandomErasing(p=1.0, value=9), AxisMasks("width", 4, value=9)]:
        program = Program([op], fields)
        assert {s.field for s in program.steps} == {"image"}, op
        out = apply(program, raw, program.params(SEED, EPOCH, np.arange(8, dtype=np.uint64)))
        for name in (*MASKS, "t3", *PASSIVE):
            assert out[name].dtype == raw[name].dtype and np.array_equal(out[name], raw[name]), (op, name)
    native = load(masks_dataset, [Normalize([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])])
    assert native[0]["image"].dtype == torch.float32 and native[0]["m8"].dtype == torch.uint8
    assert native[0]["t3"].dtype == torch.float32 and native[0]["m64"].dtype == torch.int64


def test_erasing_named_masks_erases_the_same_rectangle(masks_dataset):
    ops = [RandomErasing(p=1.0, value=0, fields=["image", "m8", "t3"])]
    y, x = np.indices((H, W))
    for batch in load(masks_dataset, ops, threads=2):
        out = {k: v.numpy() for k, v in batch.items()}
        original = coordinate_fields(out["index"][:, None, None], y[None], x[None])
        erased = np.all(out["image"] == 0, axis=1)  # the image is never 0 (y + 1, x + 1, s + 1)
        assert erased.any(axis=(1, 2)).all()
        for name in ("image", "m8", "t3"):
            where = erased[:, None] if out[name].ndim == 4 else erased
            assert np.array_equal(out[name], np.where(where, 0, original[name]).astype(out[name].dtype)), name
        for name in ("m32", "m64", "mf"):
            assert np.array_equal(out[name], original[name]), name


@pytest.mark.parametrize("field", ["window", "scene", "mask_class_pixels"])
def test_a_spatial_op_named_on_a_non_image_field_fails_loudly(masks_dataset, field):
    for op in (RandomFlip(fields=["image", field]), Resize(8, fields=[field]), CenterCrop(4, fields=[field])):
        with pytest.raises(TransformError, match=rf"{op.name}.*field '{field}'.*is not an image"):
            ShardLoader(masks_dataset, transforms=[op])
    with pytest.raises(TransformError, match=rf"Normalize.*field '{field}'.*is not an image"):
        ShardLoader(masks_dataset, transforms=[Normalize(0.0, 1.0, fields=field)])


@pytest.mark.parametrize("op, match", [
    (Pad(1, pad_value={"image": 0, "masks": 255}), r"Pad.*pad_value names field\(s\) \['masks'\]"),
    (RandomCrop(8, pad_value={"mask": 255}), r"RandomCrop.*pad_value names field\(s\) \['mask'\]"),
    (RandomCrop(8, pad_value={"m8": 255}, fields=["image"]), r"pad_value names field\(s\) \['m8'\].*\['image'\]"),
    (Resize(8, interpolation={"t": "nearest"}), r"Resize.*interpolation names field\(s\) \['t'\]"),
    (RandomResizedCrop(8, interpolation={"image": "nearest", "target": "nearest"}),
     r"RandomResizedCrop.*interpolation names field\(s\) \['target'\]"),
])
def test_a_per_field_dict_naming_another_field_is_refused(masks_dataset, op, match):
    """A typo in a per-field dict would leave that field at the default pad (0) or bilinear: refused instead."""
    with pytest.raises(TransformError, match=match):
        ShardLoader(masks_dataset, transforms=[op])


def test_int_targets_refuse_bilinear_and_a_3d_target_takes_nearest_when_asked():
    fields = [("image", "uint8", (3, 8, 8)), ("labels", "int64", (2, 8, 8)), ("m", "int32", (8, 8))]
    with pytest.raises(TransformError, match=r"Resize.*field 'labels'.*bilinear interpolation does not take dtype "
                                             r"int64.*use interpolation=\{'labels': 'nearest'\}"):
        Program([Resize(4)], fields)
    program = Program([Resize(4, interpolation={"labels": "nearest"})], fields)
    assert {s.field: s.mode for s in program.steps} == {"image": 1, "labels": 0, "m": 0}
    with pytest.raises(TransformError, match=r"Resize.*field 'm'.*bilinear interpolation does not take dtype int32"):
        Program([Resize(4, interpolation={"m": "bilinear", "labels": "nearest"})], fields)


@pytest.mark.parametrize("op", [Resize(6, interpolation="bilinear"),
                                RandomResizedCrop(6, interpolation="bilinear", fields=["image", "m8"])])
def test_one_bilinear_for_every_field_is_refused_for_a_mask(masks_dataset, op):
    """torchvision habits (interpolation=BILINEAR) must not blend a mask's labels: a dict names what to interpolate."""
    with pytest.raises(TransformError, match=rf"{op.name}.*field 'm8'.*interpolate this 2-D field.*\{{'image': "
                                             r"'bilinear'\}"):
        ShardLoader(masks_dataset, transforms=[op])
    ops = [Resize(6, interpolation={"image": "bilinear", "m8": "bilinear"}, fields=["image", "m8"])]
    program = Program(ops, [("image", "uint8", (3, H, W)), ("m8", "uint8", (H, W))])
    assert [s.mode for s in program.steps] == [1, 1]  # named in a dict: interpolated as asked
