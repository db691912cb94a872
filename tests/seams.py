"""Test seams: slow native reads, so lifecycle tests can catch a pass with batches in flight.

The product has no delay option. ``fastload._native._testing.set_read_delay`` (a test-only entry
of the extension) makes one reader's workers sleep before each record read, and ``set_disk_reads``
makes it take those slow reads for reads from disk (a real one needs pages out of the page cache,
which a test cannot arrange under a mapping); this module applies
it to every ``BatchReader`` the native backend makes while installed, by standing a subclass in
for ``fastload._native.BatchReader``.
"""

from __future__ import annotations

from typing import Any

from fastload import _native

_ORIGINAL = _native.BatchReader


def slow_reader_class(delay_us: int, disk: bool = False) -> type:
    """Return a ``BatchReader`` whose workers sleep ``delay_us`` before each record read.

    ``disk``: and take each slow chunk for one that waited for the disk (``set_disk_reads``).
    """

    class SlowBatchReader(_ORIGINAL):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _native._testing.set_read_delay(self, delay_us)
            _native._testing.set_disk_reads(self, disk)

    return SlowBatchReader


def install_slow_reads(delay_us: int) -> None:
    """For the rest of this process (a test's subprocess): native readers made from now on are slow."""
    _native.BatchReader = slow_reader_class(delay_us)
