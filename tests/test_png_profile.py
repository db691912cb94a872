"""One definition of a valid png payload: every reader decodes with the native core's libspng.

Issue 22 items 5 and 7: the pure-Python path (Pillow for 8-bit, pypng for 16-bit) accepted payloads
the native reader refused (and the reverse), and inflated a zlib bomb in full. Now ShardDataset,
``backend="torch"`` and ``fastload verify`` decode through the extension: for each crafted payload
below (its field checksum re-hashed to what the permissive Pillow/pypng decode gives, so only the
decoder decides), every reader refuses it with the same CorruptRecordError naming the shard and the
record, or every reader delivers the same bytes.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash
from shard_edit import read_records, replace_record

import fastload
from fastload.errors import CorruptRecordError
from fastload.format import _payload
from fastload.format._manifest import HASH_ALGORITHM, load_manifest
from fastload.format._verify import verify_dataset

ENTRY_AT = 24  # the first field entry of a v2-v4 record: codec u8, 3 reserved, encoded u32, decoded u64, xxh3 u64


def chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk (its CRC computed unless given)."""
    crc = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def chunks(payload: bytes) -> list[tuple[bytes, bytes]]:
    """The (kind, data) chunks of a PNG."""
    out, at = [], 8
    while at < len(payload):
        (length,) = struct.unpack_from(">I", payload, at)
        out.append((payload[at + 4:at + 8], payload[at + 8:at + 8 + length]))
        at += 12 + length
    return out


def build(parts: list[bytes]) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"".join(parts)


def raw_rows(payload: bytes) -> bytes:
    return zlib.decompress(b"".join(data for kind, data in chunks(payload) if kind == b"IDAT"))


def crafted(payload: bytes, row_bytes: int) -> dict[str, bytes]:
    """Payloads with lying or damaged structure, made from a valid ``payload``."""
    parts = chunks(payload)
    ihdr = next(d for k, d in parts if k == b"IHDR")
    rows = raw_rows(payload)
    idat = zlib.compress(rows)
    cases = {}
    method = bytearray(ihdr)
    method[10] = 1  # compression method 1 (only 0 exists)
    cases["compression method 1"] = build([chunk(b"IHDR", bytes(method)), chunk(b"IDAT", idat), chunk(b"IEND", b"")])
    cases["IDAT one row short"] = build([chunk(b"IHDR", ihdr), chunk(b"IDAT", zlib.compress(rows[:-(row_bytes + 1)])),
                                         chunk(b"IEND", b"")])
    cases["two IHDR"] = build([chunk(b"IHDR", ihdr), chunk(b"IHDR", ihdr), chunk(b"IDAT", idat), chunk(b"IEND", b"")])
    whole = build([chunk(b"IHDR", ihdr), chunk(b"IDAT", idat), chunk(b"IEND", b"")])
    long_idat = bytearray(whole)
    struct.pack_into(">I", long_idat, 33, len(idat) + 1000)  # the IDAT's length points past the end
    cases["chunk length past the end"] = bytes(long_idat)
    cases["unknown critical chunk"] = build([chunk(b"IHDR", ihdr), chunk(b"ABCD", b"x" * 8), chunk(b"IDAT", idat),
                                             chunk(b"IEND", b"")])
    cases["damaged IDAT CRC"] = build([chunk(b"IHDR", ihdr), chunk(b"IDAT", idat, crc=zlib.crc32(b"IDAT" + idat) ^ 1),
                                       chunk(b"IEND", b"")])
    cases["damaged IEND CRC"] = build([chunk(b"IHDR", ihdr), chunk(b"IDAT", idat), chunk(b"IEND", b"", crc=7)])
    ztxt = b"comment\x00\x00" + zlib.compress(b"\x00" * (8 << 20))
    cases["zTXt bomb"] = build([chunk(b"IHDR", ihdr), chunk(b"zTXt", ztxt), chunk(b"IDAT", idat), chunk(b"IEND", b"")])
    cases["IDAT bomb"] = build([chunk(b"IHDR", ihdr), chunk(b"IDAT", zlib.compress(rows + b"\x00" * (16 << 20))),
                                chunk(b"IEND", b"")])
    return cases


def reference_decode(payload: bytes, field) -> bytes | None:
    """What the old pure-Python path (Pillow, pypng) made of ``payload``, or None when it refused it."""
    try:
        return _payload.png_decode(memoryview(payload), field.geometry, field.itemsize).tobytes()
    except Exception:  # noqa: BLE001 - any refusal of the reference decoder
        return None


def write_with_payload(root: Path, images: np.ndarray, payload_for_0, rehash: bool = True) -> tuple[Path, object]:
    """A one-shard png dataset whose record 0 carries ``payload_for_0(valid payload)``, checksum re-hashed
    to the reference decoder's output (when it decodes, and ``rehash``)."""
    fastload.write_arrays(root, {"x": images}, codec="png")
    field = load_manifest(root).fields[0]
    shard = root / "shard-00000.lmdb"
    record = read_records(shard)[0]
    payload = payload_for_0(record[ENTRY_AT + 24:])
    entry = bytearray(record[ENTRY_AT:ENTRY_AT + 24])
    struct.pack_into("<I", entry, 4, len(payload))
    reference = reference_decode(payload, field) if rehash else None
    if reference is not None:  # only the decoder decides: the checksum matches the permissive decode
        struct.pack_into("<Q", entry, 16, xxhash.xxh3_64_intdigest(reference))
    replace_record(shard, 0, record[:ENTRY_AT] + bytes(entry) + payload)  # its block re-encoded around it
    manifest = root / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["shards"][0]["bytes"] = shard.stat().st_size
    doc["shards"][0]["hash"] = f"{HASH_ALGORITHM}:{xxhash.xxh3_128(shard.read_bytes()).hexdigest()}"
    manifest.write_text(json.dumps(doc))
    return root, field


