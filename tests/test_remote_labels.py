"""preprocess_tiles --labels s3://.../labels.csv: a label file in object storage (moto's S3 server on 127.0.0.1).

The promise: a label CSV read from a bucket labels the samples as the same CSV read from a local file,
with a local or a remote --data-dir, through the command line (credentials from the environment) and
from Python (``args.storage_options``); the shards differ only by the dataset id, which the
``--labels`` location enters as a recorded option. A missing object, a bucket without a key and a
bad row are typed errors naming the URL, never a credential.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from test_remote import BUCKET, SECRET, s3, upload  # noqa: F401  (s3: the module's server fixture)
from test_remote_output import s3_env

import fastload
from fastload.conversion.preprocess import build_parser, run
from fastload.errors import SourceError

pytestmark = pytest.mark.slow  # tier: the moto S3 server and preprocess_tiles processes


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def labelled(s3, two_class_pngs, tmp_path_factory):  # noqa: F811
    """The PNGs (local and uploaded) and a class-name label CSV (local and uploaded): (pngs, pngs URL, csv, csv URL)."""
    _, client, _ = s3
    relpaths = sorted(p.relative_to(two_class_pngs).as_posix() for p in two_class_pngs.rglob("*.png"))
    csv = tmp_path_factory.mktemp("labels") / "labels.csv"
    # a header with the columns out of the usual order, class names, CRLF line ends: all read as locally
    csv.write_text("kind,file\r\n" + "".join(f"{('owl', 'cat', 'eel')[i % 3]},{p}\r\n" for i, p in enumerate(relpaths)),
                   newline="")
    client.upload_file(str(csv), BUCKET, "meta/labels.csv")
    return two_class_pngs, upload(client, two_class_pngs, "labelled-pngs"), csv, f"s3://{BUCKET}/meta/labels.csv"


def convert(data: Path | str, labels: Path | str, out: Path, storage_options: dict | None = None) -> None:
    """Run preprocess_tiles from Python: 32-pixel tiles, zstd, a 0.3 validation split, --label-column kind."""
    args = build_parser().parse_args(["--data-dir", str(data), "--output-dir", str(out), "--labels", str(labels),
                                      "--label-column", "kind", "--tile-size", "32", "--stride", "24", "--codec",
                                      "zstd", "--shard-size", "20KB", "--val-fraction", "0.3", "--no-progress"])
    args.storage_options = storage_options
    run(args)


def samples(root: Path) -> dict[str, list]:
    """Return each split's samples (image bytes and label, in stored order) and class names."""
    out: dict[str, list] = {}
    for split in ("train", "val"):
        ds = fastload.ShardDataset(root / split)
        out[split] = [ds.classes] + [(ds[i]["image"].numpy().tobytes(), int(ds[i]["label"])) for i in range(len(ds))]
    return out


def manifest_beyond_the_labels_location(path: Path) -> dict:
    """The manifest without what the --labels location and the run change: the id, the shards' hashes.

    The location is a recorded option, so it enters the dataset id, which every record is bound to
    (docs/FORMAT.md): a local copy of the CSV at another path changes them as much.
    """
    doc = json.loads(path.read_text())
    doc["provenance"].pop("created")
    doc["provenance"]["options"].pop("labels")
    doc.pop("dataset_id", None)
    for shard in doc["shards"]:
        shard.pop("hash")
    return doc


@pytest.mark.parametrize("remote_data", [False, True])
def test_a_label_file_in_a_bucket_labels_as_the_local_file(s3, labelled, tmp_path, remote_data):  # noqa: F811
    pngs, pngs_url, csv, csv_url = labelled
    data = pngs_url if remote_data else pngs
    convert(data, csv, tmp_path / "local-csv", s3[2])
    convert(data, csv_url, tmp_path / "remote-csv", s3[2])
    expected = samples(tmp_path / "local-csv")
    assert expected["train"][0] == ["cat", "eel", "owl"] and len(expected["train"]) > 10
    assert samples(tmp_path / "remote-csv") == expected
    for split in ("train", "val"):
        theirs = json.loads((tmp_path / "remote-csv" / split / "manifest.json").read_text())
        assert theirs["provenance"]["options"]["labels"] == csv_url
        assert manifest_beyond_the_labels_location(tmp_path / "remote-csv" / split / "manifest.json") == \
            manifest_beyond_the_labels_location(tmp_path / "local-csv" / split / "manifest.json")


def test_the_command_line_reads_a_label_url_with_credentials_from_the_environment(s3, labelled, tmp_path):  # noqa: F811
    pngs, pngs_url, csv, csv_url = labelled
    convert(pngs, csv, tmp_path / "local", s3[2])
    done = run_cli("preprocess_tiles", "--data-dir", pngs_url, "--output-dir", str(tmp_path / "cli"), "--labels",
                   csv_url, "--label-column", "kind", "--tile-size", "32", "--stride", "24", "--codec", "zstd",
                   "--shard-size", "20KB", "--val-fraction", "0.3", "--no-progress",
                   env={**s3_env(s3), "AWS_EC2_METADATA_DISABLED": "true"})
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert samples(tmp_path / "cli") == samples(tmp_path / "local")
    missing = run_cli("preprocess_tiles", "--data-dir", str(pngs), "--output-dir", str(tmp_path / "m"), "--labels",
                      f"s3://{BUCKET}/meta/nope.csv", env={**s3_env(s3), "AWS_EC2_METADATA_DISABLED": "true"})
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert f"s3://{BUCKET}/meta/nope.csv: label file not found" in missing.stderr
    assert SECRET not in missing.stderr


def test_bad_label_urls_are_typed_errors_naming_the_url_never_a_credential(s3, labelled, tmp_path):  # noqa: F811
    _, client, options = s3
    pngs, _, _, _ = labelled
    client.put_object(Bucket=BUCKET, Key="meta/bad.csv", Body=b"path,kind\ncats/0.png,0\ncats/missing.png,1\n")
    client.put_object(Bucket=BUCKET, Key="meta/latin1.csv", Body="path,kind\ncats/0.png,caf\xe9\n".encode("latin-1"))
    cases = {f"s3://{BUCKET}/meta/bad.csv": f"s3://{BUCKET}/meta/bad.csv line 3: cats/missing.png names a file missing",
             f"s3://{BUCKET}/meta/latin1.csv": f"s3://{BUCKET}/meta/latin1.csv: not UTF-8 text",
             f"s3://{BUCKET}/meta/none.csv": f"s3://{BUCKET}/meta/none.csv: label file not found",
             f"s3://{BUCKET}": f"s3://{BUCKET}: --labels names a bucket, not a CSV file",
             f"s3://{BUCKET}/meta/x.csv?token=abcdef": f"s3://{BUCKET}/meta/x.csv: a dataset URL takes no user"}
    for url, message in cases.items():
        with pytest.raises(SourceError) as err:
            convert(pngs, url, tmp_path / "out", options)
        assert message in str(err.value) and SECRET not in str(err.value) and "abcdef" not in str(err.value)
    assert not list((tmp_path / "out").rglob("manifest.json"))
