"""The lz4, lz4-shuffle, png and jpeg codecs: round trips on both backends, refusals, damaged payloads."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from conftest import BACKENDS, smooth_images
from PIL import Image

import fastload
from fastload.errors import CorruptRecordError, DatasetError, SchemaMismatchError
from fastload.format import _payload
from fastload.format._codecs import Geometry, fitting_codecs
from fastload.format._record import Field, RecordEncoder, decode_record

N = 12


def read_all(path: Path, backend: str) -> dict[str, np.ndarray]:
    loader = fastload.ShardLoader(path, batch_size=N, backend=backend, num_workers=0)
    batches = list(loader)
    assert len(batches) == 1
    return {k: v.numpy() for k, v in batches[0].items()}


def photo_tiles(n: int, layout: str) -> np.ndarray:
    """n 3x32x48 tiles of a real photograph (uint8), in ``layout``."""
    photo = skimage.data.astronaut()
    tiles = np.stack([photo[40 * i: 40 * i + 32, 30 * i: 30 * i + 48] for i in range(n)])
    return tiles.transpose(0, 3, 1, 2).copy() if layout == "chw" else tiles


LOSSLESS_CASES = [
    (codec, dtype, shape, layout)
    for codec in ("lz4", "lz4-shuffle")
    for dtype, shape, layout in [("uint8", (3, 20, 24), None), ("uint16", (5, 16, 16), None),
                                 ("float32", (7,), None), ("int64", (), None), ("bool", (9,), None)]
] + [
    ("png", dtype, shape, layout)
    for dtype in ("uint8", "uint16")
    for shape, layout in [((20, 24), None), ((1, 20, 24), "chw"), ((2, 20, 24), "chw"), ((3, 20, 24), "chw"),
                          ((4, 20, 24), "chw"), ((20, 24, 3), "hwc"), ((20, 24, 4), "hwc"), ((3, 20, 3), "hwc")]
]


@pytest.mark.parametrize(("codec", "dtype", "shape", "layout"), LOSSLESS_CASES)
def test_lossless_codecs_round_trip_exactly_on_both_backends(tmp_path, codec, dtype, shape, layout):
    if dtype == "bool":
        data = np.random.default_rng(1).integers(0, 2, (N, *shape)).astype(bool)
    elif len(shape) == 2:
        data = smooth_images(N, (1, *shape), dtype)[:, 0]
    elif len(shape) == 3:
        data = smooth_images(N, shape, dtype)
    else:
        data = np.random.default_rng(2).integers(0, 1000, (N, *shape)).astype(dtype)
    fastload.write_arrays(tmp_path / "ds", {"x": data, "label": np.arange(N)}, codec={"x": codec}, layout=layout,
                          samples_per_shard=5)
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["schema"][0]["codec"] == codec
    for backend in BACKENDS:
        got = read_all(tmp_path / "ds", backend)
        assert got["x"].dtype == data.dtype and np.array_equal(got["x"], data), backend
        assert np.array_equal(got["label"], np.arange(N))


def test_lz4_shuffle_compresses_smooth_uint16_better_than_lz4():
    data = smooth_images(16, (4, 32, 32), "uint16") + 1000  # a raster: high bytes that change slowly
    sizes = {}
    for codec in ("lz4", "lz4-shuffle"):
        encoder = RecordEncoder([Field("x", "uint16", (4, 32, 32), codec, {"level": 0})])
        sizes[codec] = sum(len(encoder.encode({"x": d})) for d in data)
    assert sizes["lz4-shuffle"] < sizes["lz4"] < data.nbytes


@pytest.mark.parametrize("layout", ["chw", "hwc"])
@pytest.mark.parametrize("subsampling", ["444", "420"])
def test_jpeg_native_and_python_readers_agree_bit_for_bit(tmp_path, layout, subsampling):
    tiles = photo_tiles(N, layout)
    gray = tiles[:, 0] if layout == "chw" else tiles[..., 0]
    fastload.write_arrays(tmp_path / "ds", {"rgb": tiles, "gray": gray}, codec="jpeg", layout=layout,
                          subsampling=subsampling, quality=90)
    native, python = read_all(tmp_path / "ds", "native"), read_all(tmp_path / "ds", "torch")
    for name, original in (("rgb", tiles), ("gray", gray)):
        assert np.array_equal(native[name], python[name])
        error = np.abs(native[name].astype(int) - original.astype(int))
        assert error.mean() < 4 and np.percentile(error, 99) < 24, (name, error.mean())


def test_jpeg_decode_is_within_one_level_of_pillows_decode_of_the_same_bytes(tmp_path):
    """Pillow's libjpeg-turbo build may differ from the system's; the bytes decode alike within one level."""
    tiles = photo_tiles(N, "hwc")
    field = Field("x", "uint8", tiles.shape[1:], "jpeg", {"layout": "hwc", "quality": 90, "subsampling": "420"})
    geometry = Geometry(32, 48, 3, False)
    fastload.write_arrays(tmp_path / "ds", {"x": tiles}, codec="jpeg", layout="hwc")
    ours = read_all(tmp_path / "ds", "native")["x"]
    for i, tile in enumerate(tiles):
        payload = _payload.jpeg_encode(tile, geometry, field.codec_options)
        pillow = np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))
        assert np.abs(pillow.astype(int) - ours[i].astype(int)).max() <= 1


def test_encoding_is_deterministic_and_options_are_recorded(tmp_path):
    tiles = photo_tiles(N, "chw")
    out = {}
    for run in ("a", "b"):
        m = fastload.write_arrays(tmp_path / run, {"png": tiles, "jpeg": tiles, "lz4": tiles},
                                  codec={"png": "png", "jpeg": "jpeg", "lz4": "lz4"}, quality=80)
        out[run] = [(tmp_path / run / s.file).read_bytes() for s in m.shards]
    assert out["a"] == out["b"]
    schema = {f["name"]: f for f in json.loads((tmp_path / "a" / "manifest.json").read_text())["schema"]}
    assert schema["png"]["codec_options"] == {"layout": "chw", "level": 6}
    assert schema["jpeg"]["codec_options"] == {"layout": "chw", "quality": 80, "subsampling": "420"}
    assert schema["lz4"]["codec_options"] == {"level": 0}


@pytest.mark.parametrize(("dtype", "shape", "codec", "problem"), [
    ("uint16", (13, 8, 8), "png", "png holds 1 to 4 channels, not 13"),
    ("float32", (3, 8, 8), "png", "png holds uint8 or uint16, not float32"),
    ("uint16", (3, 8, 8), "jpeg", "jpeg holds uint8, not uint16"),
    ("uint8", (2, 8, 8), "jpeg", "jpeg holds 1 or 3 channels, not 2"),
    ("uint8", (8,), "png", "png holds images"),
])
def test_a_field_the_codec_cannot_hold_is_refused_with_the_codecs_that_fit(tmp_path, dtype, shape, codec, problem):
    data = np.zeros((2, *shape), dtype=dtype)
    with pytest.raises(SchemaMismatchError, match="codecs that fit: raw, zstd") as info:
        fastload.write_arrays(tmp_path / "ds", {"x": data}, codec=codec, layout="chw" if len(shape) == 3 else None)
    assert problem in str(info.value)
    assert not (tmp_path / "ds").exists()


def test_fitting_codecs():
    assert fitting_codecs("uint8", (3, 8, 8), "chw") == ["raw", "zstd", "zstd-shuffle", "lz4", "lz4-shuffle", "png",
                                                         "jpeg"]
    assert fitting_codecs("uint16", (4, 8, 8), "chw")[-1] == "png"
    assert "png" not in fitting_codecs("uint8", (3, 8, 8), None)  # a 3-D image needs its layout


def test_ambiguous_layout_must_be_named(tmp_path):
    with pytest.raises(SchemaMismatchError, match="needs codec_options layout"):
        fastload.write_arrays(tmp_path / "ds", {"x": np.zeros((2, 3, 8, 3), np.uint8)}, codec="png")


def png_with_ihdr(payload: bytes, width: int, height: int) -> bytes:
    """The same PNG with another width and height in its header (and a valid header CRC)."""
    ihdr = bytearray(payload[8:33])
    struct.pack_into(">II", ihdr, 8, width, height)
    struct.pack_into(">I", ihdr, 21, zlib.crc32(bytes(ihdr[4:21])))
    return payload[:8] + bytes(ihdr) + payload[33:]


def replace_payload(record: bytes, payload: bytes) -> bytes:
    """A one-field v2 record with another payload (its entry's encoded length updated)."""
    header = 24 + 24
    entry = bytearray(record[24:header])
    struct.pack_into("<I", entry, 4, len(payload))
    return record[:24] + bytes(entry) + payload


def decode_both(record: bytes, field: Field) -> list[str]:
    """Decode one record with the native decoder and the Python one; return both errors."""
    from fastload import _native

    errors = []
    try:
        decode_record(record, [field])
    except Exception as err:  # noqa: BLE001 - the test compares the errors' kinds below
        errors.append(type(err).__name__ + ": " + str(err))
    out = np.zeros(field.nbytes, np.uint8)
    try:
        _native.decode_record(record, [field.native_spec], [out], True, fastload.format._record.RECORD_VERSION,
                              fastload.format._record.schema_fingerprint([field]))
    except Exception as err:  # noqa: BLE001
        errors.append(type(err).__name__ + ": " + str(err))
    return errors


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_damaged_image_payloads_are_refused_by_both_readers(codec):
    tile = photo_tiles(1, "chw")[0]
    field = Field("x", "uint8", tile.shape, codec, {"layout": "chw"})
    record = RecordEncoder([field]).encode({"x": tile})
    payload = record[48:]
    cases = {"truncated": payload[: len(payload) // 2], "empty": b"", "garbage": b"\x89PNG" + bytes(100)}
    if codec == "png":
        cases["wider"] = png_with_ihdr(payload, 49, 32)
        cases["taller"] = png_with_ihdr(payload, 48, 33)
        gray = np.asarray(Image.fromarray(tile[0]))
        buf = io.BytesIO()
        Image.fromarray(gray).save(buf, format="PNG")
        cases["one channel"] = buf.getvalue()
        buf = io.BytesIO()
        Image.fromarray(tile.transpose(1, 2, 0)).save(buf, format="PNG", interlace=1)
    else:
        buf = io.BytesIO()
        Image.fromarray(tile[0]).save(buf, format="JPEG")
        cases["one channel"] = buf.getvalue()
        buf = io.BytesIO()
        Image.fromarray(tile.transpose(1, 2, 0)[:, :40]).save(buf, format="JPEG")
        cases["narrower"] = buf.getvalue()
    for name, bad in cases.items():
        errors = decode_both(replace_payload(record, bad), field)
        assert len(errors) == 2, (name, errors)
        kinds = ("RecordDecodeError: field 0: ", "CorruptRecordError: decode: <buffer> record 0: field 0: ")
        assert all(e.startswith(kinds) for e in errors), (name, errors)


def test_a_damaged_jpeg_header_does_not_spoil_the_next_intact_jpeg():
    """TurboJPEG leaves a handle whose header read failed unusable for the next stream; the Python reader
    (one handle per thread) starts afresh after an error (the native one: csrc/tests/core_tests.cpp)."""
    tile = photo_tiles(1, "chw")[0]
    field = Field("x", "uint8", tile.shape, "jpeg", {"layout": "chw"})
    record = RecordEncoder([field]).encode({"x": tile})
    payload = record[48:]
    expected = decode_record(record, [field])[0].copy()
    refused = 0
    for at in range(2, payload.index(b"\xff\xda")):  # every byte of the header, up to the scan
        damaged = bytearray(payload)
        damaged[at] ^= 0x5A
        try:
            decode_record(replace_payload(record, bytes(damaged)), [field])
        except Exception:  # noqa: BLE001 - any refusal; the next decode is what is checked
            refused += 1
        assert np.array_equal(decode_record(record, [field])[0], expected), at
    assert refused > 100


def test_png_of_another_size_in_a_shard_is_a_corrupt_record_naming_shard_and_record(tmp_path):
    from shard_edit import read_records, replace_record

    tiles = photo_tiles(4, "chw")
    fastload.write_arrays(tmp_path / "ds", {"x": tiles}, codec="png")
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    record = read_records(shard)[2]
    replace_record(shard, 2, replace_payload(record, png_with_ihdr(record[48:], 48, 31)))  # inside its block
    manifest = tmp_path / "ds" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["shards"][0]["bytes"] = shard.stat().st_size  # the damage is inside a record, not to the file's size
    manifest.write_text(json.dumps(doc))
    for backend in BACKENDS:
        with pytest.raises(CorruptRecordError, match=r"shard-00000.lmdb.* 2.*png of 48x31 pixels, the field has 48x32"):
            read_all(tmp_path / "ds", backend)


def test_manifest_with_codec_options_out_of_range_is_refused(tmp_path):
    fastload.write_arrays(tmp_path / "ds", {"x": photo_tiles(2, "chw")}, codec="jpeg")
    path = tmp_path / "ds" / "manifest.json"
    doc = json.loads(path.read_text())
    for options, problem in [({"layout": "chw", "quality": 101}, "quality 101"),
                             ({"layout": "xyz"}, "layout 'xyz'"), ({}, "needs codec_options layout")]:
        doc["schema"][0]["codec_options"] = options
        path.write_text(json.dumps(doc))
        with pytest.raises(DatasetError, match=problem):
            fastload.ShardDataset(tmp_path / "ds")
