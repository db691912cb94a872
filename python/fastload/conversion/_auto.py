"""``codec="auto"``: try every codec that fits a field on a sample of its data and pick one by a stated rule.

Each candidate (the codecs that can hold the field; jpeg only with
``lossy_ok``) encodes the sample with its default settings; we measure the
ratio (decoded bytes over payload bytes), the encoding speed, and the native
decoder's single-thread speed over the encoded records (checksums verified,
as the loader does). The rule, by ``prefer``:

- ``size``: the smallest output.
- ``balanced`` (default): the smallest output among the codecs that decode at
  least ``BALANCED_FRACTION`` (5 %) of raw's speed measured in the same run
  (raw's single-thread decode is a memcpy and a checksum, about 10 GB/s on
  the development machine: zstd qualifies, png's 50 to 300 MB/s does not).
- ``speed``: the smallest output among the codecs that decode at least
  ``SPEED_FRACTION`` (50 %) of raw's speed (lz4 and lz4-shuffle, typically).

Raw always qualifies, so data that does not compress (noise) stays raw. Sizes
within 1 % count as equal and the faster codec wins, except that raw wins any
tie it is in: a codec must shrink the data by more than 1 % to be picked
over raw, whatever the measured speeds (so noise stays raw under any load,
sanitizers included). The sizes are
deterministic; the speeds are measured, so on a loaded machine a ``balanced``
or ``speed`` choice near a threshold can differ between runs: the choice and
every measurement are recorded (manifest ``provenance.codec_choice``), and
naming the chosen codec reproduces the dataset byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _extension
from ..errors import ArgumentError
from ..format._codecs import LOSSY_CODECS, default_options, fitting_codecs
from ..format._record import RECORD_VERSION, Field, RecordEncoder, decode_record, schema_fingerprint

PREFERENCES = ("speed", "size", "balanced")
BALANCED_FRACTION = 0.05
SPEED_FRACTION = 0.50
SAMPLE_BYTES = 8 << 20  # at most this many decoded bytes of samples are tried
MAX_SAMPLES = 64
_HEADER_BYTES = 48  # a one-field v2 record's header and entry


@dataclass(frozen=True)
class Trial:
    """One candidate codec measured on the sample."""

    codec: str
    ratio: float  # decoded bytes over payload bytes
    encode_mb_s: float
    decode_mb_s: float  # one thread, checksums verified

    def to_json(self) -> dict[str, Any]:
        """Return the manifest's JSON form of the measurement."""
        return {"codec": self.codec, "ratio": round(self.ratio, 4), "encode_mb_s": round(self.encode_mb_s, 1),
                "decode_mb_s": round(self.decode_mb_s, 1)}


@dataclass(frozen=True)
class Choice:
    """The codec auto picked for one field, why, and everything it measured."""

    field: Field
    prefer: str
    trials: tuple[Trial, ...]
    samples: int
    decoder: str  # "native" or "python": whose decode speed was measured

    def to_json(self) -> dict[str, Any]:
        """Return the record kept in the manifest's provenance."""
        return {"chosen": self.field.codec, "codec_options": dict(self.field.codec_options), "prefer": self.prefer,
                "rule": rule_text(self.prefer), "samples": self.samples, "decoder": self.decoder,
                "trials": [t.to_json() for t in self.trials]}

    def summary(self) -> str:
        """Return one line for the command's output."""
        tried = ", ".join(f"{t.codec} {t.ratio:.2f}x {t.decode_mb_s:.0f} MB/s" for t in self.trials)
        return f"codec auto ({self.prefer}) for {self.field.name!r}: {self.field.codec} (tried {tried})"


def rule_text(prefer: str) -> str:
    """Return the rule ``prefer`` applies, in words."""
    if prefer == "size":
        return "smallest output"
    fraction = BALANCED_FRACTION if prefer == "balanced" else SPEED_FRACTION
    return f"smallest output among codecs decoding at least {fraction:.0%} of raw's speed"


