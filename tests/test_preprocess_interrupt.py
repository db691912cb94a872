"""One Ctrl-C ends a ``preprocess_tiles --workers 2`` run promptly, at any point, and ``--resume`` finishes it.

Also with ``--workers 4``, where the workers write the shards themselves (``_planned_writer``): an
interrupted run leaves only shards the driver committed, and a hidden ``.tasks`` folder that the
resumed run deletes.

The real command runs in a session of its own; SIGINT goes to the whole process group (a terminal's
Ctrl-C) or, for some runs, to the parent only (an IDE's interrupt), at a different point of the run
each time, with a CPU hog on the other core for some runs. A hang (1 run in 19 in the last attack
campaign: the main thread waiting on a result that the interrupted workers never sent) shows as a
run still alive seconds after the signal; every run is counted, and every interrupted output must be
finished by ``--resume`` into shards byte-identical to an uninterrupted run's.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from ctrl_c_steps import files_of, interrupt_each_step

from fastload.conversion import preprocess as cli
from fastload.conversion._dataset_writer import PreprocessError
from fastload.preprocess import main as preprocess_main

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sessions")]

RUNS = 14
EXIT_BOUND_S = 5.0  # "a second or two" on an idle machine; slack for a loaded one (a hang never ends)
OPTIONS = ["--tile-size", "32", "--stride", "32", "--codec", "zstd", "--samples-per-shard", "48", "--no-progress"]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """60 multi-band (6 x 96 x 96 uint16) TIFFs: 540 tiles, 12 shards."""
    d = tmp_path_factory.mktemp("scenes")
    rng = np.random.default_rng(5)
    grid = np.indices((96, 96)).sum(axis=0)
    for i in range(60):
        bands = (grid[None] * (i % 7 + 1) * 40 + rng.integers(0, 500, size=(6, 96, 96))).astype(np.uint16)
        tifffile.imwrite(d / f"scene{i:03d}.tif", bands, photometric="minisblack", planarconfig="separate")
    return d


def shard_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.lmdb"))}


def manifest_without_time(root: Path) -> dict:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["provenance"].pop("created")
    return manifest


def default_sigint() -> None:
    """In the child before exec: SIGINT's default action, so that Python installs its handler even where
    this test run ignores SIGINT (a background job of a non-interactive shell, as some CI runners start)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(scenes: Path, out: Path, workers: int = 2) -> tuple[subprocess.Popen, float]:
    """Start the command in a session of its own; return it once it has made its output directory (options
    checked, sources found; probing, encoding and writing are ahead), with that time."""
    proc = subprocess.Popen([sys.executable, "-m", "fastload.preprocess", "--data-dir", str(scenes),
                             "--output-dir", str(out), "--workers", str(workers), *OPTIONS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint)
    while not out.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.002)
    return proc, time.monotonic()


def interrupt_once(scenes: Path, out: Path, delay: float, to_group: bool,
                   workers: int) -> tuple[str, float | None, str]:
    """SIGINT the command ``delay`` s into its work; return (outcome, seconds from the signal to its exit, stderr)."""
    proc, started = start(scenes, out, workers)
    try:
        time.sleep(max(0.0, started + delay - time.monotonic()))
        sent = time.monotonic()
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            return "hang", None, ""
        took = time.monotonic() - sent
        interrupted = "interrupted; completed shards are kept, continue with: " in err and "--resume" in err
        if proc.returncode == 130 and interrupted:
            return "interrupted", took, err
        # Done before the signal; or done and exiting (main() returned), where SIGINT ends the interpreter.
        if proc.returncode in (0, -signal.SIGINT) and (out / "manifest.json").exists():
            return "finished first", took, err
        return f"status {proc.returncode}", took, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet: its id is still its session's
            proc.wait()


