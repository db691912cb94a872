"""The samples one task of a shuffled write encodes: grouped by source (each read once), placed back in order."""

from __future__ import annotations

import numpy as np

from ..errors import ImageReadError, PreprocessError


class PickedReadError(ImageReadError):
    """Files of one task of a shuffled write that could not be read: the first as an ImageReadError, all in ``errors``.

    A task reads several files; each one that fails is listed, as a source-order run lists them.
    """

    def __init__(self, errors: list[ImageReadError]) -> None:
        super().__init__(errors[0].path, errors[0].reason)
        self.errors = list(errors)

    def __reduce__(self):  # crosses process boundaries from the encoding workers
        return (type(self), (self.errors,))


def each_error(error: ImageReadError) -> list[ImageReadError]:
    """Return the read errors ``error`` stands for: a PickedReadError's each, else itself."""
    return list(error.errors) if isinstance(error, PickedReadError) else [error]


def raise_read_errors(errors: list[ImageReadError]) -> None:
    """Raise the read errors of a task (one as it is, several as a PickedReadError); nothing when there are none."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise PickedReadError(errors)


def group_by_source(sources: np.ndarray, samples: np.ndarray) -> list[tuple[int, list[int], list[int]]]:
    """Return, per source in increasing order, (source, its samples in increasing order, their slots in the input).

    A task reads each source once and puts each sample's record at its slot.
    """
    order = np.lexsort((samples, sources))
    groups: list[tuple[int, list[int], list[int]]] = []
    for slot in order.tolist():
        source, sample = int(sources[slot]), int(samples[slot])
        if groups and groups[-1][0] == source:
            groups[-1][1].append(sample)
            groups[-1][2].append(slot)
        else:
            groups.append((source, [sample], [slot]))
    return groups


def place(parts: list[tuple[list[int], list[bytes]]], n: int) -> list[bytes]:
    """Return the records of ``parts`` ((slots, records) per source) at their slots: ``n`` records in position order."""
    out: list[bytes | None] = [None] * n
    for slots, records in parts:
        if len(records) != len(slots):
            raise PreprocessError(f"{len(records)} records for {len(slots)} samples (did a source change since it "
                                  "was probed?)")
        for slot, record in zip(slots, records):
            out[slot] = record
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise PreprocessError(f"no record for position {missing[0]} of the task (a fastload bug: please report it)")
    return out  # type: ignore[return-value]
