"""The worker processes of a conversion: an early stop kills them instead of waiting for them.

A worker stuck in a task (a dataset that blocks, a lock inherited through the
fork) must not hang the caller once it has stopped for another reason: an
error in another sample, Ctrl-C, the generator closed. Each case runs in a
subprocess with a timeout: the failure guarded against is a hang. The grace
given to running tasks is cut to 1 s there (``STOP_GRACE_S``).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the workers are forked")

STUCK = 3600  # seconds a stuck task sleeps: far past every timeout here
PRELUDE = """\
import multiprocessing, os, signal, sys, time
import numpy as np
import torch
import fastload
from fastload.conversion import _convert, _parallel
_convert.CHUNK_BYTES = 30 * 3 * 16 * 16  # about 30 samples per task
_parallel.STOP_GRACE_S = 1.0
"""


def run_script(body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``body`` in a new session; on a timeout, kill the whole session (stuck workers included) and fail."""
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_session(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_session(proc: subprocess.Popen) -> None:
    """Kill what is left of ``proc``'s session (it leads one) so that no stuck worker outlives the test."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # none left
        pass
    proc.wait()


def test_closing_the_map_early_kills_a_worker_stuck_in_a_task():
    proc = run_script(f"""
        from fastload.conversion._parallel import ordered_map

        def task(i):
            if i == 1:
                time.sleep({STUCK})
            return os.getpid()

        outcomes = ordered_map(task, [(i,) for i in range(6)], 2)
        pid, error = next(outcomes)
        assert error is None and pid != os.getpid()
        outcomes.close()  # task 1 is still sleeping in the other worker
        print("workers left:", len(multiprocessing.active_children()), flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "workers left: 0" in proc.stdout, proc.stdout


def test_an_error_in_one_sample_does_not_wait_for_a_stuck_worker(tmp_path):
    proc = run_script(f"""
        from fastload.conversion._dataset_writer import PreprocessError

        class Tiles(torch.utils.data.Dataset):
            def __len__(self):
                return 300

            def __getitem__(self, i):
                if i == 40:
                    time.sleep({STUCK})
                if i == 20:
                    raise OSError(f"disk gone at {{i}}")
                return np.full((3, 16, 16), i % 256, dtype=np.uint8), i % 5

        try:
            fastload.write_dataset(Tiles(), {str(tmp_path / "out")!r}, samples_per_shard=64, workers=2,
                                   names=("image", "label"), progress=False)
        except PreprocessError as err:
            print("error:", err, flush=True)
        print("workers left:", len(multiprocessing.active_children()), flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "disk gone at 20" in proc.stdout and "workers left: 0" in proc.stdout, proc.stdout + proc.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_ctrl_c_stops_a_conversion_whose_workers_are_stuck(tmp_path):
    # Ctrl-C reaches the whole foreground process group: the parent and its workers. Both workers
    # get stuck (samples 40 and 70, in the second and third task) with SIGINT blocked, as workers
    # stuck in native code or deadlocked would not see it. (With one worker idle, its death at
    # Ctrl-C already made ProcessPoolExecutor stop the other.)
    script = PRELUDE + textwrap.dedent(f"""
        class Tiles(torch.utils.data.Dataset):
            def __len__(self):
                return 300

            def __getitem__(self, i):
                if i == 0:
                    print("started", flush=True)
                if i in (40, 70):
                    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
                    time.sleep({STUCK})
                return np.full((3, 16, 16), i % 256, dtype=np.uint8), i % 5

        fastload.write_dataset(Tiles(), {str(tmp_path / "out")!r}, samples_per_shard=64, workers=2,
                               names=("image", "label"), progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        time.sleep(1)  # both workers are asleep by now (any moment must do)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        left = live_processes_of_session(proc.pid)
    finally:
        kill_session(proc)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert left == [], f"processes of the conversion still running: {left}"


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
