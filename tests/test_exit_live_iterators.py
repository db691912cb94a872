"""Interpreter exit with live loader iterators in other threads: exit status 0, every time.

CPython (<= 3.13) ends a thread that wants the GIL back once the interpreter finalizes with
pthread_exit; a forced unwind through a C++ destructor (a GIL-release scope ending) aborts the
process ("terminate called without an active exception", status 134). Each run here is a fresh
interpreter whose main thread returns while daemon threads are inside ``next()``, submitting,
opening shards, closing passes or dropping batches, at a different moment each run. The race
these guard against hit 2 to 7 runs in 10; every variant runs several times.
"""

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_images

import fastload

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX exit semantics")]

RUNS = 5

PRELUDE = """
import os, sys, threading, time
import fastload
sys.path.insert(0, {tests!r})
from seams import install_slow_reads
SMALL, BIG, DELAY = {small!r}, {big!r}, {delay!r}

STARTED = []

def loop(make, epochs=1000):
    started = threading.Event()
    STARTED.append(started)
    def run():
        loader = make()
        for _ in range(epochs):
            for batch in loader:  # each batch is dropped at the next one
                started.set()
    threading.Thread(target=run, daemon=True).start()

def wait_started():
    for event in STARTED:
        event.wait(30)

def native(path, **kw):
    return lambda: fastload.ShardLoader(path, batch_size=16, backend="native", num_threads=2, pin_memory=False, **kw)

def torch_backend(path, **kw):
    return lambda: fastload.ShardLoader(path, batch_size=16, backend="torch", pin_memory=False, **kw)
"""

VARIANTS = {
    # daemon threads blocked in next(): every record read sleeps
    "native, blocked in next": """
        install_slow_reads(20000)
        for _ in range(2):
            loop(native(SMALL))
    """,
    # daemon threads going round epochs: submits, waits, pass ends and starts, batches freed
    "native, several busy threads": """
        for _ in range(3):
            loop(native(BIG))
        loop(native(BIG, shuffle=True, prefetch=1))
    """,
    "torch backend in-process": """
        for _ in range(2):
            loop(torch_backend(BIG, num_workers=0))
        loop(native(BIG))
    """,
    "torch backend, worker processes": """
        loop(torch_backend(BIG, num_workers=2))
        loop(native(BIG))
    """,
    # the main thread keeps a pass alive in a global, daemon threads are busy too
    "main thread's iterator left alive": """
        loop(native(BIG))
        loop(torch_backend(BIG, num_workers=0))
        it = iter(native(BIG, prefetch=4)())
        first = next(it)
    """,
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("exit")
    small, big = root / "small", root / "big"
    fastload.write_arrays(small, {"image": smooth_images(103, (3, 8, 8)), "label": np.arange(103, dtype=np.int64)},
                          codec={"image": "zstd"}, samples_per_shard=30)
    fastload.write_arrays(big, {"image": smooth_images(1200, (3, 32, 32)), "label": np.arange(1200, dtype=np.int64)},
                          codec={"image": "zstd"}, samples_per_shard=200)
    return small, big


def run_once(body: str, small: Path, big: Path, delay: float) -> subprocess.CompletedProcess:
    code = PRELUDE.format(tests=str(Path(__file__).parent), small=str(small), big=str(big), delay=delay)
    code += textwrap.dedent(body) + "\nwait_started()\ntime.sleep(DELAY)\nprint('main returns', flush=True)\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exit_with_live_iterators_in_other_threads(datasets, variant):
    small, big = datasets
    delays = [0.01 + 0.04 * i for i in range(RUNS)]  # the main thread returns at a different point each run
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda d: run_once(VARIANTS[variant], small, big, d), delays))
    failed = [(d, p.returncode, p.stderr[-600:]) for d, p in zip(delays, procs)
              if p.returncode != 0 or "terminate called" in p.stderr or "main returns" not in p.stdout]
    assert not failed, f"{len(failed)} of {RUNS} runs failed: {failed}"


def test_atexit_callbacks_still_use_loaders(datasets):
    """The gate parks only what runs after it: an atexit callback registered after ``import fastload`` (so run
    before fastload's hook) joins a thread that iterates; one registered before (run after the hook) iterates a
    loader on the main thread, which finalizes and never parks."""
    small, big = datasets
    body = """
        import atexit
        def late():  # registered before fastload's hook, so it runs after it, on the main thread
            n = sum(len(b["label"]) for b in fastload.ShardLoader(SMALL, batch_size=8, backend="native"))
            print("late callback read", n, flush=True)
        atexit.register(late)
        from fastload import _native  # fastload's hook is registered here
        stop, started = threading.Event(), threading.Event()
        def consume():
            loader = native(BIG)()
            while not stop.is_set():
                for batch in loader:
                    started.set()
                    if stop.is_set():
                        break
        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        started.wait(60)
        def early():  # registered after fastload's hook, so it runs before it
            stop.set()
            thread.join(30)
            print("early callback joined", not thread.is_alive(), flush=True)
        atexit.register(early)
    """
    code = PRELUDE.replace("from seams import install_slow_reads\n", "")
    code = code.replace("import fastload\n", "import fastload\nimport atexit\n", 1).format(
        tests=str(Path(__file__).parent), small=str(small), big=str(big), delay=0.1)
    proc = subprocess.run([sys.executable, "-c", code + textwrap.dedent(body) + "\ntime.sleep(0.2)\n"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr
    assert "early callback joined True" in proc.stdout and "late callback read 103" in proc.stdout, proc.stderr


def test_every_gil_retake_in_the_bindings_goes_through_the_exit_gate():
    """A GIL-release scope or acquire that bypasses exit_gate (csrc/bindings/exit_gate.h) reopens the abort."""
    files = [p for p in sorted((Path(__file__).parents[1] / "csrc" / "bindings").glob("*.[ch]*"))
             if not p.name.startswith("exit_gate")]
    assert len(files) >= 7, files  # the binding files by area (bindings.h), the gate's own files excepted
    source = "\n".join(p.read_text() for p in files)
    code = "\n".join(line.split("//")[0] for line in source.splitlines())
    for name in ("gil_scoped_release", "gil_scoped_acquire", "PyEval_RestoreThread", "PyEval_AcquireThread",
                 "PyGILState_Ensure", "PyEval_SaveThread"):
        count = code.count(name)
        allowed = 1 if name == "PyEval_SaveThread" else 0  # BatchReader.next's poll, restored by restore_or_park
        assert count == allowed, f"the bindings use {name} {count} times; use GilRelease / GilForThisThread"
