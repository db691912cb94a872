"""ShardDataset.read_batch: a whole batch decoded into one array per field (the torch backend's fetch)."""

import numpy as np
import pytest
import torch
from conftest import smooth_images
from test_corruption import flip_record_byte

import fastload
from fastload import ShardDataset
from fastload.errors import CorruptRecordError


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(50, (2, 6, 6), "uint16"),
                                "mask": (smooth_images(50, (6, 6), seed=1) > 100),
                                "label": np.arange(50, dtype=np.int64)},
                          codec={"image": "zstd-shuffle", "mask": "zstd"}, samples_per_shard=16)
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_read_batch_equals_stacked_samples(mixed, shared):
    ds = ShardDataset(mixed)
    indices = [49, 3, 17, 3, 32, 0]  # several shards, a repeat, out of order
    batch = ds.read_batch(indices, shared=shared)
    for name in ("image", "mask", "label"):
        expected = torch.stack([ds[i][name] for i in indices])
        assert batch[name].dtype == expected.dtype and torch.equal(batch[name], expected)
        assert batch[name].is_shared() == shared
    assert ds.read_batch([])["image"].shape == (0, 2, 6, 6)


def test_read_batch_of_selected_fields(mixed):
    batch = ShardDataset(mixed, fields=["label"]).read_batch([5, 6])
    assert list(batch) == ["label"] and batch["label"].tolist() == [5, 6]


def test_read_batch_names_a_corrupt_record(tmp_path):
    out = tmp_path / "ds"
    fastload.write_arrays(out, {"image": np.arange(40 * 12, dtype=np.uint8).reshape(40, 12),
                                "label": np.arange(40, dtype=np.int64)}, samples_per_shard=20)
    flip_record_byte(out / "shard-00001.lmdb", 4)
    ds = ShardDataset(out)
    assert ds.read_batch([1, 2])["label"].tolist() == [1, 2]
    with pytest.raises(CorruptRecordError, match=r"shard-00001\.lmdb record 4: field 1: checksum mismatch"):
        ds.read_batch([1, 24])
    assert ShardDataset(out, verify_checksums=False).read_batch([24])["label"].shape == (1,)


@pytest.mark.parametrize("held", ["global", "cycle"])
def test_a_dataset_left_open_at_interpreter_exit_says_nothing(tmp_path, held):
    """A script that never closes its dataset (held in a global, or in a reference cycle) exits 0, silently."""
    import subprocess
    import sys

    fastload.write_arrays(tmp_path / "ds", {"x": np.arange(10, dtype=np.int64)})
    drop = "" if held == "global" else "ds.me = ds; del ds"  # opened shards stay open until the very end
    code = f"import fastload; ds = fastload.ShardDataset({str(tmp_path / 'ds')!r}); print(ds[3]['x']); {drop}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "tensor(3)", proc.stderr
    assert proc.stderr == "", proc.stderr
