"""The baseline a user would write by hand: a minimal py-lmdb map-style Dataset over the same shards.

No checksum, no validation beyond what indexing needs: ``lmdb.get`` (of the record's block in format 4,
its index read once per shard), the fixed header of each
record (docs/FORMAT.md), ``np.frombuffer`` for raw fields and one zstd call for compressed ones
(plus the byte un-shuffle for ``zstd-shuffle``),
a tensor per field per sample and DataLoader's ``default_collate``. It is the yardstick of
``ShardLoader(backend="torch")``, which must be at least as fast with the same workers.
"""

from __future__ import annotations

import bisect
import json
import struct
from pathlib import Path

import lmdb
import numpy as np
import torch
import zstandard

from fastload.format._blocks import unpack_block

_HEADER = struct.Struct("<4sHH")  # magic, version, field count
_BINDING_BYTES = 16  # format v2: the record's key and the schema fingerprint (not checked here)
_ENTRY = struct.Struct("<B3xIQQ")


class PlainLmdbDataset(torch.utils.data.Dataset):
    """``ds[i]``: a dict of field name to tensor, read with py-lmdb, never verified."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = json.loads((self.path / "manifest.json").read_text())
        self.files = [s["file"] for s in manifest["shards"]]
        self.starts = [0]
        for s in manifest["shards"]:
            self.starts.append(self.starts[-1] + s["count"])
        self.fields = [(f["name"], np.dtype(f["dtype"]), tuple(f["shape"])) for f in manifest["schema"]]
        self.envs: dict[int, lmdb.Environment] = {}
        self.packed = manifest["format_version"] >= 4
        self.spans: dict[int, list[tuple[int, int, int]]] = {}  # format 4, per shard: (block, offset, length)

    def _spans(self, shard: int, txn: lmdb.Transaction) -> list[tuple[int, int, int]]:
        """Each record's block and place in it: the blocks' headers and indexes read once per shard."""
        spans = self.spans.get(shard)
        if spans is None:
            spans, key = [], 0
            for block, (_, value) in enumerate(txn.cursor()):
                found = unpack_block(value, block, key)
                spans += [(block, offset, length) for offset, length in found]
                key += len(found)
            self.spans[shard] = spans
        return spans

    def __len__(self) -> int:
        return self.starts[-1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "envs": {}, "spans": {}}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        shard = bisect.bisect_right(self.starts, index) - 1
        env = self.envs.get(shard)
        if env is None:
            env = self.envs[shard] = lmdb.open(str(self.path / self.files[shard]), subdir=False, readonly=True,
                                               lock=False, readahead=False)
        key = index - self.starts[shard]
        with env.begin(buffers=True) as txn:
            if self.packed:  # format 4: the block holding the record, then the record's bytes in it
                block, offset, length = self._spans(shard, txn)[key]
                raw = txn.get(block.to_bytes(8, "big"))[offset:offset + length]
            else:
                raw = txn.get(key.to_bytes(8, "big"))
        _magic, version, _count = _HEADER.unpack_from(raw, 0)
        entries = _HEADER.size + (_BINDING_BYTES if version >= 2 else 0)
        offset = entries + _ENTRY.size * len(self.fields)
        out = {}
        for i, (name, dtype, shape) in enumerate(self.fields):
            codec, enc, _dec, _digest = _ENTRY.unpack_from(raw, entries + _ENTRY.size * i)
            payload = raw[offset : offset + enc]
            offset += enc
            data = np.frombuffer(bytes(payload) if codec == 0 else zstandard.decompress(payload), dtype=np.uint8)
            if codec == 2 and dtype.itemsize > 1:  # zstd-shuffle: byte k of every element stored together
                data = data.reshape(dtype.itemsize, -1).T.copy()
            out[name] = torch.from_numpy(data.view(dtype).reshape(shape).copy())
        return out
