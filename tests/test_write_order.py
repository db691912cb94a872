"""The order conversions write samples in (issue 42, finding 5): shuffled across shards by default, or the source's.

A dataset written one class after another gives ``shuffle_window`` batches of few classes; the
shuffled order mixes them in every shard, the manifest records each shard's labels, and the
loader warns when a window of shards holds few classes.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_cli, smooth_images
from PIL import Image
from test_planned_shards import png_that_probes_but_does_not_decode

import fastload
from fastload.conversion import _write_groups, preprocess
from fastload.conversion._dataset_writer import POOL_TASKS_WRITE_FROM
from fastload.conversion._write_groups import GROUP_BYTES, WRITE_EPOCH, GroupedOrder, group_samples_for
from fastload.conversion._write_order import READS_NOTE_FROM
from fastload.conversion.preprocess import main as preprocess_main
from fastload.errors import ArgumentError, DatasetError, FastloadWarning
from fastload.format._manifest import load_manifest
from fastload.format._manifest_check import validate
from fastload.sampling._class_mix import shuffled_coverage, window_coverage

CLASSES = 10


@pytest.fixture(scope="module")
def class_folders(tmp_path_factory) -> Path:
    """Ten class folders of ten 8x8 PNG images each (one sample per image)."""
    root = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"class{c}").mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.png")
    return root


def write_scenes(root: Path, count: int, seed: int) -> Path:
    """Write ``count`` labelled scenes of 5x6 tiles of 16 pixels (80x96 RGB PNGs, one class folder each)."""
    for c, image in enumerate(smooth_images(count, (3, 80, 96), seed=seed)):
        (root / f"c{c}").mkdir()
        Image.fromarray(image.transpose(1, 2, 0)).save(root / f"c{c}" / "scene.png")
    return root


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """Three labelled scenes of 5x6 tiles of 16 pixels each: records are tiles of a source file."""
    return write_scenes(tmp_path_factory.mktemp("scenes"), 3, seed=4)


def convert(data: Path, out: Path, *options: str) -> dict:
    """Run preprocess_tiles in this process and return the manifest written (a split root's: none)."""
    assert preprocess_main(["--data-dir", str(data), "--output-dir", str(out), "--no-progress", *options]) == 0
    return json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}


