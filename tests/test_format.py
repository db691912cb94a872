import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload import _native
from fastload.errors import CorruptRecordError, SchemaMismatchError
from fastload.format._dtypes import NUMPY_DTYPES
from fastload.format._record import (
    RECORD_VERSION,
    Field,
    RecordDecodeError,
    RecordEncoder,
    decode_record,
    schema_fingerprint,
)

CODECS = ["raw", "zstd", "zstd-shuffle"]


def random_array(rng, dtype, shape):
    dt = NUMPY_DTYPES[dtype]
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind == "f":
        return rng.normal(size=shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def native_decode(record, fields, key=None, version=RECORD_VERSION, fingerprint=None):
    out = [np.empty(f.shape, f.np_dtype) for f in fields]
    fingerprint = schema_fingerprint(fields) if fingerprint is None else fingerprint
    _native.decode_record(record, [f.native_spec for f in fields], [o.reshape(-1).view(np.uint8) for o in out],
                          version=version, fingerprint=fingerprint, key=key)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(sorted(NUMPY_DTYPES)), codec=st.sampled_from(CODECS),
       shape=st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple), seed=st.integers(0, 2**32 - 1))
def test_record_round_trip_python_and_native(dtype, codec, shape, seed):
    rng = np.random.default_rng(seed)
    fields = [Field("x", dtype, shape, codec), Field("y", "int64", ())]
    value = random_array(rng, dtype, shape)
    record = RecordEncoder(fields).encode({"x": value, "y": np.int64(seed)})
    for decoded in (decode_record(record, fields), native_decode(record, fields)):
        assert decoded[0].dtype == NUMPY_DTYPES[dtype] and decoded[0].shape == shape
        assert np.array_equal(decoded[0], value, equal_nan=dtype.startswith("float"))
        assert int(decoded[1]) == seed


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", sorted(NUMPY_DTYPES))
def test_dataset_round_trip_every_dtype_and_codec(tmp_path, dtype, codec):
    rng = np.random.default_rng(1)
    values = random_array(rng, dtype, (37, 2, 5, 3))
    scalars = random_array(rng, dtype, (37,))
    fastload.write_arrays(tmp_path / "ds", {"v": values, "s": scalars}, codec=codec, samples_per_shard=10)
    ds = fastload.ShardDataset(tmp_path / "ds")
    assert len(ds) == 37 and [f.name for f in ds.schema] == ["v", "s"]
    for i in (0, 9, 10, 36, -1):
        item = ds[i]
        assert item["v"].dtype == torch.from_numpy(np.empty(0, NUMPY_DTYPES[dtype])).dtype
        assert item["s"].shape == torch.Size([])
        assert np.array_equal(item["v"].numpy(), values[i], equal_nan=True)
        assert np.array_equal(item["s"].numpy(), scalars[i], equal_nan=True)
    with pytest.raises(IndexError, match="out of range"):
        ds[37]


def test_zstd_shuffle_compresses_uint16_rasters_better():
    from conftest import smooth_images

    images = smooth_images(16, (4, 32, 32), "uint16") * 16
    sizes = {}
    for codec in CODECS:
        encoder = RecordEncoder([Field("x", "uint16", (4, 32, 32), codec)])
        sizes[codec] = sum(len(encoder.encode({"x": im})) for im in images)
    assert sizes["zstd-shuffle"] < 0.9 * sizes["zstd"] < sizes["raw"]


def test_encoder_refuses_wrong_shapes_and_dtypes():
    enc = RecordEncoder([Field("x", "uint8", (2, 2))])
    with pytest.raises(SchemaMismatchError, match=r"shape \(3, 2\) differs"):
        enc.encode({"x": np.zeros((3, 2), np.uint8)})
    with pytest.raises(SchemaMismatchError, match="dtype float32 differs"):
        enc.encode({"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(SchemaMismatchError, match="fields"):
        enc.encode({"z": np.zeros((2, 2), np.uint8)})


def test_field_validation():
    with pytest.raises(ValueError, match="unknown codec 'brotli'"):
        Field("x", "uint8", (1,), "brotli")
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        Field("x", "complex64", (1,))


FIELDS = [Field("x", "uint16", (64,), "zstd-shuffle"), Field("y", "uint8", (8,), "raw")]


def good_record():
    return RecordEncoder(FIELDS).encode({"x": np.arange(64, dtype=np.uint16), "y": np.arange(8, dtype=np.uint8)})


def corrupt(record: bytes, offset: int, value: bytes) -> bytes:
    return record[:offset] + value + record[offset + len(value):]


CASES = {
    "bad magic": lambda r: corrupt(r, 0, b"XXXX"),
    "unsupported record version": lambda r: corrupt(r, 4, struct.pack("<H", 9)),
    "record has 3 fields": lambda r: corrupt(r, 6, struct.pack("<H", 3)),
    "record of key 7 found under key 0": lambda r: corrupt(r, 8, struct.pack("<Q", 7)),
    "written under another schema": lambda r: corrupt(r, 16, b"\xff"),
    "codec 0 differs": lambda r: corrupt(r, 24, b"\0"),
    "reserved bytes": lambda r: corrupt(r, 25, b"\1"),
    "runs past the end": lambda r: corrupt(r, 28, struct.pack("<I", 10**6)),
    "decoded length 5 differs": lambda r: corrupt(r, 32, struct.pack("<Q", 5)),
    "checksum mismatch": lambda r: corrupt(r, len(r) - 1, bytes([r[-1] ^ 1])),
    "bytes after its payloads": lambda r: r + b"\0",
    "shorter than its header": lambda r: r[:5],
    "truncated inside its header": lambda r: r[:40],
}


@pytest.mark.parametrize("expected", list(CASES))
def test_decoders_name_what_is_wrong(expected):
    bad = CASES[expected](good_record())
    with pytest.raises(RecordDecodeError, match=expected):
        decode_record(bad, FIELDS, key=0)
    with pytest.raises(CorruptRecordError, match=expected):
        native_decode(bad, FIELDS, key=0)


def test_corrupt_zstd_payload_is_caught_by_both_decoders():
    rec = bytearray(good_record())
    header = 24 + 24 * 2
    rec[header + 6] ^= 0xFF  # inside the zstd frame of field 0
    with pytest.raises(RecordDecodeError, match="field 0"):
        decode_record(bytes(rec), FIELDS)
    with pytest.raises(CorruptRecordError, match="field 0"):
        native_decode(bytes(rec), FIELDS)


def test_checksum_is_xxh3_64():
    import xxhash

    data = np.arange(1000, dtype=np.uint8)
    assert _native.checksum(data) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_no_pickle_in_the_format(small_dataset):
    for path in small_dataset.iterdir():
        data = path.read_bytes()
        assert b"\x80\x04\x95" not in data and b"\x80\x05\x95" not in data  # pickle protocol 4/5 frames
