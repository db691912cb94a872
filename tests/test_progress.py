"""Progress of the long steps (``fastload/_progress.py``): plain lines in a log, INFO records, --no-progress, --help.

The reporter is tested with a clock the test moves (the "every 10 s" rule without sleeping); the
commands are run as subprocesses with stderr a pipe, as a job scheduler's log would be, on datasets
big enough for a line at every tenth of the work.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from moto_s3 import moto_s3

import fastload
from fastload._progress import Progress, lines_to_stderr
from fastload.conversion.preprocess import build_parser as preprocess_parser
from fastload.format._verify import verify_dataset
from fastload.tools.cli import build_parser as fastload_parser
from fastload.tools.demo import build_parser as demo_parser

# program: desc: count[/total] unit [(pct %)][, rate unit/s][, ETA h:mm:ss | , done in h:mm:ss | , resumed]
LINE = re.compile(r"^(?P<program>[\w ]+): (?P<desc>[^:]+): (?P<count>[\d,.]+)(?:/(?P<total>[\d,.]+))? (?P<unit>\w+)"
                  r"(?: \((?P<pct>\d+) %\))?(?:, (?P<rate>[\d,.]+) \w+/s)?"
                  r"(?:, ETA (?P<eta>\d+:\d\d:\d\d)|, done in (?P<done>\d+:\d\d:\d\d)|, resumed)?$")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def fastload_records() -> Iterator[list[logging.LogRecord]]:
    """The records of the ``fastload`` loggers at INFO and above while the block runs (the level restored after)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("fastload")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def reporter(total: int | None, clock: Clock, stream: io.StringIO, **kwargs) -> Progress:
    return Progress("ds", total, unit="tiles", stream=stream, program="tool", clock=clock, heartbeat=False,
                    **kwargs)


def parsed(text: str, program: str | None = None) -> list[re.Match]:
    """Every progress line of ``text`` (of ``program``), parsed; an unparsable one fails the test."""
    found = []
    for line in text.splitlines():
        if program is not None and not line.startswith(f"{program}: "):
            continue
        match = LINE.match(line)
        if program is not None and " %)" in line or match is not None:
            assert match is not None, f"a progress line out of format: {line!r}"
            found.append(match)
    return found


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_a_line_at_every_tenth_then_a_last_line_with_the_time_taken():
    clock, out = Clock(), io.StringIO()
    with reporter(50_000, clock, out) as bar:
        for _ in range(100):
            clock.now += 0.05
            bar.update(500)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tool: ds: 0/50,000 tiles (0 %)"
    assert lines[1] == "tool: ds: 5,000/50,000 tiles (10 %), 10,000 tiles/s, ETA 0:00:04"
    assert [m["pct"] for m in parsed(out.getvalue())] == [str(p) for p in range(0, 101, 10)]
    assert lines[-1] == "tool: ds: 50,000/50,000 tiles (100 %), 10,000 tiles/s, done in 0:00:05"


def test_a_line_every_interval_when_the_tenths_come_slowly():
    clock, out = Clock(), io.StringIO()
    bar = reporter(1000, clock, out)
    for _ in range(9):  # 9 units in 9 s: no tenth crossed, the interval not reached
        clock.now += 1.0
        bar.update(1)
    assert len(out.getvalue().splitlines()) == 1  # the start line only
    clock.now += 1.0
    bar.update(1)  # 10 s since the start line
    assert out.getvalue().splitlines()[-1] == "tool: ds: 10/1,000 tiles (1 %), 1.0 tiles/s, ETA 0:16:30"
    clock.now += 10.0
    bar.tick()  # no update for 10 s: the heartbeat's call says where it stands (a slow rate as time per unit)
    assert out.getvalue().splitlines()[-1] == "tool: ds: 10/1,000 tiles (1 %), 2.0 s/tile, ETA 0:33:00"
    bar.tick()  # and not again before another interval
    assert len(out.getvalue().splitlines()) == 3
    bar.close(completed=False)  # an error or Ctrl-C: no last line
    assert len(out.getvalue().splitlines()) == 3


