"""The issue-9 idiom: pinned batches copied with non_blocking=True while the GPU lags. Counts mismatches."""
import sys

import numpy as np
import torch

import fastload


def write(path, n, shape):
    rng = np.random.default_rng(0)
    fastload.write_arrays(path, {"image": rng.integers(0, 255, (n, *shape), dtype=np.uint8),
                                 "label": np.arange(n, dtype=np.int64)}, overwrite=True)

def run(path, pin, stream=None, sleep=2_000_000, threads=8):
    kw = dict(batch_size=256, shuffle=True, seed=1, num_threads=threads)
    ref = [{k: v.clone() for k, v in b.items()} for b in fastload.ShardLoader(path, pin_memory=False, **kw)]
    copies = []
    loader = fastload.ShardLoader(path, **kw) if pin == "auto" else fastload.ShardLoader(path, pin_memory=pin, **kw)
    for batch in loader:
        torch.cuda._sleep(sleep)
        if stream is None:
            copies.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
        else:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                copies.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
    torch.cuda.synchronize()
    bad = sum(int(not torch.equal(r["image"], c["image"].cpu()) or not torch.equal(r["label"], c["label"].cpu()))
              for r, c in zip(ref, copies))
    return bad, len(ref), len(copies)

if __name__ == "__main__":
    root = sys.argv[1]
    write(root + "/tiles", 20_000, (3, 128, 128))
    write(root + "/small", 200_000, (3, 32, 32))
    if "--write-only" in sys.argv:
        sys.exit(0)
    for name in ("tiles", "small"):
        for pin, stream in (("auto", None), (True, None), (True, torch.cuda.Stream()), (False, None)):
            bad, n, m = run(f"{root}/{name}", pin, stream)
            where = "user" if stream else "current"
            print(f"{fastload.__file__.split('/')[2]} {name:5s} pin={pin!s:5s} stream={where}:"
                  f" {bad}/{n} batches differ (copies {m})", flush=True)
