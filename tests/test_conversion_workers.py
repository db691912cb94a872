"""The worker processes of a conversion: an early stop kills stuck workers instead of waiting for them.

A worker stuck in a task (a dataset that blocks, a lock inherited through the
fork) must not hang the caller once it has stopped for another reason: an
error in another sample, Ctrl-C, the generator closed. Each case runs in a
subprocess in a session of its own: the failure guarded against is a hang,
and whatever is left of the session is killed afterwards. A stuck subprocess
prints its stacks and exits after 100 s (faulthandler).
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastload.conversion import _parallel

pytestmark = pytest.mark.skipif(multiprocessing.get_context().get_start_method() != "fork",
                                reason="the scripts' tasks and datasets reach the workers by fork")

STUCK = 3600  # seconds a stuck task sleeps: far past every timeout here
TIMEOUT = 120
# SIGINT gets Python's handler even where the test run ignores it (a background job).
PRELUDE = """\
import faulthandler, multiprocessing, os, signal, sys, time
faulthandler.dump_traceback_later(100, exit=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
import fastload
from fastload.conversion import _convert, _parallel
_convert.CHUNK_BYTES = 30 * 3 * 16 * 16  # about 30 samples per task

def stuck(i):  # blocks SIGINT, as a worker stuck in native code or deadlocked would not see it
    # One write per line: with PYTHONUNBUFFERED set (as on this VM) print writes each piece apart, and two workers'
    # lines interleaved ("stuckstuck 70", then "40"): the test counted one and waited for ever
    os.write(1, f"stuck {i}\\n".encode())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    time.sleep(STUCK_S)

class Tiles:  # a map-style dataset
    def __init__(self, stuck_at=(), fail_at=None):
        self.stuck_at, self.fail_at = stuck_at, fail_at

    def __len__(self):
        return 300

    def __getitem__(self, i):
        if i in self.stuck_at:
            stuck(i)
        if i == self.fail_at:
            raise OSError(f"disk gone at {i}")
        return np.full((3, 16, 16), i % 256, dtype=np.uint8), i % 5
""".replace("STUCK_S", str(STUCK))


def start(body: str) -> subprocess.Popen:
    """Start ``PRELUDE`` + ``body`` in a session of its own."""
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[str, str, list[int]]:
    """Wait for ``proc``; return its output and the processes of its session still alive, then kill them.

    The leader is reaped only after its session is killed: until then its pid, which is the session's and
    its process group's id, cannot be another process's, so the kill reaches nothing else.
    """
    assert proc.stdout is not None and proc.stderr is not None
    with ThreadPoolExecutor(2) as readers:  # the pipes drain while the leader runs
        out, err = readers.submit(proc.stdout.read), readers.submit(proc.stderr.read)
        exited = exited_unreaped(proc.pid, timeout)
        left = live_processes_of_session(proc.pid) if exited else []
        kill_session(proc)
        output = out.result(), err.result()
    proc.stdout.close()
    proc.stderr.close()
    if not exited:
        pytest.fail(f"still running after {timeout} s\n{output[0]}\n{output[1]}")
    return output[0], output[1], left


def exited_unreaped(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for child ``pid`` to exit, leaving it a zombie (not reaped: its pid stays its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.01)
    return False


def wait_for_lines(proc: subprocess.Popen, prefix: str, count: int) -> None:
    """Read ``proc``'s stdout until ``count`` lines start with ``prefix`` (a stuck script exits at 100 s)."""
    assert proc.stdout is not None
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        assert line, f"the script ended before {count} lines '{prefix}...': {proc.communicate()}"
        seen += line.startswith(prefix)


def kill_session(proc: subprocess.Popen) -> None:
    """Kill what is left of ``proc``'s session (it leads one), then reap ``proc``.

    Call it while ``proc`` is not reaped (running, or exited and left a zombie by ``exited_unreaped``): the
    session's id is then still ``proc``'s pid, not a reused one of another process.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty (a zombie leader counts as a member; never here)
        pass
    proc.wait()


def live_processes_of_session(sid: int) -> list[int]:
    """Pids of the processes (zombies aside) in session ``sid``, read from /proc (pgrep hangs under ASan)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, _pgrp, session = stat[stat.rfind(")") + 2:].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(entry))
    return found


def test_closing_the_map_early_kills_a_worker_stuck_in_a_task():
    proc = start("""
        def task(i):
            if i == 1:
                stuck(i)
            return os.getpid()

        outcomes = _parallel.ordered_map(task, [(i,) for i in range(6)], 2)
        pid, error = next(outcomes)
        assert error is None and pid != os.getpid()
        outcomes.close()  # task 1 is still running in the other worker
        print("workers left:", len(multiprocessing.active_children()), flush=True)
    """)
    out, err, left = finish(proc)
    assert proc.returncode == 0 and "workers left: 0" in out, out + err
    assert left == []


def test_workers_killed_while_sending_results_do_not_hang_the_stop():
    # The kill lands while a worker writes a 16 MB result into the result pipe: the executor's
    # thread is left reading half a message (it hung 3 runs in 3 before this process closed its
    # own end of that pipe). Twelve rounds make that likely.
    proc = start("""
        def task(i):
            if i == 1:
                stuck(i)
            return bytes(16 << 20) if i else b""

        for round in range(12):
            outcomes = _parallel.ordered_map(task, [(i,) for i in range(8)], 2)
            next(outcomes)
            time.sleep(0.01 * round)  # the kill lands at another point of the sends each round
            outcomes.close()
        print("workers left:", len(multiprocessing.active_children()), flush=True)
    """)
    out, err, left = finish(proc)
    assert proc.returncode == 0 and "workers left: 0" in out, out + err
    assert left == []