@pytest.mark.parametrize(("workers", "runs"), [(2, RUNS), (4, RUNS // 2)], ids=["driver-writes", "tasks-write"])
def test_ctrl_c_at_any_point_ends_the_run_and_resume_completes_it(tmp_path, scenes, workers, runs):
    reference = tmp_path / "reference"
    proc, started = start(scenes, reference, workers)
    _, err = proc.communicate(timeout=120)
    span = time.monotonic() - started  # how long the work takes here: the interrupts are spread over it
    assert proc.returncode == 0, err
    hog = None
    outcomes = []
    try:
        for run in range(runs):
            if run == runs // 2:  # the second half with the other core busy
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            out = tmp_path / f"run{run}"
            delay = span * ((run % (runs // 2)) + 0.3) / (runs // 2)  # from probing the images to the last shards
            outcome, took, err = interrupt_once(scenes, out, delay, to_group=run % 4 != 3, workers=workers)
            outcomes.append((run, round(delay, 2), outcome, took and round(took, 2)))
            assert outcome != "hang", f"run {run}: still running 30 s after SIGINT; all so far: {outcomes}"
            assert outcome in ("interrupted", "finished first"), f"run {run}: {outcome}\n{err}\n{outcomes}"
            assert took is not None and took < EXIT_BOUND_S, f"run {run}: exited {took:.1f} s after SIGINT"
            if outcome == "interrupted":
                assert not (out / "manifest.json").exists()
            # --resume finishes it (in this process, one worker: the output is the same for any count)
            assert preprocess_main(["--data-dir", str(scenes), "--output-dir", str(out), "--workers", "1",
                                    *OPTIONS, "--resume"]) == 0
            assert shard_files(out) == shard_files(reference), f"run {run}"
            assert manifest_without_time(out) == manifest_without_time(reference), f"run {run}"
            assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    print(outcomes)
    interrupted = sum(o[2] == "interrupted" for o in outcomes)
    assert interrupted >= runs // 2, f"too few runs were interrupted mid-run to test anything: {outcomes}"


@pytest.mark.parametrize("split", [False, True], ids=["one", "train-val"])
def test_a_ctrl_c_at_every_file_system_step_is_finished_by_resume(tmp_path, split, capsys):
    # Every point between two steps of the run, in order: a Ctrl-C between the first journal's temporary
    # file and its rename left a folder that --resume refused (CI, exit 2); one between the manifest and
    # the journal's deletion left the journal in the finished dataset
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        np.save(data / f"s{i}.npy", np.full((64, 64), 10 * i, np.uint16))
    options = ["--data-dir", str(data), "--tile-size", "32", "--samples-per-shard", "3", "--no-progress",
               *(["--val-fraction", "0.5"] if split else [])]
    reference = tmp_path / "reference"
    assert preprocess_main([*options, "--output-dir", str(reference)]) == 0

    def interrupted(out: Path) -> None:
        status = preprocess_main([*options, "--output-dir", str(out)])
        assert status in (0, 130), capsys.readouterr().err

    def resumed(out: Path) -> None:
        assert preprocess_main([*options, "--output-dir", str(out), "--resume"]) == 0, capsys.readouterr().err

    steps = interrupt_each_step(interrupted, resumed, tmp_path, files_of(reference))
    assert steps > 50, f"only {steps} file-system steps: the run no longer uses these calls"


def test_an_error_that_replaced_a_ctrl_c_reports_the_interrupt(tmp_path, scenes, monkeypatch, capsys):
    # A cleanup that the Ctrl-C interrupted can fail in turn (CI: shutil.rmtree's double close gave
    # "OSError: [Errno 9] Bad file descriptor", reported as an error of a good source, exit 1)
    def interrupted_run(args):
        try:
            try:
                raise KeyboardInterrupt
            finally:
                raise OSError(9, "Bad file descriptor")
        except OSError as err:
            raise PreprocessError(f"cats/3.png: OSError: {err}") from err

    monkeypatch.setattr(cli, "run", interrupted_run)
    status = cli.main(["--data-dir", str(scenes), "--output-dir", str(tmp_path / "out"), *OPTIONS])
    err = capsys.readouterr().err
    assert status == 130, err
    assert "interrupted" in err and "--resume" in err and "Bad file descriptor" not in err
