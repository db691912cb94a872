"""One rank of the two-process torch.distributed test (run by test_distributed.py)."""

import json
import sys

import torch.distributed as dist

from fastload import ShardLoader

if __name__ == "__main__":
    path, out, even = sys.argv[1], sys.argv[2], sys.argv[3] == "even"
    # Built before the process group exists: rank and world size are read when the pass starts.
    loader = ShardLoader(path, batch_size=6, shuffle=True, seed=11, even_batches=even)
    dist.init_process_group("gloo")  # MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE from the test
    try:
        assert len(loader) == 9, len(loader)  # 52 (or 51) samples of 103 on each of 2 ranks
        labels = [b["label"].tolist() for b in loader]
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, len(labels))
        with open(out, "w") as f:
            json.dump({"rank": loader.rank, "world_size": loader.world_size, "labels": labels, "counts": counts}, f)
    finally:
        dist.destroy_process_group()
