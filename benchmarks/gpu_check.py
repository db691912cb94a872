"""On a machine with a GPU: check ShardLoader(device="cuda") and measure host-to-device bandwidth.

Run: ``python benchmarks/gpu_check.py [--samples 4096]``. It writes a tiles dataset (3x128x128 uint8),
then checks that device batches equal the CPU batches bit for bit (and that the loader's pool is
page-locked), and compares the bandwidth of the loader's side-stream copies with a plain
``pinned_tensor.to("cuda", non_blocking=True)`` of the same bytes. Exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import fastload


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiles"
        images = rng.integers(0, 255, (args.samples, 3, 128, 128), dtype=np.uint8)
        fastload.write_arrays(path, {"image": images, "label": np.arange(args.samples, dtype=np.int64)})
        cpu = fastload.ShardLoader(path, batch_size=args.batch_size, shuffle=True, seed=1, pin_memory=True)
        gpu = fastload.ShardLoader(path, batch_size=args.batch_size, shuffle=True, seed=1, device="cuda")
        first = next(iter(cpu))
        print(f"pinned pool: {first['image'].is_pinned()}")
        mismatches = 0
        cpu.set_epoch(0)
        for a, b in zip(cpu, gpu):
            assert b["image"].is_cuda
            mismatches += int(not torch.equal(a["image"], b["image"].cpu()))
            mismatches += int(not torch.equal(a["label"], b["label"].cpu()))
        print(f"device batches equal CPU batches: {mismatches == 0}")

        # The common idiom with a GPU that lags: non_blocking copies of pinned batches.
        reference = list(fastload.ShardLoader(path, batch_size=args.batch_size, shuffle=True, seed=1,
                                              pin_memory=False))
        copies = []
        for batch in fastload.ShardLoader(path, batch_size=args.batch_size, shuffle=True, seed=1, pin_memory=True):
            torch.cuda._sleep(2_000_000)
            copies.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
        torch.cuda.synchronize()
        idiom = sum(int(not torch.equal(r[k], c[k].cpu())) for r, c in zip(reference, copies) for k in r)
        print(f"non_blocking copies of pinned batches, GPU lagging: {idiom} mismatched tensors")
        mismatches += idiom

        nbytes = args.samples * (3 * 128 * 128 + 8)
        for _ in range(2):  # the second pass is the timed one (warm pool, warm page cache)
            gpu.set_epoch(0)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for batch in gpu:
                batch["image"].float().mean()  # a use on the current stream
            torch.cuda.synchronize()
            loader_s = time.perf_counter() - start
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        plain_s = time.perf_counter() - start
        print(f"ShardLoader(device='cuda'), whole epoch incl. decode: {nbytes / loader_s / 1e9:.2f} GB/s")
        print(f"plain pinned tensor.to('cuda') of the same bytes:    {nbytes / plain_s / 1e9:.2f} GB/s")
        print(f"loader stats: {gpu.stats()}")
        print(f"pinned host memory: {torch.cuda.host_memory_stats().get('allocated_bytes.peak', 'n/a')} bytes at peak")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
