"""preprocess_tiles --targets/--inputs (issue 43) from object storage, on a Dask cluster, resumed.

The promise, as for images alone (test_remote_input.py, test_conversion_dask.py): scenes whose masks
and extra inputs are partner files convert to the same bytes for any --workers and either --order,
from a bucket (moto's S3 server on 127.0.0.1, no mock of a client library) as from a local folder,
on a Dask cluster as in local processes; an interrupted run resumes to the same bytes, and refuses
a partner file changed meanwhile as it refuses a changed image; a partner that is missing or
unreadable in the bucket is an error naming its URL, or skipped with --skip-bad and listed.

The data: four GeoTIFF scenes (3 bands, uint8) of 96..200 pixels, masks as PNG and as TIFF (uint8,
classes 0..3 and 255 for "no label"), and a DEM of two float32 bands as .npy; 64-pixel tiles on a
48-pixel stride, padded at the edges, class counts, --min-labelled, a validation split, 6 samples a
shard: 34 samples in 6 shards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from test_remote import BUCKET, SECRET, s3, upload  # noqa: F401  (s3: the fixture)
from test_remote_output import s3_env

import fastload
from fastload.conversion.preprocess import build_parser, run

pytestmark = pytest.mark.slow  # tier: the moto S3 server and a Dask cluster

# name (relative stem), (height, width), the mask's format; "sub/d" lands in the val split (seed 0).
SCENES = [("a", (150, 170), "png"), ("b", (96, 112), "tif"), ("sub/c", (200, 130), "png"),
          ("sub/d", (120, 100), "tif")]
OPTIONS = ("--tile-size", "64", "--stride", "48", "--edge", "pad", "--ignore-index", "255", "--num-classes", "4",
           "--min-labelled", "0.3", "--codec", "zstd", "--val-fraction", "0.25", "--samples-per-shard", "6",
           "--no-progress")
RUN_FIELDS = ("created", "source_root", "partner_roots")  # provenance: the run, where its sources were


def make_scenes(root: Path) -> None:
    """Write the scenes (``scenes/``), their masks (``labels/``) and DEMs (``dem/``) under ``root``."""
    import tifffile
    from PIL import Image

    rng = np.random.default_rng(43)
    for i, (name, (h, w), mask_format) in enumerate(SCENES):
        for folder in ("scenes", "labels", "dem"):
            (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        tifffile.imwrite(root / "scenes" / f"{name}.tif", image, extratags=[
            (33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 500000.0 + 1000 * i, 4.6e6, 0), True)])
        mask = rng.integers(0, 4, (h, w)).astype(np.uint8)
        mask[:30, :40] = 255  # unlabelled (the padded edge tiles are what --min-labelled may drop)
        if mask_format == "png":
            Image.fromarray(mask).save(root / "labels" / f"{name}.png")
        else:
            tifffile.imwrite(root / "labels" / f"{name}.tif", mask)
        np.save(root / "dem" / f"{name}.npy", rng.random((h, w, 2)).astype(np.float32))


def args_of(root: str, out: str | Path, *extra: str) -> list[str]:
    """The command line of the test's conversion of the scenes under ``root`` (a directory or a URL)."""
    return ["--data-dir", f"{root}/scenes", "--targets", f"masks={root}/labels", "--inputs", f"dem={root}/dem",
            "--output-dir", str(out), *OPTIONS, *extra]


