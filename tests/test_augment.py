"""Transforms in the loader: any thread count and both backends give the same augmented batches, resume
reproduces them, output= tuples, batch_transform with its keyed generator, and the ShardDataset subclass error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import batches_equal

import fastload
from fastload import ShardDataset, ShardLoader
from fastload.transforms import Normalize, RandomCrop, RandomDihedral, RandomFlip, SelectChannels, ToDtype

OPS = [RandomCrop(10, padding=2), RandomDihedral(), RandomFlip(vertical=True), SelectChannels([2, 0]),
       Normalize([100.0, 50.0], [30.0, 20.0], dtype="bfloat16")]


@pytest.fixture(scope="module")
def seg_dataset(tmp_path_factory):
    """60 samples: a 3x12x12 uint8 image, its 12x12 mask (image channel 0 > 127) and a label; zstd, 4 shards."""
    out = tmp_path_factory.mktemp("seg") / "ds"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (60, 3, 12, 12), dtype=np.uint8)
    fastload.write_arrays(out, {"image": images, "mask": (images[:, 0] > 127).astype(np.uint8),
                                "label": np.arange(60, dtype=np.int64)}, codec={"image": "zstd"}, samples_per_shard=16)
    return out


def epoch_batches(path, backend, epoch=1, **kwargs):
    loader = ShardLoader(path, batch_size=8, shuffle=True, seed=11, transforms=OPS, backend=backend, **kwargs)
    loader.set_epoch(epoch)
    return list(loader)


def test_same_augmented_batches_for_any_thread_count_and_both_backends(seg_dataset):
    reference = epoch_batches(seg_dataset, "native", num_threads=1)
    assert reference[0]["image"].dtype == torch.bfloat16 and reference[0]["image"].shape == (8, 2, 10, 10)
    for threads in (2, 4):
        assert batches_equal(epoch_batches(seg_dataset, "native", num_threads=threads), reference)
    for workers in (0, 2):
        assert batches_equal(epoch_batches(seg_dataset, "torch", num_workers=workers), reference)
    other_epoch = epoch_batches(seg_dataset, "native", epoch=2, num_threads=2)
    assert not batches_equal(other_epoch, reference)


def test_pinned_slots_hold_the_transformed_fields(seg_dataset):
    from test_device import TrackingAllocator

    loader = ShardLoader(seg_dataset, batch_size=8, shuffle=True, seed=11, transforms=OPS, num_threads=2)
    loader._host_allocator = TrackingAllocator()
    loader.set_epoch(1)
    assert batches_equal(list(loader), epoch_batches(seg_dataset, "native", num_threads=1))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_mid_epoch_resume_reproduces_the_augmented_batches(seg_dataset, backend):
    def noise(batch, generator):
        batch["noise"] = torch.rand(len(batch["label"]), generator=generator)
        return batch

    kwargs = dict(batch_size=8, shuffle=True, seed=5, transforms=OPS, batch_transform=noise, backend=backend,
                  num_threads=2, num_workers=0)
    full = list(ShardLoader(seg_dataset, **kwargs))
    first = ShardLoader(seg_dataset, **kwargs)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    resumed = ShardLoader(seg_dataset, **kwargs)
    resumed.load_state_dict(state)
    assert batches_equal(head + list(resumed), full)
    assert len({b["noise"][0].item() for b in full}) == len(full)  # a generator per batch, not one reused


def test_joint_transforms_keep_the_mask_aligned_with_the_image(seg_dataset):
    ops = [RandomCrop(10, padding=3), RandomDihedral(), RandomFlip(vertical=True)]
    for batch in ShardLoader(seg_dataset, batch_size=16, shuffle=True, seed=2, transforms=ops, num_threads=2):
        inside = batch["image"][:, 0] > 127
        # padding writes 0 into both, and 0 > 127 is False: the mask stays the image's mask everywhere
        assert torch.equal(batch["mask"].bool(), inside)


def test_output_yields_tuples_in_that_order(seg_dataset):
    loader = ShardLoader(seg_dataset, batch_size=8, output=("image", "label"),
                         transforms=[ToDtype(torch.float32, scale=1 / 255)])
    batches = list(loader)
    for x, y in batches:
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 12, 12) and y.dtype == torch.int64
    assert loader.stats()["samples"] == 60
    with pytest.raises(ValueError, match=r"output=\('image', 'labels'\) names unknown field\(s\) \['labels'\]"):
        ShardLoader(seg_dataset, output=("image", "labels"))


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_batch_transform_generator_is_keyed_by_seed_epoch_and_batch(seg_dataset, backend):
    seen = []

    def record(batch, generator):
        seen.append(torch.randint(0, 2**62, (1,), generator=generator).item())

    loader = ShardLoader(seg_dataset, batch_size=8, seed=1, batch_transform=record, backend=backend, num_workers=0)
    list(loader)
    first_epoch = list(seen)
    seen.clear()
    loader.set_epoch(0)
    list(loader)
    assert seen == first_epoch and len(set(first_epoch)) == len(first_epoch)
    seen.clear()
    list(loader)  # epoch 1
    assert seen != first_epoch


def test_a_shard_dataset_subclass_with_getitem_is_refused_by_the_native_backend(seg_dataset):
    class Augmented(ShardDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            sample["image"] = sample["image"].flip(-1)
            return sample

    with pytest.raises(TypeError, match=r"Augmented overrides __getitem__, which backend='native' never calls.*"
                                        r"transforms=\[\.\.\.\].*backend='torch'"):
        ShardLoader(Augmented(seg_dataset), backend="native")
    ShardLoader(Augmented(seg_dataset), backend="torch", num_workers=0)  # its Python code runs there
    ShardLoader(ShardDataset(seg_dataset), backend="native")  # the class itself is fine


def test_transform_errors_surface_at_construction(seg_dataset):
    with pytest.raises(ValueError, match=r"RandomCrop.*field 'image'.*larger than the sample"):
        ShardLoader(seg_dataset, transforms=[RandomCrop(13)])
    with pytest.raises(ValueError, match=r"SelectChannels.*field 'image'.*\[5\] out of range"):
        ShardLoader(seg_dataset, transforms=[SelectChannels([5])], backend="torch", num_workers=0)
    with pytest.raises(ValueError, match=r"RandomFlip.*field 'mask'.*no such field"):
        ShardLoader(seg_dataset, fields=["image", "label"], transforms=[RandomFlip(fields=["image", "mask"])])


def test_native_stats_count_transform_time(seg_dataset):
    loader = ShardLoader(seg_dataset, batch_size=8, transforms=OPS, num_threads=2)
    list(loader)
    assert loader._last_stats["transform_s"] > 0


def test_readme_augmentation_snippet_runs_as_written(tmp_path):
    from test_readme import snippet

    rng = np.random.default_rng(4)
    path = tmp_path / "train"
    fastload.write_arrays(path, {"image": rng.integers(0, 4000, (40, 4, 16, 16), dtype=np.uint16),
                                 "label": np.arange(40, dtype=np.int64) % 10}, codec="zstd-shuffle")
    source = snippet("Augmentation", {'"shards/train"': repr(str(path)), "batch_size=256": "batch_size=8",
                                      "RandomCrop(224, padding=8)": "RandomCrop(12, padding=2)",
                                      "range(10)": "range(2)"})
    namespace: dict = {}
    exec(compile(source, "README.md", "exec"), namespace)
    x, y = next(iter(namespace["loader"]))
    assert x.dtype == torch.float32 and x.shape == (8, 3, 12, 12) and y.shape == (8,)


def test_transforms_with_a_concatenation_and_weighted_sampling_agree_across_backends(seg_dataset, tmp_path):
    other = tmp_path / "other"
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, (20, 3, 12, 12), dtype=np.uint8)
    fastload.write_arrays(other, {"image": images, "mask": (images[:, 0] > 127).astype(np.uint8),
                                  "label": np.arange(20, dtype=np.int64)}, codec={"image": "zstd"})
    both = fastload.concat([seg_dataset, other], with_source=True)
    runs = {}
    for backend in ("native", "torch"):
        loader = ShardLoader(both, batch_size=8, shuffle=True, seed=4, transforms=OPS, backend=backend,
                             num_threads=2, num_workers=0, output=("image", "source"))
        runs[backend] = list(loader)
    assert len(runs["native"]) == 10
    for (xn, sn), (xt, st) in zip(runs["native"], runs["torch"]):
        assert xn.dtype == torch.bfloat16 and torch.equal(xn, xt) and torch.equal(sn, st)
    weighted = {}
    for backend in ("native", "torch"):
        loader = ShardLoader(seg_dataset, batch_size=8, seed=4, transforms=OPS, backend=backend, num_threads=2,
                             num_workers=0, sample_weights=np.linspace(1, 2, 60), num_samples=40)
        loader.set_epoch(3)
        weighted[backend] = list(loader)
    assert batches_equal(weighted["native"], weighted["torch"])


def test_transforms_refuse_a_concatenation_of_different_layouts(seg_dataset, tmp_path):
    other = tmp_path / "raw"
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, (20, 3, 12, 12), dtype=np.uint8)
    fastload.write_arrays(other, {"image": images, "mask": (images[:, 0] > 127).astype(np.uint8),
                                  "label": np.arange(20, dtype=np.int64)}, codec="raw")
    with pytest.raises(ValueError, match="transforms= with a concatenation of datasets that store their records "
                                         "differently is not supported yet"):
        ShardLoader(fastload.concat([seg_dataset, other]), transforms=OPS)