def test_a_last_unit_after_a_long_wait_is_said_once_by_the_last_line():
    clock, out = Clock(), io.StringIO()
    with reporter(8, clock, out) as bar:
        bar.update(7)
        clock.now += 30.0
        bar.update(1)  # 100 %, and the interval has passed: the last line alone says it
    lines = out.getvalue().splitlines()
    assert [line for line in lines if "(100 %)" in line] == [lines[-1]] and lines[-1].endswith("done in 0:00:30")


def test_records_logged_to_the_bars_terminal_do_not_run_into_the_bar():
    terminal = Terminal()
    handler = logging.StreamHandler(terminal)
    log = logging.getLogger("fastload.conversion")
    log.addHandler(handler)
    old = log.level
    log.setLevel(logging.INFO)
    try:
        with Progress("ds", 100, unit="tiles", stream=terminal, heartbeat=False) as bar:
            for _ in range(100):
                bar.update(1)
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    rows = [row for line in terminal.getvalue().split("\n") for row in line.split("\r")]
    records = [row for row in rows if "ds: " in row and "(" in row and "|" not in row]
    assert len(records) >= 10  # the start, the tenths, the end
    assert not [row for row in rows if "|" in row and "ds: " in row.split("|", 1)[1]], rows  # no record after a bar


def test_unknown_zero_and_resumed_totals_divide_nothing_by_zero():
    clock, out = Clock(), io.StringIO()
    with reporter(None, clock, out) as bar:  # an iterable dataset: no percentage, no ETA
        bar.update(7)  # at the start's instant: no rate either
        clock.now += 2.0
    assert out.getvalue().splitlines() == ["tool: ds: 0 tiles", "tool: ds: 7 tiles, 3.5 tiles/s, done in 0:00:02"]
    out = io.StringIO()
    with reporter(0, clock, out):  # an empty dataset
        pass
    assert out.getvalue().splitlines() == ["tool: ds: 0/0 tiles (100 %)",
                                           "tool: ds: 0/0 tiles (100 %), done in 0:00:00"]
    out = io.StringIO()
    with reporter(100, clock, out, initial=60) as bar:  # a resumed run: its rate is of this run's work only
        clock.now += 4.0
        bar.update(20)
        clock.now += 4.0
        bar.update(20)
    assert out.getvalue().splitlines() == ["tool: ds: 60/100 tiles (60 %), resumed",
                                           "tool: ds: 80/100 tiles (80 %), 5.0 tiles/s, ETA 0:00:04",
                                           "tool: ds: 100/100 tiles (100 %), 5.0 tiles/s, done in 0:00:08"]


def test_bytes_are_shown_in_the_unit_of_the_total():
    clock, out = Clock(), io.StringIO()
    with Progress("verify ds", 3_400_000_000, unit="B", stream=out, program="fastload", clock=clock,
                  heartbeat=False) as bar:
        clock.now += 10.0
        bar.update(1_200_000_000)
    assert out.getvalue().splitlines()[1] == "fastload: verify ds: 1.2/3.4 GB (35 %), 120.0 MB/s, ETA 0:00:18"


def test_no_line_without_a_command_asking_for_them_or_when_disabled():
    clock, out = Clock(), io.StringIO()
    with Progress("ds", 10, stream=out, clock=clock, heartbeat=False) as bar:  # a library call: no program
        bar.update(10)
    with Progress("ds", 10, stream=out, program="tool", clock=clock, enabled=False) as bar:
        bar.update(10)
    assert out.getvalue() == ""
    with lines_to_stderr("tool"):  # a command's block: lines without being told the program
        with Progress("ds", 10, stream=out, clock=clock, heartbeat=False) as bar:
            bar.update(10)
    assert out.getvalue().splitlines()[-1].startswith("tool: ds: 10/10 records (100 %)")


