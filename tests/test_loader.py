import numpy as np
import pytest
import torch
from conftest import BACKENDS, batches_equal

import fastload
from fastload import ShardLoader


def labels_of(batches):
    return [b["label"].tolist() for b in batches]


def epoch(loader, e=0):
    loader.set_epoch(e)
    return list(loader)


@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_for_every_thread_count_backend_and_run(small_dataset, shuffle):
    reference = epoch(ShardLoader(small_dataset, batch_size=10, shuffle=shuffle, seed=5, backend="torch",
                                  num_workers=0), 2)
    for threads in (1, 2, 4, 8):
        for _ in range(2):
            got = epoch(ShardLoader(small_dataset, batch_size=10, shuffle=shuffle, seed=5, num_threads=threads,
                                    backend="native"), 2)
            assert batches_equal(got, reference), threads
    workers = epoch(ShardLoader(small_dataset, batch_size=10, shuffle=shuffle, seed=5, backend="torch",
                                num_workers=2), 2)
    assert batches_equal(workers, reference)


def test_batches_match_the_reference_dataset(small_dataset):
    ds = fastload.ShardDataset(small_dataset)
    for batch_list in (epoch(ShardLoader(small_dataset, batch_size=16, shuffle=True, seed=1, backend=b))
                       for b in BACKENDS):
        for batch in batch_list:
            for row, label in enumerate(batch["label"].tolist()):
                item = ds[label // 7]
                assert torch.equal(batch["image"][row], item["image"])
                assert batch["image"].dtype == torch.uint8 and batch["label"].dtype == torch.int64


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_sample_once_per_epoch_and_epochs_differ(small_dataset, backend):
    loader = ShardLoader(small_dataset, batch_size=8, shuffle=True, seed=0, backend=backend)
    orders = [sum(labels_of(epoch(loader, e)), []) for e in (0, 1)]
    for order in orders:
        assert sorted(order) == [7 * i for i in range(103)]
    assert orders[0] != orders[1]
    other_seed = sum(labels_of(epoch(ShardLoader(small_dataset, batch_size=8, shuffle=True, seed=1,
                                                 backend=backend))), [])
    assert other_seed != orders[0]


def test_epoch_advances_after_a_full_pass_and_set_epoch_selects(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=50, shuffle=True)
    first, second = labels_of(list(loader)), labels_of(list(loader))
    assert loader.epoch == 2 and first != second
    loader.set_epoch(0)
    assert labels_of(list(loader)) == first
    it = iter(loader)  # an abandoned pass still uses up its epoch: the next pass reads the next one
    next(it)
    del it
    assert loader.epoch == 2
    loader.set_epoch(1)
    assert labels_of(list(loader)) == second


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("batch_size", "drop_last", "sizes"), [
    (1, False, [1] * 103), (13, False, [13] * 7 + [12]), (13, True, [13] * 7),
    (200, False, [103]), (200, True, []), (103, True, [103]),
])
def test_batch_sizes_and_drop_last(small_dataset, backend, batch_size, drop_last, sizes):
    loader = ShardLoader(small_dataset, batch_size=batch_size, drop_last=drop_last, shuffle=True, backend=backend)
    batches = list(loader)
    assert [len(b["label"]) for b in batches] == sizes
    assert len(loader) == len(sizes)
    assert all(b["image"].shape[1:] == (3, 8, 8) for b in batches)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_dataset(empty_dataset, backend):
    loader = ShardLoader(empty_dataset, batch_size=4, backend=backend)
    assert len(loader) == 0 and list(loader) == []


def test_list_equals_batches_taken_one_at_a_time(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=9, shuffle=True, seed=3, num_threads=2, prefetch=2)
    everything = epoch(loader)
    one_by_one = []
    loader.set_epoch(0)
    for batch in loader:
        one_by_one.append({k: v.clone() for k, v in batch.items()})
    assert batches_equal(everything, one_by_one)
    pointers = {b["image"].data_ptr() for b in everything}
    assert len(pointers) == len(everything)  # distinct buffers while all are held


def test_field_selection(small_dataset):
    for backend in BACKENDS:
        batch = next(iter(ShardLoader(small_dataset, batch_size=4, fields=["label"], backend=backend)))
        assert list(batch) == ["label"] and batch["label"].tolist() == [0, 7, 14, 21]


def test_argument_errors(small_dataset, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not 0"):
        ShardLoader(small_dataset, batch_size=0)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['mask'\]"):
        ShardLoader(small_dataset, fields=["mask"])
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        ShardLoader(small_dataset, num_threads=0)
    with pytest.raises(ValueError, match="backend must be"):
        ShardLoader(small_dataset, backend="jax")
    with pytest.raises(fastload.DatasetError, match="no such dataset directory"):
        ShardLoader(tmp_path / "nothing")
    with pytest.raises(TypeError, match="dataset directory or a ShardDataset"):
        ShardLoader(42)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA (tests/test_cuda.py)")
def test_pin_memory_without_cuda_is_refused(small_dataset):
    with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
        ShardLoader(small_dataset, pin_memory=True)


def test_backend_from_environment(small_dataset, monkeypatch):
    monkeypatch.setenv("FASTLOAD_BACKEND", "torch")
    assert ShardLoader(small_dataset).backend == "torch"
    monkeypatch.setenv("FASTLOAD_BACKEND", "native")
    assert ShardLoader(small_dataset).backend == "native"


def test_auto_workers_on_windows_load_in_process_with_a_warning(small_dataset, monkeypatch):
    import platform

    monkeypatch.setattr(platform, "system", lambda: "Windows")
    with pytest.warns(RuntimeWarning, match="in-process on Windows"):
        loader = ShardLoader(small_dataset, backend="torch")
    assert loader.num_workers == 0
    assert ShardLoader(small_dataset, backend="torch", num_workers=2).num_workers == 2


def test_loader_attributes(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=10)
    assert loader.batch_size == 10 and len(loader.dataset) == 103 and len(loader) == 11
    assert isinstance(loader.dataset, fastload.ShardDataset)
    assert ShardLoader(loader.dataset, batch_size=3).dataset is loader.dataset


def test_tensors_view_the_pool_without_copies(small_dataset):
    loader = ShardLoader(small_dataset, batch_size=8, backend="native")
    batch = next(iter(loader))
    array = batch["image"].numpy()
    assert array.ctypes.data == batch["image"].data_ptr()
    assert batch["image"].is_contiguous() and np.shares_memory(array, batch["image"].numpy())