def test_an_error_in_one_sample_does_not_wait_for_a_stuck_worker(tmp_path):
    proc = start(f"""
        from fastload.conversion._dataset_writer import PreprocessError
        try:
            fastload.write_dataset(Tiles(stuck_at=(40,), fail_at=20), {str(tmp_path / "out")!r}, samples_per_shard=64,
                                   workers=2, names=("image", "label"), progress=False, order="source")
        except PreprocessError as err:
            print("error:", err, flush=True)
        print("workers left:", len(multiprocessing.active_children()), flush=True)
    """)
    out, err, left = finish(proc)
    assert proc.returncode == 0, out + err
    assert "disk gone at 20" in out and "workers left: 0" in out, out + err
    assert left == []
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("to", ["process group", "parent only"])
def test_ctrl_c_while_waiting_on_a_stuck_task(to):
    # The consumer waits on task 0, stuck; the other worker is busy with ordinary tasks. Ctrl-C in a
    # terminal reaches the whole process group; an IDE's or Jupyter's interrupt only the parent.
    proc = start("""
        def task(i):
            if i == 0:
                stuck(i)
            time.sleep(0.05)
            return i

        for _ in _parallel.ordered_map(task, [(i,) for i in range(10_000)], 2):
            pass
    """)
    wait_for_lines(proc, "stuck", 1)
    if to == "parent only":
        os.kill(proc.pid, signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err, left = finish(proc)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err and "Timeout" not in err, err
    assert left == [], f"processes still running: {left}"


def test_ctrl_c_stops_a_conversion_whose_workers_are_stuck(tmp_path):
    # Both workers stuck (samples 40 and 70, in the second and third task), SIGINT blocked.
    proc = start(f"""
        fastload.write_dataset(Tiles(stuck_at=(40, 70)), {str(tmp_path / "out")!r}, samples_per_shard=64, workers=2,
                               names=("image", "label"), progress=False)
    """)
    wait_for_lines(proc, "stuck", 2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err, left = finish(proc)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err and "Timeout" not in err, err
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert left == [], f"processes still running: {left}"


def test_a_sigint_that_reaches_the_workers_changes_nothing():
    # A terminal's Ctrl-C reaches the workers too: they leave it to the consumer (which kills them when it
    # stops). Here it reaches them alone, mid-task: every result still arrives, none as KeyboardInterrupt
    # and no worker dies (a worker unwinding halfway through sending a result wedged the result pipe).
    proc = start("""
        def task(i):
            time.sleep(0.05)
            return i, os.getpid()

        got, workers = [], set()
        for n, (result, error) in enumerate(_parallel.ordered_map(task, [(i,) for i in range(60)], 2)):
            assert error is None, repr(error)
            got.append(result[0])
            workers.add(result[1])
            if n in (5, 20, 35):
                for pid in workers:
                    os.kill(pid, signal.SIGINT)
        assert got == list(range(60)), got
        print("results in order from", len(workers), "workers", flush=True)
    """)
    out, err, left = finish(proc)
    assert proc.returncode == 0 and "results in order from 2 workers" in out, out + err
    assert left == []


def test_ctrl_c_handled_by_another_thread_still_stops_the_wait():
    # The kernel may hand a process's SIGINT to any thread that does not block it; the handler then only
    # flags it, and an untimed wait in the main thread (on a task that takes long) is not interrupted.
    proc = start("""
        import threading
        def task(i):
            time.sleep(STUCK_S if i == 0 else 0)
            return i

        def interrupt_from_another_thread():
            time.sleep(0.5)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

        threading.Thread(target=interrupt_from_another_thread, daemon=True).start()
        started = time.monotonic()
        try:
            for _ in _parallel.ordered_map(task, [(i,) for i in range(4)], 2):
                pass
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - started), "s", flush=True)
    """.replace("STUCK_S", "60"))
    out, err, left = finish(proc)
    assert proc.returncode == 0 and "interrupted after" in out, out + err
    assert int(out.split("interrupted after")[1].split()[0]) < 10, out  # a slice of the wait, not the task's 60 s
    assert left == []


def _interrupted_then_cleanup_fails(i: int) -> int:
    """A task that a Ctrl-C interrupts, and whose cleanup then fails: shutil.rmtree's double close, seen in CI."""
    if i < 2:
        return i
    try:
        raise KeyboardInterrupt
    finally:
        raise OSError(9, "Bad file descriptor")


def _plain_oserror(i: int) -> int:
    raise OSError(9, "Bad file descriptor")


def test_an_error_raised_while_ctrl_c_unwinds_a_task_is_the_ctrl_c():
    # In one process a task's error is handed to the caller, which reports it as the source's fault
    # (exit 1 naming a good file); an error replacing a KeyboardInterrupt must stop the run as Ctrl-C does
    outcomes = _parallel.ordered_map(_interrupted_then_cleanup_fails, [(i,) for i in range(4)], 1)
    assert [next(outcomes), next(outcomes)] == [(0, None), (1, None)]
    with pytest.raises(KeyboardInterrupt) as caught:
        next(outcomes)
    assert isinstance(caught.value.__cause__, OSError)
    # an ordinary error is still the task's outcome
    (result, error), = _parallel.ordered_map(_plain_oserror, [(0,)], 1)
    assert result is None and isinstance(error, OSError)