def outcomes(root: Path) -> dict[str, object]:
    """Each reader's result for record 0: its bytes, or the CorruptRecordError's (record, reason)."""
    results: dict[str, object] = {}
    readers = {
        "native": lambda: next(iter(fastload.ShardLoader(root, batch_size=1, backend="native")))["x"],
        "torch": lambda: next(iter(fastload.ShardLoader(root, batch_size=1, backend="torch", num_workers=0)))["x"],
        "dataset": lambda: fastload.ShardDataset(root)[0]["x"],
    }
    for name, read in readers.items():
        try:
            results[name] = read().numpy().tobytes()
        except CorruptRecordError as err:
            assert "shard-00000.lmdb" in err.path, (name, err)
            results[name] = (err.record, err.reason)
    report = verify_dataset(root)
    results["verify"] = [p for p in report.problems if "record 0" in p]
    return results


@pytest.mark.parametrize("dtype,shape", [("uint8", (3, 12, 12)), ("uint16", (12, 12))])
def test_crafted_png_payloads_get_one_verdict_from_every_reader(tmp_path: Path, dtype: str, shape) -> None:
    images = (np.arange(4 * int(np.prod(shape))) % 200).astype(dtype).reshape(4, *shape)
    row_bytes = shape[-1] * np.dtype(dtype).itemsize * (shape[0] if len(shape) == 3 else 1)
    probe, _ = write_with_payload(tmp_path / "probe", images, lambda p: p)
    valid = fastload.ShardDataset(probe)[0]["x"].numpy()
    assert np.array_equal(valid, images[0])
    disagreements = []
    reference_accepted_native_refused = []
    for i, name in enumerate(crafted_names()):
        root, field = write_with_payload(tmp_path / f"case{i}", images,
                                         lambda p, name=name: crafted(p, row_bytes)[name])
        got = outcomes(root)
        verdicts = {k: v for k, v in got.items() if k != "verify"}
        if len({repr(v) for v in verdicts.values()}) != 1:
            disagreements.append((name, verdicts))
            continue
        verdict = verdicts["dataset"]
        if isinstance(verdict, tuple):  # refused: by every reader, for record 0, and verify reports it
            assert verdict[0] == 0, (name, verdict)
            assert got["verify"], (name, "verify found nothing the readers refuse")
            if reference_decode(_first_payload(root), field) is not None:
                reference_accepted_native_refused.append(name)
        else:
            assert not got["verify"], (name, got["verify"])
    assert not disagreements, disagreements
    # Payloads the old Pillow/pypng path accepted now get the one native verdict in every reader.
    assert reference_accepted_native_refused, "no crafted case separates the decoders"


def crafted_names() -> list[str]:
    return list(crafted(build([chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)),
                               chunk(b"IDAT", zlib.compress(b"\x00\x00")), chunk(b"IEND", b"")]), 1))


def _first_payload(root: Path) -> bytes:
    return read_records(root / "shard-00000.lmdb")[0][ENTRY_AT + 24:]


BOMB_SCRIPT = textwrap.dedent("""
    import resource, sys
    import fastload
    from fastload.errors import CorruptRecordError
    root, reader = sys.argv[1], sys.argv[2]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        if reader == "dataset":
            fastload.ShardDataset(root)[0]
        elif reader == "verify":
            from fastload.format._verify import verify_dataset
            report = verify_dataset(root)
            if report.problems:
                raise CorruptRecordError(root, 0, "; ".join(report.problems))
        else:
            next(iter(fastload.ShardLoader(root, batch_size=1, backend=reader, num_workers=0)))
        print("DECODED")
    except CorruptRecordError as err:
        print("REFUSED", err)
    print("GROWTH_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
""")


@pytest.fixture(scope="module")
def png_bomb_dataset(tmp_path_factory) -> Path:
    """A 16-bit png dataset whose record 0's IDAT carries 128 MiB of zeros after its 12x12 image."""
    images = (np.arange(4 * 144) % 200).astype("uint16").reshape(4, 12, 12)

    def bomb(payload: bytes) -> bytes:
        ihdr = next(d for k, d in chunks(payload) if k == b"IHDR")
        stream = zlib.compressobj(1)
        data = stream.compress(raw_rows(payload))
        zeros = b"\x00" * (16 << 20)
        for _ in range(8):
            data += stream.compress(zeros)
        data += stream.flush()
        return build([chunk(b"IHDR", ihdr), chunk(b"IDAT", data), chunk(b"IEND", b"")])

    # The image rows are the original ones: the record's checksum stays valid (and pypng would take 20 s).
    root, _ = write_with_payload(tmp_path_factory.mktemp("bomb") / "ds", images, bomb, rehash=False)
    return root


@pytest.mark.parametrize("reader", ["dataset", "torch", "native", "verify"])
def test_png_zlib_bomb_is_never_inflated_past_the_image(png_bomb_dataset: Path, reader: str) -> None:
    """libspng stops at the image (the sample is the image's; pypng inflated the whole stream, 1.4 GB for
    200 MiB): the process's peak memory grows by far less than the bomb, in every reader and in verify."""
    proc = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(png_bomb_dataset), reader], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DECODED" in proc.stdout, proc.stdout  # the image itself is whole, and its checksum matches
    growth_kb = int(proc.stdout.split("GROWTH_KB")[1])
    assert growth_kb < 48 * 1024, proc.stdout  # the stream inflates to 128 MiB