def window_batches(path: Path, window: int) -> tuple[list[int], list[warnings.WarningMessage]]:
    """Return the distinct labels of each batch of 10 under ``shuffle_window=window``, and the warnings given."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastload.ShardLoader(str(path), batch_size=10, shuffle=True, shuffle_window=window, seed=3)
    distinct = [len(np.unique(b["label"].numpy())) for b in loader]
    return distinct, [w for w in caught if issubclass(w.category, FastloadWarning)]


def written_order(manifest: dict, seed: int) -> np.ndarray:
    """Return the source-order sample at each position of a shuffled dataset, from its sources and recorded G."""
    counts = [s["samples"] for s in manifest["sources"]]
    return GroupedOrder(seed, counts, sum(counts), manifest["order"]["group_samples"]).samples(0, sum(counts))


def shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("shard-*.lmdb"))}


def test_class_folders_are_mixed_in_every_shard_by_default_and_sorted_with_order_source(tmp_path, class_folders):
    mixed = convert(class_folders, tmp_path / "mixed", "--labels-from-dirs", "--samples-per-shard", "10")
    assert mixed["order"] == {"kind": "shuffled", "seed": 0, "version": 1, "epoch": WRITE_EPOCH,
                              "group_bytes": GROUP_BYTES, "group_samples": GROUP_BYTES // (3 * 8 * 8 + 8)}
    assert mixed["provenance"]["options"]["order_group_bytes"] == GROUP_BYTES
    assert mixed["provenance"]["options"]["order"] == "shuffled"
    labels = mixed["shard_labels"]
    assert labels["field"] == "label" and labels["counts"] == [10] * CLASSES
    assert min(bin(int(m, 16)).count("1") for m in labels["masks"]) >= 4  # every shard mixes classes
    distinct, warned = window_batches(tmp_path / "mixed", 2)
    assert warned == []
    assert np.mean(distinct) >= 5.5  # a random batch of 10 over 10 classes holds 6.5 on average

    by_class = convert(class_folders, tmp_path / "sorted", "--labels-from-dirs", "--samples-per-shard", "10",
                       "--order", "source")
    assert by_class["order"] == {"kind": "source"}
    assert by_class["shard_labels"]["masks"] == [format(1 << c, "x") for c in range(CLASSES)]
    distinct, warned = window_batches(tmp_path / "sorted", 2)
    assert max(distinct) <= 2  # a window of 2 shards of one class each
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "a window of 2 of 10 shards holds on average 2.0 of the dataset's 10 classes" in message
    assert "order='shuffled'" in message and "raise shuffle_window" in message
    assert warned[0].filename == __file__  # points at the ShardLoader(...) call


def test_class_folders_in_groups_smaller_than_the_dataset_still_mix_classes_in_every_shard(tmp_path, class_folders,
                                                                                         monkeypatch):
    monkeypatch.setattr(_write_groups, "GROUP_BYTES", 10 * (3 * 8 * 8 + 8))  # groups of 10 images: one per shard
    monkeypatch.setattr(preprocess, "GROUP_BYTES", 10 * (3 * 8 * 8 + 8))
    mixed = convert(class_folders, tmp_path / "mixed", "--labels-from-dirs", "--samples-per-shard", "10")
    assert mixed["order"]["group_samples"] == 10
    classes = [bin(int(m, 16)).count("1") for m in mixed["shard_labels"]["masks"]]
    assert min(classes) >= 4 and np.mean(classes) >= 5  # a random 10 of 100 files in 10 classes: 6.5 on average
    distinct, warned = window_batches(tmp_path / "mixed", 2)
    assert warned == [] and np.mean(distinct) >= 5.5


def test_the_shuffled_order_is_the_source_order_permuted_over_tiles(tmp_path, scenes):
    options = ("--labels-from-dirs", "--tile-size", "16", "--codec", "zstd", "--samples-per-shard", "7")
    source = convert(scenes, tmp_path / "source", *options, "--order", "source")
    shuffled = convert(scenes, tmp_path / "shuffled", *options, "--seed", "5")
    assert source["total"] == shuffled["total"] == 3 * 30
    assert shuffled["sources"] == source["sources"]  # first_sample: the source order's index
    a, b = fastload.ShardDataset(tmp_path / "source"), fastload.ShardDataset(tmp_path / "shuffled")
    order = written_order(shuffled, 5)
    assert sorted(order.tolist()) == list(range(len(a))) and order.tolist() != list(range(len(a)))
    for p, i in enumerate(order.tolist()):
        assert np.array_equal(b[p]["image"].numpy(), a[i]["image"].numpy()) and int(b[p]["label"]) == int(a[i]["label"])
    masks = [int(m, 16) for m in shuffled["shard_labels"]["masks"]]
    assert sum(bin(m).count("1") > 1 for m in masks) > len(masks) // 2  # tiles of several scenes per shard


@pytest.mark.parametrize("codec", ["zstd", "raw"], ids=["driver-writes", "planned"])
def test_a_shuffled_run_is_byte_identical_for_any_worker_count(tmp_path, scenes, codec):
    options = ("--labels-from-dirs", "--tile-size", "16", "--stride", "12", "--codec", codec, "--shard-size", "8KB")
    outs = []
    for workers in (1, 2, POOL_TASKS_WRITE_FROM):
        out = tmp_path / f"w{workers}"
        manifest = convert(scenes, out, *options, "--workers", str(workers))
        outs.append((shard_bytes(out), {k: v for k, v in manifest.items() if k != "provenance"}))
    assert len(outs[0][0]) > 3 and outs[0] == outs[1] == outs[2]


def test_the_split_is_by_source_whatever_the_order(tmp_path, scenes):
    options = ("--labels-from-dirs", "--tile-size", "16", "--val-fraction", "0.34", "--no-stratify",
               "--samples-per-shard", "9")
    convert(scenes, tmp_path / "source", *options, "--order", "source")
    convert(scenes, tmp_path / "shuffled", *options)
    for split in ("train", "val"):
        a = json.loads((tmp_path / "source" / split / "manifest.json").read_text())
        b = json.loads((tmp_path / "shuffled" / split / "manifest.json").read_text())
        assert a["sources"] == b["sources"] and a["total"] == b["total"] > 0
        assert b["order"]["kind"] == "shuffled"
    splits = [json.loads((tmp_path / o / "splits.json").read_text())["splits"] for o in ("source", "shuffled")]
    assert splits[0] == splits[1]


def test_hdf5_stacks_and_map_style_datasets_are_shuffled_the_same_way(tmp_path):
    data = tmp_path / "h5"
    data.mkdir()
    rng = np.random.default_rng(1)
    for k, n in enumerate((23, 17)):
        with h5py.File(data / f"part{k}.h5", "w") as f:
            f.create_dataset("x", data=rng.integers(0, 255, (n, 2, 4, 4), dtype=np.uint8), chunks=(5, 2, 4, 4))
            f.create_dataset("y", data=np.arange(n) % 4)
    options = ("--h5-dataset", "x", "--h5-labels", "y", "--codec", "lz4", "--samples-per-shard", "6")
    convert(data, tmp_path / "h5-source", *options, "--order", "source")
    convert(data, tmp_path / "h5-shuffled", *options, "--workers", "2")
    a, b = fastload.ShardDataset(tmp_path / "h5-source"), fastload.ShardDataset(tmp_path / "h5-shuffled")
    order = written_order(json.loads((tmp_path / "h5-shuffled" / "manifest.json").read_text()), 0).tolist()
    assert [int(b[p]["label"]) for p in range(40)] == [int(a[i]["label"]) for i in order]
    assert all(np.array_equal(b[p]["image"].numpy(), a[i]["image"].numpy())
               for p, i in enumerate(order))

    samples = [(np.full((2, 3), i, np.int16), i % 3) for i in range(50)]
    m = fastload.write_dataset(samples, tmp_path / "list", samples_per_shard=8, names=("v", "label"), seed=9,
                               progress=False)
    order = GroupedOrder(9, None, 50, group_samples_for(2 * 3 * 2 + 8)).samples(0, 50).tolist()  # a sample a source
    ds = fastload.ShardDataset(tmp_path / "list")
    assert [int(ds[p]["v"][0, 0]) for p in range(50)] == order
    assert m.extra["order"]["seed"] == 9 and m.provenance["options"]["order"] == "shuffled"
    assert m.extra["shard_labels"]["counts"] == [17, 17, 16]


def test_write_arrays_keeps_its_order_unless_asked(tmp_path):
    arrays = {"v": np.arange(30, dtype=np.int32), "label": np.repeat(np.arange(3), 10)}
    kept = fastload.write_arrays(tmp_path / "kept", arrays, samples_per_shard=10)
    assert kept.extra["order"] == {"kind": "source"}
    assert kept.extra["shard_labels"]["masks"] == ["1", "2", "4"]
    assert [int(fastload.ShardDataset(tmp_path / "kept")[i]["v"]) for i in range(30)] == list(range(30))
    mixed = fastload.write_arrays(tmp_path / "mixed", arrays, samples_per_shard=10, order="shuffled", seed=2)
    ds = fastload.ShardDataset(tmp_path / "mixed")
    order = GroupedOrder(2, None, 30, group_samples_for(4 + 8)).samples(0, 30)  # a sample per source
    assert [int(ds[p]["v"]) for p in range(30)] == order.tolist() != list(range(30))
    assert mixed.dataset_id != kept.dataset_id


def test_bad_orders_and_seeds_are_refused_quoting_them(tmp_path, class_folders):
    with pytest.raises(ArgumentError, match=r"order must be one of \['shuffled', 'source'\], not 'random'"):
        fastload.write_dataset([np.zeros(2)], tmp_path / "a", order="random", progress=False)
    with pytest.raises(ArgumentError, match=r"order='shuffled': a generator is read in its own order only"):
        fastload.write_dataset((np.zeros(2) for _ in range(3)), tmp_path / "b", order="shuffled", progress=False)
    with pytest.raises(ArgumentError, match=r"seed must be an integer .* not 1.5"):
        fastload.write_arrays(tmp_path / "c", {"v": np.zeros(3)}, order="shuffled", seed=1.5)
    streamed = fastload.write_dataset((np.zeros(2) for _ in range(3)), tmp_path / "d", progress=False)
    assert streamed.extra["order"] == {"kind": "source"}  # an iterable keeps its order by default
    r = run_cli("preprocess_tiles", "--data-dir", str(class_folders), "--output-dir", str(tmp_path / "e"),
                "--order", "random")
    assert r.returncode == 2 and "invalid choice: 'random'" in r.stderr
    r = run_cli("preprocess_tiles", "--data-dir", str(class_folders), "--output-dir", str(tmp_path / "f"),
                "--seed", str(2**64))
    assert r.returncode == 2 and f"--seed must be in [-2**63, 2**64), not {2**64}" in r.stderr
    help_text = run_cli("preprocess_tiles", "--help").stdout
    assert "--order {shuffled,source}" in help_text and "(default: shuffled)" in help_text


def test_resume_with_another_order_is_refused(tmp_path, class_folders):
    out = tmp_path / "o"
    convert(class_folders, out, "--labels-from-dirs")
    r = run_cli("preprocess_tiles", "--data-dir", str(class_folders), "--output-dir", str(out), "--labels-from-dirs",
                "--order", "source", "--resume")
    assert r.returncode == 2 and "--order: recorded shuffled, now source" in r.stderr


def test_a_run_in_source_order_records_options_as_runs_before_order_did(tmp_path, class_folders):
    """A source-order run records no order (so an interrupted run of an older fastload resumes with --order source);
    resuming it with the default order names both."""
    out = tmp_path / "o"
    manifest = convert(class_folders, out, "--labels-from-dirs", "--order", "source")
    assert "order" not in manifest["provenance"]["options"]
    r = run_cli("preprocess_tiles", "--data-dir", str(class_folders), "--output-dir", str(out), "--labels-from-dirs",
                "--resume")
    assert r.returncode == 2 and "--order: recorded source, now shuffled" in r.stderr
    r = run_cli("preprocess_tiles", "--data-dir", str(class_folders), "--output-dir", str(out), "--labels-from-dirs",
                "--order", "source", "--resume")
    assert r.returncode == 0, r.stderr


def test_files_failing_in_decoding_are_all_listed_and_not_skipped_in_a_shuffled_order(tmp_path, class_folders):
    data = tmp_path / "data"
    data.mkdir()
    png = (class_folders / "class0" / "0.png").read_bytes()
    for name in ("a", "b", "c", "d"):
        (data / f"{name}.png").write_bytes(png if name in "ac" else png_that_probes_but_does_not_decode(png))
    for skip in (("--workers", "2"), ("--skip-bad",)):  # read by worker processes, and by this one
        r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / f"o{len(skip)}"),
                    *skip)
        assert r.returncode == 1, r.stderr
        assert "2 image(s) failed to decode" in r.stderr and "b.png" in r.stderr and "d.png" in r.stderr
        assert "--order source --skip-bad" in r.stderr
        assert not (tmp_path / f"o{len(skip)}" / "manifest.json").exists()
    r = run_cli("preprocess_tiles", "--data-dir", str(data), "--output-dir", str(tmp_path / "src"), "--skip-bad",
                "--order", "source")
    assert r.returncode == 0 and "skipping b.png" in r.stdout, r.stderr


def manifest_doc(**extra) -> dict:
    doc = {"format": "fastload-shards", "format_version": 3, "dataset_id": "0" * 32,
           "schema": [{"name": "label", "dtype": "int64", "shape": []}], "total": 3,
           "shards": [{"file": f"shard-{i:05d}.lmdb", "count": c, "bytes": 10, "hash": "xxh3-128:" + "0" * 32}
                      for i, c in enumerate((2, 1))]}
    return {**doc, **extra}


@pytest.mark.parametrize(("labels", "problem"), [
    ({"field": "label", "counts": [2, 1], "masks": ["1"]}, "shard_labels.masks: 1 masks for 2 shards"),
    ({"field": "label", "counts": [2, 2], "masks": ["1", "2"]}, "the counts add up to 4, the dataset holds 3"),
    ({"field": "label", "counts": [3], "masks": ["1", "2"]}, "masks[1]: '2' names no label, or a label without"),
    ({"field": "label", "counts": [2, 1], "masks": ["1", "0"]}, "masks[1]: '0' names no label"),
    ({"field": "label", "counts": [2, 1], "masks": ["1", "X"]}, "masks[1]: 'X' is not 1 to 16 lowercase hex"),
    ({"field": "label", "counts": [1] * 65, "masks": ["1", "2"]}, "65 labels; 1 to 64"),
    ({"field": "image", "counts": [2, 1], "masks": ["1", "2"]}, "shard_labels.field: 'image'"),
    ({"field": "label", "counts": [2, -1], "masks": ["1", "2"]}, "counts[1]: -1 is out of range"),
    ({"field": "label", "counts": [2, 1], "masks": ["1", "2"], "x": 1}, "unknown key 'x'"),
])
def test_the_manifest_check_refuses_bad_shard_labels(labels, problem):
    validate(manifest_doc(shard_labels={"field": "label", "counts": [2, 1], "masks": ["1", "2"]}))
    with pytest.raises(Exception, match=problem.replace("[", r"\[").replace("(", r"\(")):
        validate(manifest_doc(shard_labels=labels))


@pytest.mark.parametrize(("order", "problem"), [
    ({"kind": "random"}, "order.kind: 'random' is not one of"),
    ({"kind": "source", "seed": 1}, "unknown key 'seed'"),
    ({"kind": "shuffled", "seed": 1, "version": 1}, "missing key 'epoch'"),
    ({"kind": "shuffled", "seed": 2**64, "version": 1, "epoch": 0, "group_bytes": 1, "group_samples": 1},
     "order.seed: 18446744073709551616 is out"),
    ({"kind": "shuffled", "seed": 1, "version": 1, "epoch": 0, "group_bytes": 1, "group_samples": 0},
     "order.group_samples: 0 is out"),
])
def test_the_manifest_check_refuses_a_bad_order(order, problem):
    with pytest.raises(Exception, match=problem):
        validate(manifest_doc(order=order))


def test_a_manifest_without_shard_labels_loads_and_gives_no_warning(tmp_path):
    fastload.write_arrays(tmp_path / "d", {"v": np.arange(40, dtype=np.int32), "label": np.repeat(np.arange(4), 10)},
                          samples_per_shard=10)
    path = tmp_path / "d" / "manifest.json"
    doc = json.loads(path.read_text())
    assert doc.pop("shard_labels") and doc.pop("order")
    path.write_text(json.dumps(doc))
    assert "shard_labels" not in load_manifest(tmp_path / "d").extra
    _, warned = window_batches(tmp_path / "d", 1)
    assert warned == []
    doc["shard_labels"] = {"field": "label", "counts": [10, 10, 10, 10], "masks": ["1", "2", "4"]}
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="shard_labels.masks: 3 masks for 4 shards"):
        load_manifest(tmp_path / "d")


def test_window_coverage_is_the_exact_expectation_over_every_window():
    rng = np.random.default_rng(7)
    masks = [int(m) for m in rng.integers(1, 1 << 6, size=7)]
    for k in (1, 2, 3, 7):
        windows = list(itertools.combinations(masks, k))
        brute = np.mean([bin(int(np.bitwise_or.reduce(w))).count("1") for w in windows])
        assert window_coverage(masks, k) == pytest.approx(brute)
    assert shuffled_coverage([5, 5], 1) == pytest.approx(1.0)
    assert shuffled_coverage([1, 0, 3], 1e9) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def many_scenes(tmp_path_factory) -> Path:
    """Six labelled scenes of 5x6 tiles of 16 pixels each (30 tiles a scene, 816 decoded bytes a tile)."""
    return write_scenes(tmp_path_factory.mktemp("many-scenes"), 6, seed=8)


def small_groups(monkeypatch, samples: int) -> None:
    """Make the groups of the shuffled order ``samples`` tiles of the scenes fixtures (816 decoded bytes each)."""
    monkeypatch.setattr(_write_groups, "GROUP_BYTES", samples * 816)
    monkeypatch.setattr(preprocess, "GROUP_BYTES", samples * 816)


def counted_reads(monkeypatch) -> dict[str, int]:
    """Count the decodes of each source file by the encoding (in this process: one worker)."""
    from fastload.conversion import _encode

    reads: dict[str, int] = {}
    real = _encode.read_image

    def counting(path, *args, **kwargs):
        reads[Path(path).parent.name] = reads.get(Path(path).parent.name, 0) + 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_encode, "read_image", counting)
    return reads


TILED = ("--labels-from-dirs", "--tile-size", "16", "--codec", "zstd", "--samples-per-shard", "7")


def test_each_scene_is_read_once_in_the_default_groups(tmp_path, many_scenes, monkeypatch, capsys):
    reads = counted_reads(monkeypatch)
    manifest = convert(many_scenes, tmp_path / "o", *TILED)
    assert reads == {f"c{c}": 1 for c in range(6)}  # one group holds all 180 tiles: one task, each scene read once
    assert manifest["order"]["group_samples"] == GROUP_BYTES // 816 > 180
    assert "note:" not in capsys.readouterr().err
    masks = [int(m, 16) for m in manifest["shard_labels"]["masks"]]
    assert np.mean([bin(m).count("1") for m in masks]) >= 4  # shards of 7 tiles mix the 6 scenes


def test_a_scene_is_read_once_per_group_it_spans(tmp_path, many_scenes, monkeypatch, caplog):
    small_groups(monkeypatch, 20)
    reads = counted_reads(monkeypatch)
    manifest = convert(many_scenes, tmp_path / "o", *TILED, "--seed", "3")
    order = GroupedOrder(3, [30] * 6, 180, 20)
    assert manifest["order"]["group_samples"] == 20 and manifest["order"]["group_bytes"] == 20 * 816
    assert manifest["provenance"]["options"]["order_group_bytes"] == 20 * 816 and order.groups == 9
    spans = {f"c{c}": sum(1 for g in range(order.groups) for s, _, _ in order.chunks(g) if s == c) for c in range(6)}
    assert reads == spans and sum(reads.values()) == order.reads() <= order.groups + 6 - 1
    assert max(reads.values()) <= 3 and order.reads_per_source() < READS_NOTE_FROM  # 30 tiles span 2 or 3 groups
    assert not [r for r in caplog.records if "note:" in r.getMessage()]
    source = convert(many_scenes, tmp_path / "s", *TILED, "--order", "source")
    a, b = fastload.ShardDataset(tmp_path / "s"), fastload.ShardDataset(tmp_path / "o")
    for p, i in enumerate(written_order(manifest, 3).tolist()):
        assert np.array_equal(b[p]["image"].numpy(), a[i]["image"].numpy()) and int(b[p]["label"]) == int(a[i]["label"])
    assert source["sources"] == manifest["sources"]


def test_the_note_on_repeated_reads_fires_for_scenes_larger_than_several_groups(tmp_path, many_scenes, monkeypatch,
                                                                                caplog, capsys):
    small_groups(monkeypatch, 5)
    reads = counted_reads(monkeypatch)
    convert(many_scenes, tmp_path / "o", *TILED)
    assert min(reads.values()) >= 6  # 30 tiles in groups of 5: 6 or 7 groups each
    notes = [r for r in caplog.records if "reads each source file about" in r.getMessage()]
    assert [(r.name, r.levelname) for r in notes] == [("fastload.conversion", "WARNING")]  # the application decides
    assert "reads each source file" not in capsys.readouterr().err  # where it goes: no print of the library's own


def test_a_resume_inside_a_group_writes_the_same_bytes(tmp_path, many_scenes, monkeypatch):
    small_groups(monkeypatch, 20)
    convert(many_scenes, tmp_path / "whole", *TILED, "--seed", "4")
    reads = counted_reads(monkeypatch)
    from fastload.conversion import _encode

    counting = _encode.read_image

    def failing(path, *args, **kwargs):
        if sum(reads.values()) == 5:  # in the third group (groups of 20 tiles, shards of 7)
            raise KeyboardInterrupt
        return counting(path, *args, **kwargs)

    monkeypatch.setattr(_encode, "read_image", failing)
    out = tmp_path / "resumed"
    assert preprocess_main(["--data-dir", str(many_scenes), "--output-dir", str(out), "--no-progress", *TILED,
                            "--seed", "4"]) != 0  # interrupted: the shards written are kept
    written = json.loads((out / ".progress.json").read_text())["shards"]
    assert 0 < sum(s["count"] for s in written) < 180 and sum(s["count"] for s in written) % 20 != 0
    monkeypatch.setattr(_encode, "read_image", counting)
    convert(many_scenes, out, *TILED, "--seed", "4", "--resume")
    assert shard_bytes(out) == shard_bytes(tmp_path / "whole")
    assert json.loads((out / "manifest.json").read_text())["shards"] == json.loads(
        (tmp_path / "whole" / "manifest.json").read_text())["shards"]


def test_the_grouped_order_is_a_permutation_computed_anywhere_and_per_group():
    counts = [5, 0, 7, 3, 10, 1]
    order = GroupedOrder(11, counts, 26, 6)
    whole = order.samples(0, 26)
    assert sorted(whole.tolist()) == list(range(26)) and whole.tolist() != list(range(26))
    assert all(np.array_equal(order.samples(a, b), whole[a:b]) for a in range(27) for b in range(a, 27))
    first = np.concatenate([[0], np.cumsum(counts)])
    for g in range(order.groups):  # each group's positions hold exactly its chunks' samples
        a, b = order.group_span(g)
        held = sorted(int(first[s]) + k for s, lo, hi in order.chunks(g) for k in range(lo, hi))
        assert sorted(whole[a:b].tolist()) == held and len({s for s, _, _ in order.chunks(g)}) == len(order.chunks(g))
    assert order.reads() == sum(len(order.chunks(g)) for g in range(order.groups))
    assert not np.array_equal(GroupedOrder(12, counts, 26, 6).samples(0, 26), whole)  # the seed matters
    assert np.array_equal(GroupedOrder(11, None, 9, 4).samples(0, 9), GroupedOrder(11, [1] * 9, 9, 4).samples(0, 9))
    assert group_samples_for(GROUP_BYTES * 2) == 1 and group_samples_for(1) == GROUP_BYTES
    with pytest.raises(ArgumentError, match="positions \\[3, 30\\) outside \\[0, 26\\)"):
        order.samples(3, 30)
