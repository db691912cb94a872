"""Consumer-thread CPU time per batch (time.thread_time), small 3x32x32 records, batch 256, 8 threads."""
import cProfile
import pstats
import sys
import time

import torch

import fastload

path = sys.argv[1]
def measure(**kw):
    loader = fastload.ShardLoader(path, batch_size=256, shuffle=True, seed=1, num_threads=8, **kw)
    for _ in loader:  # warm
        pass
    best = None
    for _ in range(3):
        t0, w0, n = time.thread_time(), time.perf_counter(), 0
        for _ in loader:
            n += 1
        if kw.get("device"):
            torch.cuda.synchronize()
        t, w = time.thread_time() - t0, time.perf_counter() - w0
        best = min(best or (1e9, 0, 0), (t / n * 1e6, w / n * 1e6, n * 256 / w))
    return best

for kw in ({"pin_memory": False}, {"pin_memory": True}, {"device": "cuda"}):
    cpu_us, wall_us, rate = measure(**kw)
    print(f"{fastload.__file__.split('/')[2]} {kw}: consumer CPU {cpu_us:.1f} us/batch, "
          f"wall {wall_us:.1f} us/batch, {rate / 1e6:.2f} M samples/s", flush=True)

if len(sys.argv) > 2:
    loader = fastload.ShardLoader(path, batch_size=256, shuffle=True, seed=1, num_threads=8, device="cuda")
    for _ in loader:
        pass
    prof = cProfile.Profile()
    prof.enable()
    for _ in loader:
        pass
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