def test_a_terminal_gets_the_bar_and_no_lines():
    clock, term = Clock(), Terminal()
    with Progress("ds", 10, stream=term, program="tool", clock=clock, heartbeat=False) as bar:
        bar.update(4)
        bar.write("skipping a.png: unreadable", file=term)
        bar.update(6)
    text = term.getvalue()
    assert "\r" in text and "10/10" in text and "skipping a.png: unreadable\n" in text
    assert "tool: " not in text


def test_the_records_reach_a_configured_fastload_logger():
    clock, out = Clock(), io.StringIO()
    with fastload_records() as records:
        with Progress("ds", 20, stream=out, program="tool", clock=clock, heartbeat=False, logger="fastload.verify") \
                as bar:
            for _ in range(4):
                clock.now += 1.0
                bar.update(5)
    assert {r.name for r in records} == {"fastload.verify"} and {r.levelno for r in records} == {logging.INFO}
    printed = [line.removeprefix("tool: ") for line in out.getvalue().splitlines()]
    assert [r.getMessage() for r in records] == printed and len(printed) == 5


def test_updates_from_many_threads_count_once_each_and_the_heartbeat_stops_at_close():
    out = io.StringIO()
    bar = Progress("ds", 8 * 1000, stream=out, program="tool", interval_s=0.01)
    threads = [threading.Thread(target=lambda: [bar.update(1) for _ in range(1000)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bar.count == 8000
    beats = len(out.getvalue().splitlines())
    deadline = time.monotonic() + 30
    while len(out.getvalue().splitlines()) == beats and time.monotonic() < deadline:  # the heartbeat's line
        time.sleep(0.01)
    assert len(out.getvalue().splitlines()) > beats
    bar.close()
    assert not any(t.name == "fastload-progress" for t in threading.enumerate())
    counts = [number(m["count"]) for m in parsed(out.getvalue())]
    assert counts == sorted(counts) and counts[-1] == 8000
    assert out.getvalue().splitlines()[-1].startswith("tool: ds: 8,000/8,000 records (100 %)")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """Twenty 64x80 PNG images in two class folders: 20 tiles of 16x16 each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("scenes")
    rng = np.random.default_rng(0)
    for name in ("cats", "dogs"):
        (root / name).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def preprocess(scenes: Path, out: Path, *extra: str):
    return run_cli("preprocess_tiles", "--data-dir", str(scenes), "--output-dir", str(out), "--tile-size", "16",
                   "--labels-from-dirs", "--codec", "zstd", "--samples-per-shard", "100", "--order", "source",
                   *extra)


def check_steps(lines: list[re.Match], steps: dict[str, int]) -> None:
    """Each step (desc -> total) reports from its start to a last 100 % line, counts never going back."""
    for desc, total in steps.items():
        mine = [m for m in lines if m["desc"] == desc]
        counts = [number(m["count"]) for m in mine]
        assert len(mine) >= 4 and counts == sorted(counts), mine
        assert {number(m["total"]) for m in mine} == {total}
        assert mine[-1]["pct"] == "100" and mine[-1]["done"] is not None and counts[-1] == total
        assert [m["pct"] for m in mine].count("100") == 1  # the last tenth said once, with the time taken


def test_preprocess_tiles_reports_progress_lines_into_a_log_and_none_with_no_progress(scenes, tmp_path):
    r = preprocess(scenes, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    lines = parsed(r.stderr, "preprocess_tiles")
    check_steps(lines, {"probe": 20, "out": 400})
    assert {m["unit"] for m in lines} == {"files", "tiles"}
    assert "\r" not in r.stderr and "done: 400 samples" in r.stdout
    quiet = preprocess(scenes, tmp_path / "quiet", "--no-progress")
    assert quiet.returncode == 0, quiet.stderr
    assert parsed(quiet.stderr, "preprocess_tiles") == [] and quiet.stderr == ""


def test_an_interrupted_conversion_ends_on_whole_lines_and_its_resume_counts_from_its_shards(scenes, tmp_path):
    out, log = tmp_path / "out", tmp_path / "stderr.log"
    command = [sys.executable, "-m", "fastload.preprocess", "--data-dir", str(scenes), "--output-dir", str(out),
               "--tile-size", "16", "--labels-from-dirs", "--codec", "zstd", "--samples-per-shard", "100", "--order",
               "source"]
    with open(log, "w") as stderr:  # a log file, as a job scheduler's
        # SIGINT's default restored in the child: a pytest-xdist worker ignores it, and an ignored signal is
        # inherited (the Ctrl-C would not interrupt the conversion)
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "FASTLOAD_TEST_SHARD_DELAY": "1"},  # 1 s after each shard
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                journal = out / ".progress.json"
                if journal.exists() and json.loads(journal.read_text() or "{}").get("shards"):
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)  # Ctrl-C once the first shard is journaled
            assert proc.wait(timeout=120) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    lines = parsed(text, "preprocess_tiles")
    assert text.endswith("\n") and "interrupted; completed shards are kept" in text.splitlines()[-1]
    assert not any(m["done"] for m in lines if m["desc"] == "out")  # no last line for a step that did not end
    again = preprocess(scenes, out, "--resume")
    assert again.returncode == 0, again.stderr
    mine = [m for m in parsed(again.stderr, "preprocess_tiles") if m["desc"] == "out"]
    assert mine[0].group(0).endswith(", resumed") and 100 <= number(mine[0]["count"]) < 400
    assert mine[-1]["pct"] == "100" and mine[-1]["done"] is not None


def test_scenes_with_targets_report_the_partner_probe_and_the_labelled_tile_count(tmp_path, capsys):
    from test_dense_conversion import convert, make_scenes

    root = make_scenes(tmp_path)  # three scenes, each with a mask and a DEM
    assert convert(root, "--tile-size", "64", "--stride", "48", "--edge", "pad", "--ignore-index", "255",
                   "--min-labelled", "0.6") == 0  # in this process: the command's block, stderr captured
    lines = parsed(capsys.readouterr().err, "preprocess_tiles")
    steps = {m["desc"]: m for m in lines}
    assert set(steps) == {"probe", "probe partners", "min-labelled", "out"}
    check_steps([m for m in lines if m["desc"] != "out"], {"probe": 3, "probe partners": 3, "min-labelled": 3})
    assert steps["probe partners"]["unit"] == "scenes" and steps["min-labelled"]["done"] is not None
    assert convert(root, "--tile-size", "64", "--stride", "48", "--edge", "pad", "--ignore-index", "255",
                   "--min-labelled", "0.6", "--no-progress", out="quiet") == 0
    assert capsys.readouterr().err == ""


def test_verify_and_upgrade_report_progress_lines(tmp_path):
    from test_upgrade import write_old

    old = write_old(tmp_path / "old", 3, n=200, per_shard=10)
    r = run_cli("fastload", "upgrade", str(old))
    assert r.returncode == 0, r.stderr
    lines = parsed(r.stderr, "fastload")
    check_steps(lines, {"upgrade old": 200})
    assert any(m["desc"] == "verify old" for m in lines) and any(m["desc"] == "verify old/.upgrade" for m in lines)
    assert len([line for line in r.stderr.splitlines() if ": shard " in line]) == 20  # and a line per shard
    v = run_cli("fastload", "verify", str(old))
    assert v.returncode == 0, v.stdout + v.stderr
    total = sum(p.stat().st_size for p in old.glob("shard-*.lmdb"))
    verify_lines = parsed(v.stderr, "fastload")
    assert {m["desc"] for m in verify_lines} == {"verify old"} and verify_lines[-1]["pct"] == "100"
    assert verify_lines[-1]["done"] is not None and len(verify_lines) >= 4 and total > 0
    quiet = run_cli("fastload", "verify", str(old), "--no-progress")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_library_call_prints_no_line_and_logs_its_progress(tmp_path, capsys):
    with fastload_records() as records:
        samples = [{"image": np.full((3, 8, 8), i % 256, np.uint8)} for i in range(500)]
        fastload.write_dataset(samples, tmp_path / "ds", samples_per_shard=50, order="source")
        verify_dataset(tmp_path / "ds", progress=True)
    assert capsys.readouterr().err == ""
    written = [r.getMessage() for r in records if r.name == "fastload.conversion"]
    assert written[0] == "ds: 0/500 samples (0 %)", written
    assert re.fullmatch(r"ds: 500/500 samples \(100 %\), [\d,]+ samples/s, done in \d:\d\d:\d\d", written[-1]), written
    checked = [r.getMessage() for r in records if r.name == "fastload.verify"]
    assert checked[0].startswith("verify ds: 0.0/") and "(100 %)" in checked[-1] and "done in" in checked[-1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (as tests/test_remote.py starts it): storage_options for its bucket."""
    pytest.importorskip("obstore", reason="fastload[remote] (obstore) is not installed")
    with moto_s3("progress", secret=SECRET) as (_, _, options):
        yield options


SECRET = "SECRET-do-not-show-45"


def test_publishing_to_object_storage_logs_its_upload_in_bytes(s3, tmp_path, capsys):
    with fastload_records() as records:
        samples = [{"image": np.random.default_rng(i).integers(0, 255, (3, 32, 32), np.uint8)} for i in range(400)]
        fastload.write_dataset(samples, "s3://progress/out", samples_per_shard=40, storage_options=s3,
                               cache_dir=tmp_path / "cache")
    sent = [r.getMessage() for r in records if r.name == "fastload.publish"]
    assert re.fullmatch(r"publish s3://progress/out: 0\.0/1\.\d MB \(0 %\)", sent[0]), sent  # 10 shards, a manifest
    assert "(100 %)" in sent[-1] and "done in" in sent[-1] and len(sent) >= 4
    pcts = [int(m) for m in re.findall(r"\((\d+) %\)", " ".join(sent))]
    assert pcts == sorted(pcts)
    printed = capsys.readouterr()
    assert printed.err == "" and "published s3://progress/out" in printed.out
    assert not any(SECRET in r.getMessage() for r in records)


def every_parser() -> dict[str, argparse.ArgumentParser]:
    parsers = {"preprocess_tiles": preprocess_parser(), "fastload": fastload_parser(), "demo": demo_parser()}
    sub = next(a for a in parsers["fastload"]._actions if isinstance(a, argparse._SubParsersAction))
    parsers.update({f"fastload {name}": parser for name, parser in sub.choices.items()})
    return parsers


@pytest.mark.parametrize("name", sorted(every_parser()))
def test_help_says_each_default_once_and_every_option_what_it_does(name):
    parser = every_parser()[name]
    text = parser.format_help()
    flat = " ".join(text.split())
    assert not re.search(r"\(default:[^()]*\)\s*\(default:", flat), flat
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
            continue
        assert action.help, f"{name} {action.option_strings or action.dest}: no help text"
        said = " ".join(formatter._expand_help(action).split())
        assert said.count("(default:") <= 1 and "(default: None)" not in said, f"{name} {action.option_strings}: {said}"
    if name == "preprocess_tiles":
        said = flat.split("--samples-per-shard N ", 1)[1].split("--shard-size SHARD_SIZE", 1)[0]
        assert "Who writes the shards" in said, said


def test_help_of_the_commands_as_installed():
    r = run_cli("preprocess_tiles", "--help")
    assert r.returncode == 0 and "(default: drop)" in r.stdout and "(default: None)" not in r.stdout


def test_dask_conversion_reports_progress_and_no_dashboard_it_does_not_have(scenes, tmp_path):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from fastload.conversion._dask_map import describe

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        line = describe(client)
        assert line.endswith("; no dashboard") and "http" not in line, line
        r = preprocess(scenes, tmp_path / "out", "--scheduler", cluster.scheduler_address)
    assert r.returncode == 0, r.stderr
    assert "; no dashboard" in r.stdout and "http" not in r.stdout
    check_steps(parsed(r.stderr, "preprocess_tiles"), {"probe": 20, "out": 400})
