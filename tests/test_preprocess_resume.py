"""--resume with other options than the recorded run is refused, naming each option and both values."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import fastload

pytestmark = pytest.mark.slow  # tier: preprocess_tiles runs in subprocesses


@pytest.fixture(scope="session")
def scenes(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("scenes")
    for i in range(4):
        np.save(d / f"s{i}.npy", np.full((128, 128), 10 * i, np.uint16))
    return d


def preprocess(data: Path, out: Path, *options: str):
    return run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(out), "--no-progress", *options)


def test_resume_of_a_finished_run_with_other_options_is_refused(tmp_path, scenes):
    out = tmp_path / "o"
    assert preprocess(scenes, out, "--tile-size", "128").returncode == 0
    r = preprocess(scenes, out, "--tile-size", "64", "--codec", "zstd", "--resume")
    assert r.returncode == 2
    assert "--resume with options that differ from the recorded run" in r.stderr
    assert "--tile-size: recorded 128x128, now 64x64" in r.stderr
    assert "--codec: recorded raw, now zstd" in r.stderr and "--overwrite" in r.stderr
    assert "already complete" not in r.stdout
    same = preprocess(scenes, out, "--tile-size", "128", "--resume")
    assert same.returncode == 0 and "already complete" in same.stdout


def test_resume_of_an_interrupted_run_with_other_options_is_refused(tmp_path, scenes):
    data = tmp_path / "data"
    data.mkdir()
    for p in scenes.iterdir():
        (data / p.name).write_bytes(p.read_bytes())
    np.save(data / "s9.npy", np.full((128, 128), 300, np.uint16))  # does not fit uint8: the run stops here
    out = tmp_path / "o"
    r = preprocess(data, out, "--dtype", "uint8", "--samples-per-shard", "1", "--order", "source")
    assert r.returncode == 1 and "s9.npy" in r.stderr
    assert len(json.loads((out / ".progress.json").read_text())["shards"]) == 4
    r = preprocess(data, out, "--dtype", "uint16", "--samples-per-shard", "2", "--order", "source", "--resume")
    assert r.returncode == 2
    assert "--dtype: recorded uint8, now uint16" in r.stderr and "--samples-per-shard: recorded 1, now 2" in r.stderr


def test_resume_of_a_split_root_with_other_options_is_refused(tmp_path, scenes):
    out = tmp_path / "o"
    assert preprocess(scenes, out, "--val-fraction", "0.5").returncode == 0
    r = preprocess(scenes, out, "--val-fraction", "0.25", "--resume")
    assert r.returncode == 2 and "--val-fraction: recorded 0.5, now 0.25" in r.stderr
    r = preprocess(scenes, out, "--val-fraction", "0.5", "--seed", "1", "--resume")
    assert r.returncode == 2 and "--seed: recorded 0, now 1" in r.stderr


@pytest.mark.parametrize("split", [False, True])
def test_resume_of_a_run_interrupted_before_its_first_shard_starts_it(tmp_path, scenes, split):
    out = tmp_path / "o"
    options = ("--tile-size", "64", "--val-fraction", "0.25") if split else ("--tile-size", "64")
    leftover = out / "train" if split else out  # what an early Ctrl-C leaves: folders, a shard being built
    leftover.mkdir(parents=True)
    (leftover / ".shard-00000.lmdb.build").write_bytes(b"\0" * 100)
    if split:
        (out / "val").mkdir()
    r = preprocess(scenes, out, *options)
    assert r.returncode == 2 and "no completed shard" in r.stderr
    assert f"preprocess_tiles --data-dir {scenes} --output-dir {out} --no-progress {' '.join(options)} --resume" \
        in r.stderr  # the command that works, in full
    r = preprocess(scenes, out, *options, "--resume")
    assert r.returncode == 0, r.stderr
    assert "nothing completed yet: starting the run" in r.stdout
    assert not list(out.rglob("*.build"))
    root = fastload.ShardDataset(out, split="train") if split else fastload.ShardDataset(out)
    assert len(root) > 0


@pytest.mark.parametrize("split", [False, True])
def test_resume_of_a_run_interrupted_while_writing_its_first_journal_finishes_it(tmp_path, scenes, split):
    # A Ctrl-C between the journal's temporary file and its rename leaves a committed shard and that file, with
    # no journal (CI: --resume then refused the folder as "not a fastload output", exit 2)
    options = ("--tile-size", "64", "--samples-per-shard", "4", *(("--val-fraction", "0.5") if split else ()))
    reference = tmp_path / "reference"
    assert preprocess(scenes, reference, *options).returncode == 0
    out = tmp_path / "o"
    part = Path("train") if split else Path(".")
    (out / part).mkdir(parents=True)
    (out / part / "shard-00000.lmdb").write_bytes((reference / part / "shard-00000.lmdb").read_bytes())
    (out / part / "..progress.json.tmp").write_text('{"fingerprint": "')  # cut short
    if split:
        (out / "val").mkdir()
    r = preprocess(scenes, out, *options, "--resume")
    assert r.returncode == 0, r.stderr
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert files == sorted(p.relative_to(reference).as_posix() for p in reference.rglob("*"))
    for name in files:
        if name.endswith(".lmdb"):
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    # Elsewhere such a file is not enough to make a folder look like a run's output
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "..progress.json.tmp").write_text("{")
    (stranger / "notes.txt").write_text("keep me")
    r = preprocess(scenes, stranger, *options, "--overwrite")
    assert r.returncode == 2 and "refusing to delete" in r.stderr and (stranger / "notes.txt").exists()


def test_messages_about_the_output_folder_name_the_command_that_works(tmp_path, scenes):
    out = tmp_path / "o"
    assert preprocess(scenes, out, "--tile-size", "64").returncode == 0
    r = preprocess(scenes, out, "--tile-size", "64")
    assert r.returncode == 2 and "--overwrite" in r.stderr
    assert f"preprocess_tiles --data-dir {scenes} --output-dir {out} --no-progress --tile-size 64 --overwrite" \
        in r.stderr
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("keep me")
    r = preprocess(scenes, stranger, "--tile-size", "64", "--resume")
    assert r.returncode == 2 and "not a fastload output" in r.stderr and "--output-dir" in r.stderr
    assert (stranger / "notes.txt").exists()


def test_manifests_record_the_source_folder_relative_to_the_dataset(tmp_path, scenes):
    out = tmp_path / "o"
    assert preprocess(scenes, out, "--tile-size", "64", "--val-fraction", "0.25").returncode == 0
    for doc in (out / "train" / "manifest.json", out / "val" / "manifest.json", out / "splits.json"):
        text = doc.read_text()
        assert str(scenes) not in text and str(tmp_path) not in text  # no absolute path of this machine
        recorded = json.loads(text)["provenance"]["source_root"]
        assert (doc.parent / recorded).resolve() == scenes.resolve()
    r = run_cli("fastload", "info", str(out / "train"))
    assert f"from {Path('..', '..', scenes.name)}" in r.stdout or "from ../../" in r.stdout
    assert preprocess(scenes, tmp_path / "abs", "--tile-size", "64", "--absolute-source-root").returncode == 0
    assert json.loads((tmp_path / "abs" / "manifest.json").read_text())["provenance"]["source_root"] == \
        str(scenes.resolve())
