"""Measuring one epoch: samples/s, MB/s, time to first batch, peak memory and CPU of the process tree."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil


def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler:
    """Samples RSS of this process and its children every ``interval`` seconds, PSS less often.

    Reading PSS walks the page tables under the mmap lock, which stalls page
    faults in the threads being measured, so it is sampled only every
    ``pss_every`` samples.
    """

    def __init__(self, interval: float = 0.02, pss_every: int = 10) -> None:
        self.interval = interval
        self.pss_every = pss_every
        self._count = 0
        self.peak_rss = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._me = psutil.Process()

    def _sample(self) -> None:
        procs = _tree(self._me)
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)
        if self._count % self.pss_every == 0:
            self.peak_pss = max(self.peak_pss, sum(_pss_kb(p.pid) for p in procs) * 1024)
        self._count += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def cpu_seconds() -> float:
    """Return CPU seconds used by this process, its reaped children and its live children."""
    t = os.times()
    live = 0.0
    for child in _tree(psutil.Process())[1:]:
        try:
            c = child.cpu_times()
            live += c.user + c.system
        except psutil.Error:
            pass
    return t.user + t.system + t.children_user + t.children_system + live


@dataclass
class EpochResult:
    """Numbers from the rounds of one configuration; the best round counts."""

    samples: int = 0
    seconds: list[float] = field(default_factory=list)
    first_batch: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    checksum: int = 0


def run_epoch(make_iter: Callable[[], Iterable], result: EpochResult) -> None:
    """Iterate one epoch, recording its time, the time to the first batch and CPU; checks labels."""
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    samples, checksum, first = 0, 0, None
    for batch in make_iter():
        if first is None:
            first = time.perf_counter() - start
        label = batch["label"]
        samples += len(label)
        checksum += int(label.sum())
    result.seconds.append(time.perf_counter() - start)
    result.first_batch.append(first if first is not None else 0.0)
    result.cpu.append(cpu_seconds() - cpu0)
    result.samples, result.checksum = samples, checksum


def one_call_round(fn: Callable[[], object], samples: int, result: EpochResult) -> Callable[[], None]:
    """Wrap a round that delivers all its output at once (a floor, a library decode pass) for ``pedantic``.

    It records the same figures as :func:`run_epoch`: its first batch is the whole round (nothing is
    usable before the call returns), and CPU is this process's (a floor starts no thread or process).
    """
    def round_() -> None:
        cpu0 = time.process_time()
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        result.seconds.append(seconds)
        result.first_batch.append(seconds)
        result.cpu.append(time.process_time() - cpu0)
        result.samples = samples

    return round_


def extra_info(result: EpochResult, sample_bytes: int, floor_samples_per_s: float | None,
               memory: MemorySampler | None) -> dict[str, float]:
    """Return the ``extra_info`` pytest-benchmark records for one configuration.

    Every benchmark records these: samples_per_s, mb_per_s, first_batch_s, cpu_s (of the best round
    each) and, with ``memory``, peak_rss_mb and peak_pss_mb (of the whole run of the configuration).
    """
    best = min(result.seconds)
    rate = result.samples / best
    info = {"samples_per_s": rate, "mb_per_s": rate * sample_bytes / 1e6,
            "first_batch_s": min(result.first_batch), "first_batch_first_round_s": result.first_batch[0],
            "cpu_s": min(result.cpu), "ratio_to_floor": rate / floor_samples_per_s if floor_samples_per_s else 1.0}
    if memory is not None:
        info["peak_rss_mb"] = memory.peak_rss / 2**20
        info["peak_pss_mb"] = memory.peak_pss / 2**20
    return info
