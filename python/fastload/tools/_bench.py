"""``fastload bench DIR``: sweep thread counts over a dataset and recommend one."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .._progress import Progress
from ..loading._loader import ShardLoader


@dataclass(frozen=True)
class SweepRow:
    """Throughput of one thread count."""

    threads: int
    samples_per_s: float
    mb_per_s: float
    wait_share: float
    bottleneck: str | None


def sweep(path: str | os.PathLike, batch_size: int = 256, max_batches: int | None = None,
          threads: list[int] | None = None, progress: bool = True) -> list[SweepRow]:
    """Time a shuffled pass (up to ``max_batches``) for each thread count; the best of two passes counts.

    ``progress``: the settings done, as a bar on a terminal, lines in a command's log and INFO records
    of the ``fastload.bench`` logger (docs/conversion.md, "Progress").
    """
    path = Path(path)
    counts = threads or list(range(1, (os.cpu_count() or 1) + 1))
    rows = []
    with Progress(f"bench {path.name}", len(counts), unit="settings", enabled=progress, logger="fastload.bench") as bar:
        for t in counts:
            rows.append(_measure(path, t, batch_size, max_batches))
            bar.update(1)
    return rows


def _measure(path: Path, t: int, batch_size: int, max_batches: int | None) -> SweepRow:
    """Return the throughput of ``t`` threads: the best of two shuffled passes."""
    loader = ShardLoader(path, batch_size=batch_size, shuffle=True, num_threads=t, backend="native")
    sample_bytes = sum(f.nbytes for f in loader.dataset.fields)
    best, stats = 0.0, {}
    for _ in range(2):
        loader.set_epoch(0)
        start, samples = time.perf_counter(), 0
        it = iter(loader)
        for b, batch in enumerate(it):
            samples += len(next(iter(batch.values())))
            if max_batches is not None and b + 1 >= max_batches:
                break
        rate = samples / max(time.perf_counter() - start, 1e-9)
        if rate >= best:
            best, stats = rate, loader.stats()
        del it
    return SweepRow(t, best, best * sample_bytes / 1e6, stats.get("wait_share", 0.0), stats.get("bottleneck"))


def recommend(rows: list[SweepRow], tolerance: float = 0.05) -> int:
    """Return the fewest threads within ``tolerance`` of the best throughput."""
    best = max(r.samples_per_s for r in rows)
    return min(r.threads for r in rows if r.samples_per_s >= (1 - tolerance) * best)


def format_sweep(rows: list[SweepRow]) -> str:
    """Return the sweep as a text table with the recommendation."""
    lines = [f"{'threads':>7}  {'samples/s':>12}  {'MB/s':>9}  {'consumer wait':>13}  bottleneck"]
    for r in rows:
        lines.append(f"{r.threads:>7}  {r.samples_per_s:>12,.0f}  {r.mb_per_s:>9,.1f}  {r.wait_share:>12.0%}  "
                     f"{r.bottleneck}")
    lines.append(f"recommended: num_threads={recommend(rows)}")
    return "\n".join(lines)
