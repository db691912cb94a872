import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tier: two-process gloo runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["even", "uneven"])
def test_two_process_gloo_run_splits_the_epoch(small_dataset, tmp_path, mode):
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).with_name("dist_worker.py")),
                                       str(small_dataset), str(tmp_path / f"rank{rank}.json"), mode], env=env))
    for p in procs:
        assert p.wait(timeout=120) == 0
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and all(r["world_size"] == 2 for r in results)
    parts = [sum(r["labels"], []) for r in results]
    assert set(parts[0] + parts[1]) == {7 * i for i in range(103)}
    if mode == "even":
        assert results[0]["counts"] == results[1]["counts"]  # same number of batches on both ranks
        assert len(parts[0]) == len(parts[1]) == 52  # 103 padded to 104 by wrap-around
    else:
        assert sorted(parts[0] + parts[1]) == [7 * i for i in range(103)]  # an exact partition
        assert (len(parts[0]), len(parts[1])) == (52, 51)
