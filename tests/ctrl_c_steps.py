"""Test seam: a Ctrl-C in place of this process's k-th file-system step (``os.replace``, ``os.unlink``, ...).

A run interrupted at each step in turn, then resumed, covers every point between two steps where a
real Ctrl-C can land: the tests that use it find the windows a timed signal hits once in hundreds of runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

FILE_STEPS = ("replace", "rename", "unlink", "fsync", "mkdir", "rmdir", "link")


@contextlib.contextmanager
def ctrl_c_at_step(k: int) -> Iterator[list[int]]:
    """Raise KeyboardInterrupt in place of the ``k``-th call of ``FILE_STEPS`` in this process.

    Yields a list holding the number of calls made, final once the block ends: fewer than ``k`` means the
    run ended before its ``k``-th step (every step was interrupted once).
    """
    originals = {name: getattr(os, name) for name in FILE_STEPS}
    taken = [0]

    def counted(step):
        def call(*args, **kwargs):
            taken[0] += 1
            if taken[0] == k:
                raise KeyboardInterrupt
            return step(*args, **kwargs)
        return call

    for name, step in originals.items():
        setattr(os, name, counted(step))
    try:
        yield taken
    finally:
        for name, step in originals.items():
            setattr(os, name, step)


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def interrupt_each_step(write: Callable[[Path], object], resume: Callable[[Path], object], root: Path,
                        expected: dict[str, bytes]) -> int:
    """Interrupt ``write(out)`` at its first step, then at its second, ... (a new ``out`` under ``root`` each
    time) until a run ends before its ``k``-th step; after each, ``resume(out)`` must leave exactly the files
    of ``expected``, the shards byte for byte. Return how many steps a run takes."""
    k = 0
    while True:
        k += 1
        out = root / f"out{k}"
        with ctrl_c_at_step(k) as taken:
            try:
                write(out)
            except KeyboardInterrupt:  # a writer that lets it through (an API, or a CLI outside its handler)
                pass
        if taken[0] < k:
            return k - 1
        resume(out)
        got = files_of(out)
        assert sorted(got) == sorted(expected), f"interrupted at step {k}"
        assert all(got[name] == expected[name] for name in expected if name.endswith(".lmdb")), \
            f"interrupted at step {k}"
