"""Hostile lifecycles of the native reader: two consumer threads, exit with a thread waiting, os.fork().

Each case runs in a subprocess with a timeout, since the failures these guard
against were crashes (SIGSEGV, "terminate called ..."), aborts and hangs.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="fork and POSIX signals")]


def run_script(body: str, dataset, timeout: float = 120) -> subprocess.CompletedProcess:
    code = "import os, sys, threading, time\nimport fastload\nfrom fastload.errors import FastloadError\n"
    code += f"sys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom seams import install_slow_reads\n"
    code += f"PATH = {str(dataset)!r}\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def assert_clean(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"status {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_one_iterator_from_two_threads_is_a_typed_error_and_loses_nothing(small_dataset):
    proc = run_script("""
        install_slow_reads(3000)
        loader = fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2)
        it = iter(loader)
        got, errors = [], []
        def consume():
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except FastloadError as err:
                    errors.append(str(err))
                    time.sleep(0.001)
                    continue
                got.extend(batch["label"].tolist())
        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert sorted(got) == [7 * i for i in range(103)], got  # every sample exactly once
        assert errors and all("being consumed by another thread" in e for e in errors), errors[:3]
        print("errors", len(errors), errors[0])
    """, small_dataset)
    assert_clean(proc)
    assert "being consumed by another thread" in proc.stdout


def test_the_native_reader_itself_refuses_a_second_consumer(small_dataset):
    proc = run_script("""
        import numpy as np
        from fastload import _native
        from fastload.loading._native_backend import open_shards
        ds = fastload.ShardDataset(PATH)
        fields = ds.manifest.fields
        reader = _native.BatchReader(open_shards(ds), [f.native_spec for f in fields], [f.np_dtype for f in fields],
                                     [list(f.shape) for f in fields], [True] * len(fields), 4, 2,
                                     record_version=ds.manifest.format_version,
                                     shard_fingerprints=ds.manifest.record_fingerprints())
        _native._testing.set_read_delay(reader, 200000)
        reader.add_slot(np.empty(reader.slot_bytes, np.uint8))
        reader.submit(np.arange(4, dtype=np.uint64))
        first = threading.Thread(target=reader.next)
        first.start()
        time.sleep(0.1)
        try:
            reader.next()
        except FastloadError as err:
            print("second:", err)
        first.join()
        reader.close()
    """, small_dataset)
    assert_clean(proc)
    assert "BatchReader.next: another thread is using this reader" in proc.stdout


# CPython <= 3.13 ends a daemon thread that wants the GIL back during finalization with pthread_exit; the
# extension's exit gate parks such a thread instead, so no forced unwind runs through it (under ASan too).
# tests/test_exit_live_iterators.py repeats this under more timings, threads and both backends.
@pytest.mark.parametrize("run", range(3))
def test_interpreter_exit_while_a_daemon_thread_waits_in_next(small_dataset, run):
    proc = run_script("""
        install_slow_reads(100000)
        loader = fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2)
        it = iter(loader)
        threading.Thread(target=lambda: list(it), daemon=True).start()
        time.sleep(0.3)
        print("main thread exits")
    """, small_dataset, timeout=60)
    assert_clean(proc)
    assert "main thread exits" in proc.stdout


# A torchrun test aborted at exit ("terminate called without an active exception"); the core dump showed
# torch's gloo thread, not a fastload one. This keeps fastload's own part of that suspicion tested: the
# interpreter exits with a pass held in a global, its workers mid-batch, batches queued or alive.
@pytest.mark.parametrize("ending", ["fall through", "sys.exit"])
@pytest.mark.parametrize("taken", [0, 1, 3])
@pytest.mark.parametrize("delay_us", [0, 20000])
def test_interpreter_exit_with_a_live_iterator_in_a_global(small_dataset, taken, delay_us, ending):
    proc = run_script(f"""
        loader = fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2, prefetch=4)
        while not loader._warm_up.stats()["done"]:  # its thread ends (left for the exit to join): not counted
            time.sleep(0.001)
        install_slow_reads({delay_us})
        it = iter(loader)
        before = len(os.listdir("/proc/self/task"))
        for _ in range({taken}):
            batch = next(it)
        print("workers", len(os.listdir("/proc/self/task")) - before, flush=True)
        if {ending!r} == "sys.exit":
            sys.exit(0)
    """, small_dataset, timeout=60)
    assert_clean(proc)
    assert f"workers {0 if taken == 0 else 2}" in proc.stdout  # the pass starts its threads at the first batch


@pytest.mark.parametrize("ending", ["exit", "close", "del", "os._exit"])
def test_fork_with_a_live_iterator(small_dataset, ending):
    proc = run_script(f"""
        install_slow_reads(2000)
        loader = fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2)
        it = iter(loader)
        first = next(it)["label"].tolist()
        pid = os.fork()
        if pid == 0:
            try:
                next(it)
                print("child: the parent's iterator still ran", flush=True)
            except FastloadError as err:
                print("child error:", err, flush=True)
            own = [b["label"] for b in fastload.ShardLoader(PATH, batch_size=10, backend="native", num_threads=2)]
            print("child read", sum(len(b) for b in own), flush=True)
            ending = {ending!r}
            if ending == "close":
                it.close()
            elif ending == "del":
                del it
            elif ending == "os._exit":
                sys.stdout.flush()
                os._exit(0)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        rest = [b["label"].tolist() for b in it]
        labels = first + [x for b in rest for x in b]
        assert labels == [7 * i for i in range(103)], labels
        print("child status", status)
    """, small_dataset, timeout=60)
    assert_clean(proc)
    assert "child error: this loader iterator was created in process" in proc.stdout
    assert "inherited through os.fork()" in proc.stdout
    assert "child read 103" in proc.stdout and "child status 0" in proc.stdout


def test_a_shard_dataset_closed_or_collected_reopens_its_shards(small_dataset):
    """ShardDataset holds each shard's native mapping itself (no process-wide registry, no lock to meet in a
    finalizer): close() drops them, the next read opens them again, and a collected dataset leaves nothing."""
    import gc

    import fastload

    ds = fastload.ShardDataset(small_dataset)
    assert ds[0]["label"].item() == 0
    ds.read_batch([0, 1])
    del ds
    gc.collect()
    other = fastload.ShardDataset(small_dataset)
    assert other[0]["label"].item() == 0
    other.close()
    assert other._envs == {}
    assert other[1]["label"].item() == 7  # reopens after close


def test_a_forked_child_reads_with_buffers_of_its_own(small_dataset):
    # The loader keeps its plain batch buffers (a native pool) from pass to pass. In a child
    # made by os.fork() that pool and its lock are the parent's (a parent thread may have held
    # the lock at the fork): the child's passes must start their own and read every sample.
    proc = run_script("""
        install_slow_reads(500)
        loader = fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2, pin_memory=False)
        list(loader)
        kept = loader._slots.get()
        print("parent keeps a pool:", kept is not None, flush=True)
        other = iter(fastload.ShardLoader(PATH, batch_size=4, backend="native", num_threads=2))
        next(other)  # threads of another loader are busy at the fork
        pid = os.fork()
        if pid == 0:
            print("child sees the parent's pool:", loader._slots.get() is not None, flush=True)
            it = iter(loader)
            first = next(it)
            print("child's pass took the parent's pool:", it._inner._pool is kept, flush=True)
            labels = sorted(x for b in [first, *it] for x in b["label"].tolist())
            print("child ok" if labels == [7 * i for i in range(103)] else f"child wrong {labels}", flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        rest = sorted(x for b in other for x in b["label"].tolist())
        print("parent", len(rest), "child status", status)
    """, small_dataset, timeout=60)
    assert_clean(proc)
    out = proc.stdout + proc.stderr
    assert "parent keeps a pool: True" in out, out
    assert "child sees the parent's pool: False" in out and "child's pass took the parent's pool: False" in out, out
    assert "child ok" in out and "child status 0" in out, out
