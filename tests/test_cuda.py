"""Real GPU tests (marker ``cuda``; ``make test-gpu``): skipped, and reported as skipped, without CUDA.

They check what fake CUDA operations cannot: that page-locked batches survive every
copy a user may queue from them, that ``device="cuda"`` batches equal the CPU ones,
and that page-locked memory stays bounded when the GPU lags.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import batches_equal, smooth_images

import fastload
from fastload import ShardLoader
from fastload.loading._device import CudaOps
from fastload.loading._pinned import pinned_block_bytes

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SLEEP_CYCLES = 2_000_000  # about a millisecond of GPU time: keeps the GPU behind the loop


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda-tiles") / "ds"
    fastload.write_arrays(out, {"image": smooth_images(600, (3, 64, 64)), "label": np.arange(600, dtype=np.int64)},
                          codec={"image": "zstd"}, samples_per_shard=200)
    return out


def cpu_reference(path, epoch, **kwargs):
    loader = ShardLoader(path, batch_size=64, shuffle=True, seed=1, pin_memory=False, **kwargs)
    loader.set_epoch(epoch)
    return list(loader)


def to_cpu(batch):
    return {k: v.cpu() for k, v in batch.items()}


def test_device_batches_equal_cpu_batches_over_epochs_break_and_del(tiles):
    loader = ShardLoader(tiles, batch_size=64, shuffle=True, seed=1, num_threads=4, device="cuda")
    for epoch in range(3):
        loader.set_epoch(epoch)
        got = [to_cpu(b) for b in loader]
        assert all(b["image"].device.type == "cpu" for b in got)
        assert batches_equal(got, cpu_reference(tiles, epoch))
    loader.set_epoch(0)
    for i, _ in enumerate(loader):  # break with copies in flight
        if i == 2:
            break
    it = iter(loader)
    next(it)
    del it  # del with copies in flight
    loader.set_epoch(1)
    assert batches_equal([to_cpu(b) for b in loader], cpu_reference(tiles, 1))


@pytest.mark.parametrize("user_stream", [False, True])
def test_non_blocking_copies_of_pinned_batches_while_the_gpu_lags(tiles, user_stream):
    # The common idiom: copy each pinned batch with non_blocking=True while the GPU is still
    # busy with earlier work. The host memory must not be rewritten before each copy ran.
    loader = ShardLoader(tiles, batch_size=64, shuffle=True, seed=1, num_threads=4, pin_memory=True)
    stream = torch.cuda.Stream() if user_stream else torch.cuda.current_stream()
    on_gpu = []
    with torch.cuda.stream(stream):
        for batch in loader:
            assert batch["image"].is_pinned()
            torch.cuda._sleep(SLEEP_CYCLES)
            on_gpu.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
            del batch
    torch.cuda.synchronize()
    assert batches_equal([to_cpu(b) for b in on_gpu], cpu_reference(tiles, 0))


def test_pinned_batches_kept_across_steps_are_not_rewritten(tiles):
    loader = ShardLoader(tiles, batch_size=64, shuffle=True, seed=1, num_threads=4, pin_memory=True)
    kept = [{k: v.clone() for k, v in b.items()} for b in loader]
    loader.set_epoch(0)
    held = list(loader)
    for _ in ShardLoader(tiles, batch_size=64, shuffle=True, seed=2, pin_memory=True):
        pass
    assert batches_equal(held, kept)


class SlowCopies(CudaOps):
    """CudaOps whose side stream sleeps before every copy: copies lag behind the loop."""

    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(SLEEP_CYCLES * 4)
        return super().copy(batch)


def test_pinned_memory_is_bounded_when_copies_lag(tiles):
    torch.cuda.synchronize()
    torch._C._host_emptyCache()
    torch.cuda.reset_peak_host_memory_stats()
    loader = ShardLoader(tiles, batch_size=32, shuffle=True, seed=1, num_threads=2, prefetch=3, device="cuda")
    loader._transfer_ops = SlowCopies(torch.device("cuda"))
    got = [to_cpu(b) for b in loader]
    torch.cuda.synchronize()
    reference = ShardLoader(tiles, batch_size=32, shuffle=True, seed=1, pin_memory=False)
    assert batches_equal(got, list(reference))
    stats = torch.cuda.host_memory_stats()
    bound_blocks = loader.prefetch + 2 * loader.max_copies_in_flight
    assert stats["allocations.peak"] <= bound_blocks
    slot = 32 * (3 * 64 * 64 + 8) + 64
    assert stats["allocated_bytes.peak"] <= bound_blocks * pinned_block_bytes(slot)
    s = loader.stats()
    assert s["copy_wait_s"] > 0 and s["h2d_s"] > 0 and s["read_s"] > 0 and "decompress_s" in s


def test_pinned_tile_batches_in_a_small_training_step(tiles):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ShardLoader(tiles, batch_size=64, shuffle=True, seed=1, pin_memory=True)
    seen = []
    for batch in loader:
        images = batch["image"].to("cuda", non_blocking=True).float() / 255
        labels = batch["label"].to("cuda", non_blocking=True) % 10
        seen.append(labels)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    assert torch.isfinite(loss).item()
    expected = torch.cat([b["label"] for b in cpu_reference(tiles, 0)]) % 10
    assert torch.equal(torch.cat(seen).cpu(), expected)


def test_cuda_arguments_are_accepted(tiles):
    assert ShardLoader(tiles, pin_memory=True).pin_memory
    batch = next(iter(ShardLoader(tiles, batch_size=4, device="cuda")))
    assert batch["image"].is_cuda and batch["label"].is_cuda
