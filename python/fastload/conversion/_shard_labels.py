"""The labels each shard holds, recorded in the manifest so that a loader can tell a dataset sorted by label.

When the schema has an integer scalar field named ``label`` and every label is in
``[0, MAX_LABEL_CLASSES)``, the writer counts each shard's labels as it writes the shard (the
counts travel in the journal, so ``--resume`` keeps them) and the manifest gets
``shard_labels``: the dataset's count per label and, per shard, the set of labels it holds as a
bit mask (docs/FORMAT.md). ``ShardLoader(shuffle_window=...)`` reads it to measure how many
classes a window of shards holds, without opening a shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..format._manifest_check import LABEL_FIELD, MAX_LABEL_CLASSES
from ..format._record import Field, decode_record_into, record_layout, schema_fingerprint

__all__ = ["label_field", "label_histogram", "shard_labels_doc"]


def label_field(fields: Sequence[Field]) -> int | None:
    """Return the position of the schema's integer scalar ``label`` field, or None."""
    for i, f in enumerate(fields):
        if f.name == LABEL_FIELD and f.shape == () and f.np_dtype.kind in "iu":
            return i
    return None


def label_histogram(fields: Sequence[Field], records: Sequence[bytes]) -> list[int] | None:
    """Return how many of ``records`` hold each label (index = label), or None when it is not recorded.

    None: the schema has no integer ``label`` field, or a label lies outside
    ``[0, MAX_LABEL_CLASSES)``. The records are those the writer encoded (before the shard binds
    them); only the label field's payload is decoded.
    """
    at = label_field(fields)
    if at is None:
        return None
    layout = record_layout(fields)
    fingerprint = schema_fingerprint(fields)
    dtype = fields[at].np_dtype
    buffer = np.empty(dtype.itemsize, dtype=np.uint8)
    out: list[np.ndarray | None] = [None] * len(fields)
    out[at] = buffer
    counts = [0] * MAX_LABEL_CLASSES
    for record in records:
        decode_record_into(record, fields, out, verify=False, layout=layout, fingerprint=fingerprint)
        label = int(buffer.view(dtype)[0])
        if not 0 <= label < MAX_LABEL_CLASSES:
            return None
        counts[label] += 1
    while counts and counts[-1] == 0:
        counts.pop()
    return counts


def shard_labels_doc(histograms: Sequence[Any]) -> dict[str, Any] | None:
    """Return the manifest's ``shard_labels`` from each shard's histogram, or None when one shard has none."""
    if not histograms or any(not isinstance(h, list) or not h for h in histograms):
        return None
    classes = max(len(h) for h in histograms)
    counts = [0] * classes
    masks = []
    for h in histograms:
        mask = 0
        for label, n in enumerate(h):
            counts[label] += n
            if n:
                mask |= 1 << label
        masks.append(format(mask, "x"))
    return {"field": LABEL_FIELD, "counts": counts, "masks": masks}