def convert(root: str | Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("preprocess_tiles", *args_of(str(root), out, *extra), env=env)


def remote_env(s3) -> dict[str, str]:  # noqa: F811
    return {**s3_env(s3), "AWS_EC2_METADATA_DISABLED": "true"}


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.lmdb"))}


def documents(out: Path, without: tuple[str, ...] = ("created",)) -> dict[str, dict]:
    """The manifests and splits.json under ``out``, without the provenance fields ``without``."""
    found = {}
    for path in sorted([*out.rglob("manifest.json"), *out.rglob("splits.json")]):
        doc = json.loads(path.read_text())
        for key in without:
            doc["provenance"].pop(key, None)
        found[path.relative_to(out).as_posix()] = doc
    return found


def assert_same_output(a: Path, b: Path, without: tuple[str, ...] = ("created",)) -> None:
    """Every shard byte for byte, and every manifest but the provenance fields ``without``."""
    ours, theirs = shard_bytes(a), shard_bytes(b)
    assert sorted(theirs) == sorted(ours) and len(ours) == 6
    for name in ours:
        assert theirs[name] == ours[name], f"{b / name} differs from {a / name}"
    docs = documents(a, without)
    assert documents(b, without) == docs and sorted(docs) == ["splits.json", "train/manifest.json",
                                                              "val/manifest.json"]
    assert not [p for p in b.rglob("*") if p.name.startswith(".")]  # no journal, no partial shard left


def scenes_of(out: Path) -> dict[str, list[dict]]:
    return {split: json.loads((out / split / "manifest.json").read_text())["scenes"] for split in ("train", "val")}


@pytest.fixture(scope="module")
def dense_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dense")
    make_scenes(root)
    return root


@pytest.fixture(scope="module")
def dense_url(s3, dense_data) -> str:  # noqa: F811
    """The scenes, masks and DEMs uploaded to the test bucket: the URL that holds scenes/, labels/ and dem/."""
    return upload(s3[1], dense_data, "dense")


@pytest.fixture(scope="module")
def local_outputs(dense_data, tmp_path_factory) -> dict[str, Path]:
    """The local conversion with one worker, per --order: the bytes every other run must give."""
    found = {}
    for order in ("shuffled", "source"):
        out = tmp_path_factory.mktemp("reference") / order
        done = convert(dense_data, out, "--order", order)
        assert done.returncode == 0, done.stderr
        found[order] = out
    assert shard_bytes(found["shuffled"]) != shard_bytes(found["source"])  # the orders are two cases, not one
    return found


@pytest.fixture(scope="module")
def remote_outputs(s3, dense_url, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """The conversion of the bucket's copy (--data-dir, --targets and --inputs URLs), local output, per --order."""
    found = {}
    for order, workers in (("shuffled", "2"), ("source", "1")):
        out = tmp_path_factory.mktemp("remote") / order
        done = convert(dense_url, out, "--order", order, "--workers", workers, env=remote_env(s3))
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout + done.stderr
        found[order] = out
    return found


def check_tiles_against_sources(out: Path, root: Path) -> None:
    """Every sample holds its scene's image, DEM and mask at its window, padded; its class counts match."""
    import tifffile
    from PIL import Image

    for split, scenes in scenes_of(out).items():
        ds = fastload.ShardDataset(out / split)
        seen = [0] * len(scenes)
        for i in range(len(ds)):
            sample = ds[i]
            scene = scenes[int(sample["scene"])]
            seen[int(sample["scene"])] += 1
            y, x, h, w = (int(v) for v in sample["window"])
            image = tifffile.imread(root / "scenes" / scene["path"])
            mask_file = root / "labels" / scene["files"]["masks"]
            mask = tifffile.imread(mask_file) if mask_file.suffix == ".tif" else np.asarray(Image.open(mask_file))
            dem = np.load(root / "dem" / scene["files"]["dem"])
            np.testing.assert_array_equal(np.asarray(sample["image"])[:, :h, :w],
                                          image[y:y + h, x:x + w].transpose(2, 0, 1))
            np.testing.assert_array_equal(np.asarray(sample["dem"])[:, :h, :w],
                                          dem[y:y + h, x:x + w].transpose(2, 0, 1))
            got_mask = np.asarray(sample["masks"])
            np.testing.assert_array_equal(got_mask[:h, :w], mask[y:y + h, x:x + w])
            assert (got_mask[h:] == 255).all() and (got_mask[:, w:] == 255).all()  # targets pad with --ignore-index
            part = mask[y:y + h, x:x + w]
            np.testing.assert_array_equal(np.asarray(sample["masks_class_pixels"]),
                                          np.bincount(part[part != 255], minlength=4))
        assert seen == [s["tiles"] for s in scenes]


# --- local: any --workers, either --order


@pytest.mark.parametrize("order", ["shuffled", "source"])
def test_local_conversion_is_byte_identical_for_any_worker_count(dense_data, local_outputs, tmp_path, order):
    reference = local_outputs[order]
    check_tiles_against_sources(reference, dense_data)
    assert sum(s["tiles"] for part in scenes_of(reference).values() for s in part) == 34
    done = convert(dense_data, tmp_path / "two", "--order", order, "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert_same_output(reference, tmp_path / "two")


# --- object storage


@pytest.mark.parametrize("order", ["shuffled", "source"])
def test_scenes_in_a_bucket_convert_to_the_local_bytes(s3, dense_url, local_outputs, remote_outputs, order):  # noqa: F811
    local, remote = local_outputs[order], remote_outputs[order]
    assert scenes_of(remote) == scenes_of(local)  # sizes, tiles, partner files and georeferencing
    assert all(s["files"] and s["georef"]["transform"] for part in scenes_of(remote).values() for s in part)
    for split in ("train", "val"):
        assert documents(remote)[f"{split}/manifest.json"]["provenance"]["source_root"] == f"{dense_url}/scenes"
    ours, theirs = documents(local, RUN_FIELDS), documents(remote, RUN_FIELDS)
    assert theirs["train/manifest.json"]["dataset_id"] == ours["train/manifest.json"]["dataset_id"], (
        "the dataset id (and with it every record's binding) must not depend on where the partner folders are; "
        "provenance.options records --targets as "
        f"{theirs['train/manifest.json']['provenance']['options']['targets']} vs "
        f"{ours['train/manifest.json']['provenance']['options']['targets']}")
    assert_same_output(local, remote, RUN_FIELDS)


# --- a Dask cluster


@pytest.fixture(scope="module")
def dask_client(s3):  # noqa: F811
    distributed = pytest.importorskip("distributed", reason="fastload[dask] (distributed) is not installed")
    saved = os.environ.get("AWS_EC2_METADATA_DISABLED")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # inherited by the worker processes
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=":0") as cluster, \
                distributed.Client(cluster, set_as_default=False) as client:
            yield client
    finally:
        if saved is None:
            os.environ.pop("AWS_EC2_METADATA_DISABLED", None)
        else:
            os.environ["AWS_EC2_METADATA_DISABLED"] = saved


@pytest.mark.parametrize("order", ["shuffled", "source"])
def test_a_dask_cluster_converts_the_bucket_to_the_same_bytes(s3, dense_url, remote_outputs, dask_client,  # noqa: F811
                                                              tmp_path, order):
    """The workers get the credentials as storage_options (pickled with each folder), as a Python caller gives them."""
    out = tmp_path / "dask"
    args = build_parser().parse_args(args_of(dense_url, out, "--order", order))
    args.storage_options = s3[2]
    results = run(args, dask_client)
    assert [r.manifest.total for r in results] == [28, 6]
    assert_same_output(remote_outputs[order], out)  # the bytes of the same conversion in local processes


# --- --resume


def interrupt_after_the_first_shard(args: list[str], out: Path, env: dict) -> None:
    """Start the conversion, Ctrl-C it once its first shard is written, and check it stopped as interrupted."""
    proc = subprocess.Popen([sys.executable, "-m", "fastload.preprocess", *args], env={**os.environ, **env,
                            "FASTLOAD_TEST_SHARD_DELAY": "0.5"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(out.rglob("shard-*.lmdb")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and not list(out.rglob("manifest.json"))
    assert 1 <= len(list(out.rglob("shard-*.lmdb"))) < 6


def replace_object(client, url: str, relpath: str, body: bytes) -> None:
    client.put_object(Bucket=BUCKET, Key=f"{url.removeprefix(f's3://{BUCKET}/')}/{relpath}", Body=body)


def changed_tiff(data: bytes) -> bytes:
    """The same uncompressed TIFF with its last pixel changed: the same size, another ETag."""
    return data[:-1] + bytes([(data[-1] + 1) % 4])


def test_an_interrupted_run_from_a_bucket_resumes_to_the_same_bytes_and_refuses_a_changed_partner(
        s3, dense_data, dense_url, tmp_path, remote_outputs):  # noqa: F811
    _, client, _ = s3
    url = dense_url  # each object changed below is put back (the same bytes: the same ETag)
    env = remote_env(s3)
    first = tmp_path / "first"
    args = args_of(url, first)
    interrupt_after_the_first_shard(args, first, env)
    assert (first / "train" / ".progress.json").exists()  # "b" is a train scene: its files are in the journal
    copies = {what: tmp_path / what for what in ("image", "mask")}
    for copy in copies.values():
        shutil.copytree(first, copy)

    resumed = run_cli("preprocess_tiles", *args, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(remote_outputs["shuffled"], first)

    # Today's rule for a changed image, and the same for a changed mask: the resume is refused (exit 1, the same
    # message), and the completed shards are left as they were.
    refusals = {}
    for what, relpath in (("image", "scenes/b.tif"), ("mask", "labels/b.tif")):
        original = (dense_data / relpath).read_bytes()
        replace_object(client, url, relpath, changed_tiff(original))
        try:
            out = copies[what]
            kept = shard_bytes(out)
            again = run_cli("preprocess_tiles", *args_of(url, out), "--resume", env=env)
        finally:
            replace_object(client, url, relpath, original)  # the same bytes: the same ETag again
        assert again.returncode == 1, f"a {what} changed since the interruption was not noticed:\n{again.stderr}"
        assert "changed source files" in again.stderr and "--overwrite" in again.stderr
        assert shard_bytes(out) == kept and not list(out.rglob("manifest.json"))
        refusals[what] = again.stderr.replace(str(copies[what]), "OUT")
    assert refusals["mask"] == refusals["image"]


# --- errors from object storage


def test_a_missing_or_broken_mask_in_a_bucket_is_named_by_its_url_or_skipped(s3, dense_data, tmp_path):  # noqa: F811
    _, client, _ = s3
    url = upload(client, dense_data, "dense-bad")
    client.delete_object(Bucket=BUCKET, Key="dense-bad/labels/sub/c.png")
    failed = convert(url, tmp_path / "failed", env=remote_env(s3))
    assert failed.returncode == 1, failed.stderr
    assert f"sub/c.tif: no partner file masks ({url}/labels/sub/c.*)" in failed.stderr
    assert "Traceback" not in failed.stderr and not list((tmp_path / "failed").rglob("manifest.json"))

    png = (dense_data / "labels" / "a.png").read_bytes()
    replace_object(client, url, "labels/a.png", png[: len(png) // 2])
    skipped = convert(url, tmp_path / "skipped", "--skip-bad", env=remote_env(s3))
    assert skipped.returncode == 0, skipped.stderr
    listed = {s["path"]: s["error"] for part in documents(tmp_path / "skipped").values() if "skipped" in part
              for s in part["skipped"]}
    assert sorted(listed) == ["a.tif", "sub/c.tif"]
    assert f"{url}/labels/sub/c.*" in listed["sub/c.tif"]
    assert f"masks {url}/labels/a.png" in listed["a.tif"] and "fastload-source-" not in listed["a.tif"]
    assert [s["path"] for part in scenes_of(tmp_path / "skipped").values() for s in part] == ["b.tif", "sub/d.tif"]

    client.upload_file(str(dense_data / "labels" / "sub" / "c.png"), BUCKET, "dense-bad/labels/sub/c.png")
    broken = convert(url, tmp_path / "broken", env=remote_env(s3))  # only the truncated mask now
    assert broken.returncode == 1, broken.stderr
    assert f"masks {url}/labels/a.png" in broken.stderr and "fastload-source-" not in broken.stderr
    assert SECRET not in failed.stderr + skipped.stderr + broken.stderr


def test_mosaic_stitches_a_dataset_in_a_bucket_as_the_local_copy(s3, dense_data, local_outputs, tmp_path):  # noqa: F811
    """Mosaic reads a remote dataset's manifest (its scenes); the stitched bytes equal the local dataset's."""
    import tifffile

    local = local_outputs["shuffled"]
    url = upload(s3[1], local, "dense-shards")
    stitched = {}
    for where, path, extra in (("local", local, {}), ("remote", url, {"storage_options": s3[2]})):
        loader = fastload.ShardLoader(path, split="val", batch_size=5, shuffle=True, seed=2,
                                      **({"cache_dir": tmp_path / "cache"} if extra else {}), **extra)
        with fastload.Mosaic(path, tmp_path / where, channels=3, blend="clip", split="val", fill=7,
                             **extra) as mosaic:
            for batch in loader:
                mosaic.add(batch, batch["image"])
        stitched[where] = {p.relative_to(tmp_path / where).as_posix(): tifffile.imread(p)
                           for p in sorted((tmp_path / where).rglob("*.tif"))}
    assert list(stitched["remote"]) == list(stitched["local"]) == ["sub/d.tif"]  # the val scene, in its folder
    np.testing.assert_array_equal(stitched["remote"]["sub/d.tif"], stitched["local"]["sub/d.tif"])
    scene = tifffile.imread(dense_data / "scenes" / "sub" / "d.tif").transpose(2, 0, 1)
    covered = np.zeros(scene.shape[1:], bool)
    val = fastload.ShardDataset(local / "val", fields=["window"])
    for i in range(len(val)):
        y, x, h, w = val[i]["window"].tolist()
        covered[y:y + h, x:x + w] = True
    out = stitched["local"]["sub/d.tif"]
    np.testing.assert_array_equal(out[:, covered], scene[:, covered])
    assert (out[:, ~covered] == 7).all()  # fill: under tiles --min-labelled dropped, if any
