"""How many shard downloads run at once: as few as give the link its full rate, so shards arrive in need order.

A streamed epoch (``shuffle_window``) reads shards in the order the plan needs them, each once it is
whole. Downloads that share one bottleneck (a link, a server's cores) share its rate: eight at once all
end near the end, and the reader waits for the last of them before it reads the first. Downloads that
each have a rate of their own (object stores serve each connection at about 100 MB/s, and the link
is many times that) need many at once to use the link. Which of the two a store is cannot be known in
advance, so :class:`DownloadConcurrency` measures it: it starts with a few downloads, adds one while
one more raises the aggregate rate by at least half of what an independent connection would add
(``(n + 1) / n``), and goes back when the one added did not. Started high (a first batch that reads
many shards), it tries one fewer at a time, down to 2, while the fewer give as much. A level above
the limit that did not help is tried again after ``retry_s``: the link or the store's load may have
changed. A level's rate is the running mean of its readings, dropped when none came for ``retry_s``:
one slow window (an outage, connections starting, a queue draining) does not hold the limit high or
low for good.

Each process tunes its own downloads. Ranks on one node whose link is shared fairly per connection
each see their own rate rise with one more connection (taken from the others), so they may each
climb to the ceiling: as many at once as before the number was measured (8 per process), no more.

Pure policy: the fetcher (``storage/_fetcher.py``) reports the bytes received and the downloads
running; nothing here blocks, sleeps or reads a clock of its own.
"""

from __future__ import annotations

from ..errors import ArgumentError

WINDOW_S = 0.2  # a rate is measured over at least this long ...
WINDOW_BYTES = 32 << 20  # ... and this many bytes (4 of the downloads' 8 MiB chunks)
RETRY_S = 10.0  # a level's reading expires after this long (one that did not help is then tried again)


class DownloadConcurrency:
    """The number of downloads to run at once, tuned by the aggregate rate each number gave."""

    def __init__(self, most: int, start: int = 2, window_s: float = WINDOW_S, window_bytes: int = WINDOW_BYTES,
                 retry_s: float = RETRY_S) -> None:
        """``most``: the ceiling (the fetcher's threads); ``start``: the limit before anything is measured."""
        if not (window_s > 0 and window_bytes > 0 and retry_s > 0):
            raise ArgumentError(f"DownloadConcurrency: window_s, window_bytes and retry_s must be positive, not "
                                f"{window_s}, {window_bytes}, {retry_s}")
        self.most = max(1, int(most))
        self.limit = min(self.most, max(1, int(start)))
        self._window_s, self._window_bytes, self._retry_s = window_s, window_bytes, retry_s
        self._rates: dict[int, tuple[float, float]] = {}  # downloads at once -> (bytes/s, when measured)
        self._start: tuple[float, int] | None = None  # the window's (time, bytes received)
        self._last: tuple[float, int] = (0.0, 0)  # the previous report's (time, downloads running)
        self._busy_s = 0.0  # seconds of the window with at least ``limit`` downloads running

    def rates(self) -> dict[int, float]:
        """Return the aggregate rate (bytes/s) measured for each number of downloads at once."""
        return {n: rate for n, (rate, _) in sorted(self._rates.items())}

    def start(self, at_least: int) -> None:
        """Raise the limit to ``at_least`` (capped at ``most``) before anything is measured: a pass's first batch."""
        if not self._rates:
            self.limit = min(self.most, max(self.limit, int(at_least)))

    def report(self, now: float, received: int, running: int) -> bool:
        """Take note that ``received`` bytes have arrived in all by ``now``, with ``running`` downloads from now on.

        Call it when a chunk arrives and when a download starts or ends. Returns whether the limit
        changed. A window counts only when downloads ran at the limit for most of it (a queue that ran
        short says nothing about the link).
        """
        last_time, last_running = self._last
        if self._start is not None and last_running >= self.limit:
            self._busy_s += now - last_time
        self._last = (now, running)
        if self._start is None:
            if running > 0:
                self._start, self._busy_s = (now, received), 0.0
            return False
        began, base = self._start
        seconds, size = now - began, received - base
        if seconds < self._window_s or size < self._window_bytes:  # (seconds > 0 from here on)
            if running == 0:  # idle: the next window starts with the next download
                self._start = None
            return False
        at_limit = self._busy_s >= 0.8 * seconds
        self._start, self._busy_s = ((now, received), 0.0) if running > 0 else (None, 0.0)
        if not at_limit:
            return False
        # The mean of the recent readings (a reading older than retry_s is dropped): one slow window (an
        # outage, connections starting, a queue draining after the limit fell) is soon outweighed.
        old = self._rates.get(self.limit)
        fresh = old is not None and now - old[1] <= self._retry_s
        self._rates[self.limit] = (0.5 * (old[0] + size / seconds) if fresh and old else size / seconds, now)
        return self._adjust(now)

    def _adjust(self, now: float) -> bool:
        n = self.limit
        for level in [k for k, (_, when) in self._rates.items() if k != n and now - when > self._retry_s]:
            del self._rates[level]  # measured long ago: the link may have changed since (tried again)
        if n > 1 and n - 1 in self._rates and not self._helped(n - 1, n):
            self.limit = n - 1  # the last one added did not help
        elif n < self.most and (n + 1 not in self._rates or self._helped(n, n + 1)):
            self.limit = n + 1  # one more may help, or did
        elif n > 2 and n - 1 not in self._rates:
            self.limit = n - 1  # started high (a first batch of many shards): do fewer give as much?
        return self.limit != n

    def _helped(self, fewer: int, more: int) -> bool:
        """Return whether ``more`` downloads at once gave at least half the gain independent connections would."""
        expected = self._rates[fewer][0] * (1.0 + 0.5 * (more - fewer) / fewer)
        return self._rates[more][0] >= expected
