"""Shard format v4 (and reading v1 to v3): the schema and the binary record (see docs/FORMAT.md).

This is the reference implementation in Python: the writer uses it to encode
records and ``ShardDataset`` to decode them. The native decoder in
``csrc/format/record_decoder.cpp`` implements the same checks.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash
import zstandard

from ..errors import ArgumentError, SchemaMismatchError
from . import _payload
from ._codecs import (
    CODECS,
    IMAGE_CODECS,
    LOSSY_CODECS,
    Geometry,
    PayloadError,
    codec_problem,
    fitting_codecs,
    image_geometry,
    options_problem,
    shuffle_bytes,
    unshuffle_bytes,
)
from ._dtypes import NUMPY_DTYPES

FORMAT_VERSION = 4  # what writers write (v4: v3 records packed into blocks, format/_blocks.py)
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)
RECORD_MAGIC = b"FLRC"
RECORD_VERSION = 4  # a dataset's records have its manifest's format_version
DEFAULT_ZSTD_LEVEL = 3
# Fields per schema. The record header's count is 16-bit, but no real schema needs more than a few
# dozen fields, and each costs every reader work and buffers per batch: 1024 leaves a wide margin.
MAX_FIELDS = 1024

MAX_SAMPLE_BYTES_ENV = "FASTLOAD_MAX_SAMPLE_BYTES"
DEFAULT_MAX_SAMPLE_BYTES = 2 << 30  # 2 GiB: one sample's decoded bytes, all fields together


def max_sample_bytes() -> int:
    """Return the largest sample (decoded bytes of all fields) readers accept: 2 GiB unless configured.

    ``FASTLOAD_MAX_SAMPLE_BYTES`` (a positive integer below 2**63) changes it.
    A dataset whose schema declares more is refused before anything is allocated.
    """
    text = os.environ.get(MAX_SAMPLE_BYTES_ENV, "")
    if not text:
        return DEFAULT_MAX_SAMPLE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 2**63:
        raise ArgumentError(f"{MAX_SAMPLE_BYTES_ENV}={text!r}: expected a positive integer below 2**63")
    return value


_HEADER = struct.Struct("<4sHH")  # magic, version, field count
_BINDING = struct.Struct("<QQ")  # v2, v3: the record's key within its shard, its (binding) fingerprint
_KEY_OFFSET = _HEADER.size
_FINGERPRINT_OFFSET = _KEY_OFFSET + 8
_ENTRY = struct.Struct("<B3xIQQ")  # codec, reserved, encoded length, decoded length, xxh3-64


class RecordDecodeError(Exception):
    """A record's bytes are wrong; the caller adds the shard and key."""