def pick(trials: Sequence[Trial], prefer: str) -> Trial:
    """Apply the rule of ``prefer`` to measured trials (raw among them); pure, so tests can check it."""
    if prefer not in PREFERENCES:
        raise ArgumentError(f"prefer must be one of {PREFERENCES}, not {prefer!r}")
    raw = next(t for t in trials if t.codec == "raw")
    floor = {"size": 0.0, "balanced": BALANCED_FRACTION, "speed": SPEED_FRACTION}[prefer] * raw.decode_mb_s
    eligible = [t for t in trials if t.decode_mb_s >= floor or t.codec == "raw"]
    best_ratio = max(t.ratio for t in eligible)
    close = [t for t in eligible if t.ratio >= best_ratio / 1.01]
    if any(t.codec == "raw" for t in close):
        return raw
    return max(close, key=lambda t: t.decode_mb_s)


def sample_indices(n: int, sample_bytes: int) -> np.ndarray:
    """Return evenly spaced indices of at most MAX_SAMPLES samples and about SAMPLE_BYTES bytes."""
    count = max(1, min(n, MAX_SAMPLES, SAMPLE_BYTES // max(sample_bytes, 1)))
    return np.unique(np.linspace(0, n - 1, count).astype(np.int64))


def choose_codec(name: str, samples: np.ndarray, layout: str | None = None, prefer: str = "balanced",
                 lossy_ok: bool = False) -> Choice:
    """Try the codecs that fit ``samples`` (shape ``[n, *field shape]``) and return the field auto picks."""
    if prefer not in PREFERENCES:
        raise ArgumentError(f"prefer must be one of {PREFERENCES}, not {prefer!r}")
    dtype, shape = samples.dtype, tuple(samples.shape[1:])
    from ..format._dtypes import dtype_name

    dname = dtype_name(dtype)
    codecs = [c for c in fitting_codecs(dname, shape, layout) if lossy_ok or c not in LOSSY_CODECS]
    if samples.dtype.itemsize == 1:  # the shuffle is the identity: the same bytes as the plain codec
        codecs = [c for c in codecs if not c.endswith("-shuffle")]
    trials, fields, decoder = [], {}, "python"
    for codec in codecs:
        field = Field(name, dname, shape, codec, default_options(codec, layout=layout if len(shape) == 3 else None))
        trial, decoder = _measure(field, samples)
        trials.append(trial)
        fields[codec] = field
    chosen = pick(trials, prefer)
    return Choice(fields[chosen.codec], prefer, tuple(trials), len(samples), decoder)


def _measure(field: Field, samples: np.ndarray) -> tuple[Trial, str]:
    encoder = RecordEncoder([field])
    start = time.perf_counter()
    records = [encoder.encode({field.name: s}) for s in samples]
    encode_s = time.perf_counter() - start
    decoded = field.nbytes * len(samples)
    payload = sum(len(r) - _HEADER_BYTES for r in records)
    decode_s, decoder = _decode_seconds(field, records)
    mb = decoded / 1e6
    trial = Trial(field.codec, decoded / max(payload, 1), mb / max(encode_s, 1e-9), mb / max(decode_s, 1e-9))
    return trial, decoder


def _decode_seconds(field: Field, records: list[bytes]) -> tuple[float, str]:
    """Return the best of a few timed single-thread decodes of all records."""
    _native = _extension.native
    best = float("inf")
    if _native is not None:
        blob = np.frombuffer(b"".join(records), dtype=np.uint8)
        offsets = np.cumsum([0] + [len(r) for r in records], dtype=np.uint64)
        out = np.empty(max(field.nbytes * len(records), 1), dtype=np.uint8)
        fingerprint = schema_fingerprint([field])
        for _ in range(5):
            start = time.perf_counter()
            _native.decode_records(blob, offsets, [field.native_spec], [out], True, RECORD_VERSION, fingerprint)
            best = min(best, time.perf_counter() - start)
        return best, "native"
    for _ in range(2):
        start = time.perf_counter()
        for r in records:
            decode_record(r, [field])
        best = min(best, time.perf_counter() - start)
    return best, "python"
