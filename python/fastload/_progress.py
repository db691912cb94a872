"""Progress of the long steps (probe, conversion, verify, upgrade, publish, bench), on a terminal or in a log.

One reporter, :class:`Progress`, used by every step that may take more than a few seconds. It
reports the same events three ways:

- **a terminal** (stderr is a TTY): a tqdm bar, as before;
- **a command's stderr without a terminal** (a job scheduler's log, ``2> log``): while a command
  line tool runs inside :func:`lines_to_stderr`, one plain line at every tenth of the work and at
  least every 10 s (``preprocess_tiles: train: 12,000/50,000 tiles (24 %), 3,100 tiles/s, ETA
  0:00:12``), a first line when the step starts and a last one when it ends. A bar redrawn with
  carriage returns is unreadable in a log file, and no output at all for minutes reads as a hang;
- **the ``fastload`` logger hierarchy** (``fastload.conversion``, ``fastload.verify``,
  ``fastload.upgrade``, ``fastload.publish``, ``fastload.bench``): the same lines, without the command's name, as INFO
  records, always (with the step's progress on). A library call prints no line to stderr unless a
  command asked for it: a program that configures logging gets them in its own log.

Counts are integers and every ratio is guarded: no division by zero at 0 %, with a total of 0 or an
unknown total (an iterable dataset: no percentage, no ETA). A resumed run starts at its ``initial``
count and its rate counts only the work of this run. Updates may come from several threads (verify's
jobs): one lock orders them. Each line is one ``write`` of a whole line, flushed, and the periodic
thread is stopped and joined before :meth:`Progress.close` returns, so a Ctrl-C leaves no half line
and no line after the command's own last words. The clock and the interval are parameters, so that
the "every 10 s" rule is tested with a clock the test moves (tests/test_progress.py).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

INTERVAL_S = 10.0  # without a terminal: a line at least this often
STEPS = 10  # ... and at every 1/STEPS of the work

_lines: list[str] = []  # the command names of the active lines_to_stderr() blocks, innermost last


@contextlib.contextmanager
def lines_to_stderr(program: str) -> Iterator[None]:
    """Within this block, progress without a terminal is printed as plain lines on stderr, prefixed ``program: ``.

    The command line tools wrap their work in it unless ``--no-progress`` is given; library calls
    made outside it print no progress line (they log it: see the module's docstring).
    """
    _lines.append(program)
    try:
        yield
    finally:
        _lines.pop()


def _plural(unit: str) -> str:
    return unit if unit == "B" or unit.endswith("s") else unit + "s"


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _byte_scale(value: float) -> tuple[float, str]:
    for scale, name in ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if value >= scale:
            return scale, name
    return 1, "B"


class Progress:
    """The progress of one step: a tqdm bar on a terminal, lines without one, INFO records on ``logger``.

    ``desc`` names what is worked on (a dataset's directory name); ``total`` is the amount of work
    (None: unknown); ``unit`` its unit (``"B"``: bytes, shown in kB/MB/GB); ``initial`` the work
    done before (a resumed run). ``enabled=False`` reports nothing at all (``--no-progress``,
    ``progress=False``). ``stream`` is the terminal or log (default: stderr); ``program`` the
    prefix of the plain lines, printed only when given or when inside :func:`lines_to_stderr`.
    ``clock`` and ``interval_s`` make the time rule testable; ``heartbeat=False`` starts no thread
    (a line is then due only when :meth:`update` or :meth:`tick` is called).
    """

    def __init__(self, desc: str, total: int | None, *, unit: str = "records", initial: int = 0,
                 enabled: bool = True, logger: str = "fastload.conversion", stream: TextIO | None = None,
                 program: str | None = None, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = INTERVAL_S, heartbeat: bool = True, leave: bool = True) -> None:
        self.desc = desc
        self.total = total if total is None or total >= 0 else 0
        self.unit = unit
        self.count = self.initial = max(0, initial)
        self.enabled = enabled
        self.log = logging.getLogger(logger)
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._interval = interval_s
        self._lock = threading.RLock()
        self._start = clock()
        self._last = self._start
        self._step = self._step_of(self.count)
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: tqdm | None = None
        self.program: str | None = None
        if not enabled:
            return
        if _isatty(self._stream):
            self._bar = tqdm(total=total, initial=self.count, unit=unit, unit_scale=unit == "B", desc=desc,
                             file=self._stream, dynamic_ncols=True, leave=leave)
        else:
            self.program = program if program is not None else (_lines[-1] if _lines else None)
        self._emit(self._line(start=True))
        if heartbeat and (self.program is not None or self.log.isEnabledFor(logging.INFO)):
            self._thread = threading.Thread(target=self._beat, name="fastload-progress", daemon=True)
            self._thread.start()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units of work done; print or log a line when one is due."""
        if not self.enabled or n == 0:
            return
        with self._lock:
            if self._closed:
                return
            self.count += n
            if self._bar is not None:
                self._bar.update(n)
            step = self._step_of(self.count)
            crossed, self._step = step > self._step, max(step, self._step)
            # The last tenth is said by close()'s line (with the time taken): not twice.
            finished = self.total is not None and self.count >= self.total
            if (crossed and step < STEPS) or (not finished and self._clock() - self._last >= self._interval):
                self._emit(self._line())

    def tick(self) -> None:
        """Print or log a line if none was for ``interval_s`` (the heartbeat thread calls this)."""
        with self._lock:
            if self.enabled and not self._closed and self._clock() - self._last >= self._interval:
                self._emit(self._line())

    def write(self, line: str, file: TextIO | None = None) -> None:
        """Print a message (a skipped file) to ``file`` (default: stdout) without breaking the bar; log it too."""
        with self._lock:
            if self._bar is not None:
                self._bar.write(line, file=file)
            else:
                print(line, file=file if file is not None else sys.stdout, flush=True)
        self.log.info("%s", line)

    def close(self, completed: bool = True) -> None:
        """End the report: a last line with the total time when ``completed``, none after an error or Ctrl-C."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            if self.enabled and completed:
                self._emit(self._line(end=True))

    def __enter__(self) -> Progress:
        """Return this reporter; leaving the block closes it (with a last line unless an exception left it)."""
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Close, with the last line only when the block ended normally."""
        self.close(completed=kind is None)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            self.tick()

    def _step_of(self, count: int) -> int:
        if self.total is None:
            return 0
        if self.total == 0:
            return STEPS
        return min(STEPS, count * STEPS // self.total)

    def _emit(self, line: str) -> None:
        """Log ``line``, and print it when this is a command's plain-line report (caller holds the lock).

        With a bar on the terminal the record is logged with the bar cleared, then the bar redrawn: a
        handler writing to the same terminal (``logging.basicConfig(level=INFO)``) does not append its
        line to the bar's.
        """
        self._last = self._clock()
        if self._bar is not None and self.log.isEnabledFor(logging.INFO):
            with self._bar.external_write_mode(file=self._stream):
                self.log.info("%s", line)
        else:
            self.log.info("%s", line)
        if self._bar is None and self.program is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr: the work goes on
                self._stream.write(f"{self.program}: {line}\n")
                self._stream.flush()

    def _amount(self, value: float) -> str:
        if self.unit != "B":
            return f"{int(value):,}"
        scale, _ = _byte_scale(self.total if self.total else value)
        return f"{value / scale:,.1f}" if scale > 1 else f"{int(value):,}"

    def _line(self, start: bool = False, end: bool = False) -> str:
        """Return ``desc: count/total unit (pct %), rate unit/s, ETA h:mm:ss`` (the parts that are known)."""
        units = _plural(self.unit)
        if self.unit == "B":
            units = _byte_scale(self.total if self.total else self.count)[1]
        done = self._amount(self.count)
        if self.total is None:
            text = f"{self.desc}: {done} {units}"
        else:
            percent = 100 if self.total == 0 else min(100, self.count * 100 // self.total)
            text = f"{self.desc}: {done}/{self._amount(self.total)} {units} ({percent} %)"
        if start:
            return text + (", resumed" if self.initial else "")
        elapsed = self._clock() - self._start
        rate = (self.count - self.initial) / elapsed if elapsed > 0 else None
        if rate is not None:
            text += f", {self._rate(rate)}"
        if end:
            return text + f", done in {_clock_text(elapsed)}"
        if rate and self.total is not None and self.count < self.total:
            text += f", ETA {_clock_text((self.total - self.count) / rate)}"
        return text

    def _rate(self, rate: float) -> str:
        if self.unit != "B":
            if 0 < rate < 1:  # slow units (a bench setting, a remote probe): the time each takes, not "0/s"
                return f"{1 / rate:,.1f} s/{self.unit[:-1] if self.unit.endswith('s') else self.unit}"
            return f"{rate:,.0f} {_plural(self.unit)}/s" if rate >= 10 else f"{rate:,.1f} {_plural(self.unit)}/s"
        scale, name = _byte_scale(rate)
        return f"{rate / scale:,.1f} {name}/s"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