@dataclass(frozen=True)
class Field:
    """One fixed-shape field of every sample: name, dtype, shape and codec."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str = "raw"
    codec_options: Mapping[str, int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ArgumentError("a field needs a name")
        if self.dtype not in NUMPY_DTYPES:
            raise ArgumentError(f"field {self.name!r}: dtype {self.dtype!r} is not one of {list(NUMPY_DTYPES)}")
        if self.codec not in CODECS:
            raise ArgumentError(f"field {self.name!r}: unknown codec {self.codec!r}; use one of {list(CODECS)}")
        if any(int(d) < 0 for d in self.shape):
            raise ArgumentError(f"field {self.name!r}: negative dimension in shape {self.shape}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        problem = options_problem(self.codec, self.codec_options)
        if problem:
            raise ArgumentError(f"field {self.name!r}: codec_options: {problem}")
        problem = codec_problem(self.codec, self.dtype, self.shape, self.codec_options)
        if problem:
            layout = self.codec_options.get("layout")
            fits = fitting_codecs(self.dtype, self.shape, layout if isinstance(layout, str) else None)
            raise SchemaMismatchError(f"field {self.name!r} ({self.dtype} {list(self.shape)}): {problem}; "
                                      f"codecs that fit: {', '.join(fits)}")

    @property
    def np_dtype(self) -> np.dtype:
        """Return the little-endian numpy dtype of the field."""
        return NUMPY_DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        """Return the bytes per element."""
        return self.np_dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Return the decoded bytes of this field in one sample."""
        return math.prod(self.shape) * self.itemsize

    @property
    def codec_id(self) -> int:
        """Return the codec's id in the record header."""
        return CODECS[self.codec]

    @property
    def geometry(self) -> Geometry | None:
        """Return the image a png or jpeg field's payload holds (None for other codecs)."""
        if self.codec not in IMAGE_CODECS:
            return None
        return image_geometry(self.shape, self.codec_options.get("layout"))

    @property
    def native_spec(self) -> tuple:
        """Return (codec id, item size, decoded bytes, is bool[, height, width, channels, planar]) for the core."""
        spec = (self.codec_id, self.itemsize, self.nbytes, self.dtype == "bool")
        g = self.geometry
        return spec if g is None else (*spec, g.height, g.width, g.channels, g.planar)

    def to_json(self) -> dict:
        """Return the manifest's JSON form of the field."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "codec": self.codec,
            "codec_options": dict(self.codec_options),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> Field:
        """Build a field from its manifest JSON form."""
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(int(d) for d in data["shape"]),
            codec=str(data.get("codec", "raw")),
            codec_options=dict(data.get("codec_options", {})),
        )


def schema_fingerprint(fields: Sequence[Field]) -> int:
    """Return the 64-bit fingerprint of a schema that every v2 record carries (docs/FORMAT.md).

    It covers each field's name, dtype, codec and shape, in order (the record
    layout), and for png and jpeg the layout option (it decides where each
    decoded sample goes), but no other codec option: those do not change how
    a record reads.
    """
    def text(s: str) -> bytes:
        data = s.encode("utf-8")
        return struct.pack("<I", len(data)) + data

    parts = [struct.pack("<I", len(fields))]
    for f in fields:
        parts += [text(f.name), text(f.dtype), text(f.codec), struct.pack(f"<I{len(f.shape)}Q", len(f.shape), *f.shape)]
        if f.codec in IMAGE_CODECS:
            parts.append(text(str(f.codec_options.get("layout", ""))))
    return xxhash.xxh3_64_intdigest(b"".join(parts))


def binding_fingerprint(schema: int, dataset_id: str, shard: int) -> int:
    """Return what every v3 record of shard ``shard`` of dataset ``dataset_id`` carries (docs/FORMAT.md).

    XXH3-64 of the schema fingerprint (u64), the 16 bytes of the dataset id and the shard's
    index (u64): a record read with another schema, from another dataset or at another
    shard position fails the same header check that v2 made for the schema alone.
    """
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", schema) + dataset_id_bytes(dataset_id) + struct.pack("<Q", shard))


def dataset_id_bytes(dataset_id: str) -> bytes:
    """Return the 16 bytes of a dataset id (32 lowercase hex digits); raise ValueError otherwise."""
    if len(dataset_id) != 32 or any(c not in "0123456789abcdef" for c in dataset_id):
        raise ArgumentError(f"dataset id {dataset_id!r}: expected 32 lowercase hex digits")
    return bytes.fromhex(dataset_id)


def bind_key(record: bytes, key: int, binding: int | None = None) -> bytes:
    """Return ``record`` carrying ``key`` (its index within the shard) and, when given, ``binding``.

    Records are encoded before the shard they land in is known; the shard
    writer binds each to its key (v2, v3) and to its dataset and shard
    (v3: ``binding`` from :func:`binding_fingerprint`) as it stores it. v1
    records are returned unchanged.
    """
    if record[4:6] == b"\x01\x00":
        return record
    head = record[:_KEY_OFFSET] + key.to_bytes(8, "little")
    if binding is None:
        return head + record[_FINGERPRINT_OFFSET:]
    return head + binding.to_bytes(8, "little") + record[_FINGERPRINT_OFFSET + 8:]


class RecordEncoder:
    """Encodes samples of one schema into records. Not thread-safe: one per thread."""

    def __init__(self, fields: Sequence[Field], version: int = RECORD_VERSION) -> None:
        """Encode for ``fields``; versions 1 and 2 exist only so that tests can write old datasets.

        A v3 record carries the schema fingerprint until the shard writer binds it
        (:func:`bind_key`) to its dataset and shard.
        """
        if version not in READABLE_FORMAT_VERSIONS:
            raise ArgumentError(f"record version {version} is not one of {READABLE_FORMAT_VERSIONS}")
        self.fields = list(fields)
        if not 1 <= len(self.fields) <= MAX_FIELDS:
            raise SchemaMismatchError(f"a schema of {len(self.fields)} fields; a schema has 1 to {MAX_FIELDS}")
        self.version = version
        self._prefix = record_prefix(self.fields, 0, version)
        self._compressors = {
            f.name: zstandard.ZstdCompressor(level=int(f.codec_options.get("level", DEFAULT_ZSTD_LEVEL)))
            for f in self.fields
            if f.codec in ("zstd", "zstd-shuffle")
        }

    def encode(self, values: Mapping[str, np.ndarray | int | float | bool], key: int = 0) -> bytes:
        """Return the record for one sample; raise SchemaMismatchError on a wrong shape or dtype.

        ``key`` is the sample's index within its shard; :func:`bind_key` can set it later.
        """
        if set(values) != {f.name for f in self.fields}:
            raise SchemaMismatchError(
                f"sample has fields {sorted(values)}, the schema has {[f.name for f in self.fields]}"
            )
        entries = [bind_key(self._prefix, key) if key else self._prefix]
        payloads = []
        for f in self.fields:
            arr = np.asarray(values[f.name])
            if arr.shape != f.shape:
                raise SchemaMismatchError(f"field {f.name!r}: shape {arr.shape} differs from the schema's {f.shape}")
            if arr.dtype != f.np_dtype:
                if arr.dtype.kind == f.np_dtype.kind and arr.dtype.itemsize == f.itemsize:
                    arr = arr.astype(f.np_dtype)  # byte order only
                else:
                    raise SchemaMismatchError(
                        f"field {f.name!r}: dtype {arr.dtype} differs from the schema's {f.dtype}"
                    )
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            payload = self._payload(f, arr, flat)
            if f.codec in LOSSY_CODECS:  # the checksum is of what readers decode: the writer decodes its own output
                geometry = f.geometry
                assert geometry is not None
                flat = _payload.jpeg_decode(memoryview(payload), geometry)
            digest = xxhash.xxh3_64_intdigest(flat.data)
            entries.append(_ENTRY.pack(f.codec_id, len(payload), f.nbytes, digest))
            payloads.append(payload)
        return b"".join(entries + payloads)

    def _payload(self, f: Field, arr: np.ndarray, flat: np.ndarray) -> bytes:
        if f.codec == "raw":
            return flat.tobytes()
        if f.codec == "zstd":
            return self._compressors[f.name].compress(flat.data)
        if f.codec == "zstd-shuffle":
            return self._compressors[f.name].compress(shuffle_bytes(flat, f.itemsize))
        level = int(f.codec_options.get("level", 0))
        if f.codec == "lz4":
            return _payload.lz4_compress(flat.data, level)
        if f.codec == "lz4-shuffle":
            return _payload.lz4_compress(shuffle_bytes(flat, f.itemsize), level)
        geometry = f.geometry
        assert geometry is not None  # Field checked that the codec holds the field
        if f.codec == "png":
            return _payload.png_encode(arr, geometry, f.codec_options)
        return _payload.jpeg_encode(arr, geometry, f.codec_options)


def record_prefix(fields: Sequence[Field], key: int, version: int = RECORD_VERSION) -> bytes:
    """Return the fixed header that starts every record of ``fields`` (v2, v3: with ``key`` and the fingerprint)."""
    prefix = _HEADER.pack(RECORD_MAGIC, version, len(fields))
    return prefix if version == 1 else prefix + _BINDING.pack(key, schema_fingerprint(fields))


def decode_record(record: bytes | memoryview, fields: Sequence[Field], verify: bool = True, *, key: int | None = None,
                  version: int = RECORD_VERSION, fingerprint: int | None = None) -> list[np.ndarray]:
    """Decode one record into one writable array per field (in schema order).

    ``version`` is the dataset's format version; a v2 or v3 record must carry
    ``key`` (when given) and ``fingerprint``: v2 the schema's fingerprint, v3 the
    shard's :func:`binding_fingerprint` (readers always pass it); when None, the
    schema's fingerprint, which a record carries until its shard writer binds it.
    Raises RecordDecodeError with the reason when any length, codec, key,
    fingerprint, checksum or bool byte is wrong.
    """
    out = [np.empty(f.nbytes, dtype=np.uint8) for f in fields]
    decode_record_into(record, fields, out, verify, key=key, version=version, fingerprint=fingerprint)
    return [a.view(f.np_dtype).reshape(f.shape) for a, f in zip(out, fields)]


FieldLayout = tuple[int, str, int, int, bool]  # codec id, codec, decoded bytes, item size, is bool


def record_layout(fields: Sequence[Field]) -> list[FieldLayout]:
    """Return what decoding needs of each field, computed once per schema rather than per record."""
    return [(f.codec_id, f.codec, f.nbytes, f.itemsize, f.dtype == "bool") for f in fields]


def decode_record_into(record: bytes | memoryview, fields: Sequence[Field], out: Sequence[np.ndarray | None],
                       verify: bool = True, layout: Sequence[FieldLayout] | None = None, *, key: int | None = None,
                       version: int = RECORD_VERSION, fingerprint: int | None = None) -> None:
    """Decode one record into ``out``: per field a contiguous uint8 array of its decoded bytes, or None to skip it.

    Every field's header is checked, skipped or not; a skipped field's payload is neither decoded
    nor verified. ``layout`` is ``record_layout(fields)`` and ``fingerprint`` is
    ``schema_fingerprint(fields)``, passed by callers that decode many records. ``version``, ``key``
    and ``fingerprint`` as in :func:`decode_record`. Raises RecordDecodeError with the reason when
    any length, codec, key, fingerprint, checksum or bool byte is wrong.
    """
    if layout is None:
        layout = record_layout(fields)
    size = len(record)
    fixed = _HEADER.size if version == 1 else _HEADER.size + _BINDING.size
    if size < _HEADER.size:
        raise RecordDecodeError(f"record of {size} bytes is shorter than its header")
    magic, own_version, count = _HEADER.unpack_from(record, 0)
    if magic != RECORD_MAGIC:
        raise RecordDecodeError("bad magic")
    if own_version != version:
        raise RecordDecodeError(f"record version {own_version} in a version {version} dataset "
                                "(unsupported record version)")
    if count != len(layout):
        raise RecordDecodeError(f"record has {count} fields, schema has {len(layout)}")
    header = fixed + _ENTRY.size * count
    if size < header:
        raise RecordDecodeError("record truncated inside its header")
    if version >= 2:
        own_key, own_fingerprint = _BINDING.unpack_from(record, _HEADER.size)
        if key is not None and own_key != key:
            raise RecordDecodeError(f"record of key {own_key} found under key {key} (the shard's index is damaged)")
        expected = schema_fingerprint(fields) if fingerprint is None else fingerprint
        if own_fingerprint != expected:
            raise RecordDecodeError(_fingerprint_mismatch(version, own_fingerprint, expected))
    entries = []
    total = header
    for i, (codec_id, codec_name, nbytes, _itemsize, _bool) in enumerate(layout):
        start = fixed + _ENTRY.size * i
        codec, enc, dec, digest = _ENTRY.unpack_from(record, start)
        if codec != codec_id:
            raise RecordDecodeError(f"field {i}: codec {codec} differs from the schema's {codec_id}")
        if record[start + 1 : start + 4] != b"\0\0\0":
            raise RecordDecodeError(f"field {i}: reserved bytes are not zero")
        if dec != nbytes:
            raise RecordDecodeError(f"field {i}: decoded length {dec} differs from the schema's {nbytes}")
        if codec_name == "raw" and enc != dec:
            raise RecordDecodeError(f"field {i}: raw payload of {enc} bytes, expected {dec}")
        if enc > size - total:
            raise RecordDecodeError(f"field {i}: length {enc} runs past the end of the record")
        total += enc
        entries.append((enc, dec, digest))
    if total != size:
        raise RecordDecodeError(f"record has {size - total} bytes after its payloads")
    offset = header
    view = memoryview(record)
    for i, ((_id, codec_name, _nbytes, itemsize, is_bool), (enc, dec, digest), dest) in enumerate(
            zip(layout, entries, out)):
        payload = view[offset : offset + enc]
        offset += enc
        if dest is None:
            continue
        if codec_name == "raw":
            dest[:] = np.frombuffer(payload, dtype=np.uint8)
        elif codec_name == "zstd-shuffle" and itemsize > 1:
            dest[:] = unshuffle_bytes(_decompress(payload, dec, i).tobytes(), itemsize)
        elif codec_name in ("zstd", "zstd-shuffle"):
            dest[:] = _decompress(payload, dec, i)
        else:
            dest[:] = _decode_payload(fields[i], payload, dec, i)
        if verify and xxhash.xxh3_64_intdigest(dest.data) != digest:
            raise RecordDecodeError(f"field {i}: checksum mismatch")
        if is_bool and dest.size and int(dest.max()) > 1:
            at = int(np.argmax(dest > 1))
            raise RecordDecodeError(f"field {i}: bool element {at} holds byte {int(dest[at])}, not 0 or 1")


def _fingerprint_mismatch(version: int, own: int, expected: int) -> str:
    if version == 2:
        return f"written under another schema (fingerprint {own:016x}, the manifest's schema has {expected:016x})"
    return (f"written under another schema, for another dataset or for another shard position (binding "
            f"{own:016x}, this shard of this dataset expects {expected:016x}): a shard moved, copied from "
            "another dataset or rewritten while open")


def _decode_payload(f: Field, payload: memoryview, expected: int, index: int) -> np.ndarray:
    if f.codec == "raw":
        return np.frombuffer(payload, dtype=np.uint8).copy()
    if f.codec in ("zstd", "zstd-shuffle"):
        data = _decompress(payload, expected, index)
    else:
        try:
            if f.codec in ("lz4", "lz4-shuffle"):
                data = _payload.lz4_decompress(payload, expected)
            else:
                geometry = f.geometry
                assert geometry is not None
                if f.codec == "png":
                    data = _payload.png_decode(payload, geometry, f.itemsize)
                else:
                    data = _payload.jpeg_decode(payload, geometry)
        except PayloadError as err:
            raise RecordDecodeError(f"field {index}: {err}") from None
        if data.size != expected:
            raise RecordDecodeError(f"field {index}: {f.codec} payload decoded to {data.size} bytes, "
                                    f"expected {expected}")
    if f.codec.endswith("-shuffle") and f.itemsize > 1:
        data = unshuffle_bytes(data, f.itemsize)
    return data


def _decompress(payload: memoryview, expected: int, index: int) -> np.ndarray:
    try:
        content = zstandard.frame_content_size(payload)
    except zstandard.ZstdError:
        raise RecordDecodeError(f"field {index}: not a zstd frame") from None
    if content < 0:
        raise RecordDecodeError(f"field {index}: zstd frame without content size")
    if content != expected:
        raise RecordDecodeError(f"field {index}: zstd frame holds {content} bytes, expected {expected}")
    try:
        obj = zstandard.ZstdDecompressor().decompressobj()
        data = obj.decompress(payload)
        if not obj.eof:
            raise RecordDecodeError(f"field {index}: zstd frame truncated")
        if obj.unused_data:
            raise RecordDecodeError(f"field {index}: trailing bytes after the zstd frame")
    except zstandard.ZstdError as err:
        raise RecordDecodeError(f"field {index}: zstd error: {err}") from None
    if len(data) != expected:
        raise RecordDecodeError(f"field {index}: zstd frame decoded to the wrong size")
    return np.frombuffer(data, dtype=np.uint8)
