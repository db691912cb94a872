"""Damaged shards never crash, hang or deliver a wrong sample: byte flips in every region, crafted LMDB fields.

For every codec, two small single-shard datasets: one of small records (inline in leaf pages, enough of
them for a branch page) and one of records that need two overflow pages each. Each trial patches bytes of
a copy of the shard; damage_worker.py reads it with the native loader and with ShardDataset in a
subprocess (batches of trials, a timeout each) and reports, per reader, "ok" (every sample equal to the
undamaged one), a typed fastload error, or something else. Offsets are a deterministic sample of each
region. A trial that kills its batch (a signal) or stalls it is recorded as a crash or a hang and the
rest of the batch runs again in a fresh process. ``pytest -s`` prints the table.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import lmdb
import numpy as np
import pytest

import fastload

CODECS = ["raw", "zstd", "zstd-shuffle", "lz4", "lz4-shuffle", "png", "jpeg"]
FLIPS_PER_REGION = 30
BATCHES = 4
WORKER = Path(__file__).with_name("damage_worker.py")
SHARD = "shard-00000.lmdb"


def u16(b: bytes, at: int) -> int:
    return struct.unpack_from("<H", b, at)[0]


def u64(b: bytes, at: int) -> int:
    return struct.unpack_from("<Q", b, at)[0]


class Layout:
    """The pristine shard's pages and records, found independently of the code under test."""

    def __init__(self, shard: Path) -> None:
        self.bytes = b = shard.read_bytes()
        self.psize = psize = struct.unpack_from("<I", b, 40)[0]
        chosen = 1 if u64(b, psize + 144) > u64(b, 144) else 0
        self.meta = chosen * psize
        self.root = u64(b, self.meta + 128)
        last = u64(b, self.meta + 136)
        self.branches: list[int] = []
        self.leaves: list[int] = []
        self.overflows: list[int] = []
        page = 2
        while page <= last:
            p, flags = page * psize, u16(b, page * psize + 10)
            if flags == 4:
                self.overflows.append(page)
                page += struct.unpack_from("<I", b, p + 12)[0]
                continue
            (self.branches if flags == 1 else self.leaves).append(page)
            page += 1
        env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            self.records = [bytes(v) for _, v in txn.cursor()]
        env.close()

    def nodes(self, page: int) -> list[int]:
        """File offsets of the nodes of a branch or leaf page."""
        p = page * self.psize
        return [p + u16(self.bytes, p + 16 + 2 * i) for i in range((u16(self.bytes, p + 12) - 16) // 2)]

    def regions(self) -> dict[str, list[int]]:
        b, psize = self.bytes, self.psize
        out: dict[str, list[int]] = defaultdict(list)
        out["meta 0"] = list(range(0, 152))
        out["meta 1"] = list(range(psize, psize + 152))
        for page in self.branches:
            p = page * psize
            out["branch page"] += list(range(p, p + u16(b, p + 12))) + list(range(p + u16(b, p + 14), p + psize))
        for page in self.leaves:
            p = page * psize
            out["leaf page"] += list(range(p, p + u16(b, p + 12)))
            for node in self.nodes(page):
                big = u16(b, node + 4) & 1
                out["leaf page"] += list(range(node, node + 16 + (8 if big else 0)))
        for page in self.overflows:
            out["overflow header"] += list(range(page * psize, page * psize + 16))
        for record in self.records:
            at = b.find(record)
            assert at >= 0 and b.find(record, at + 1) < 0
            header = 8 + 24 * u16(record, 6)
            out["record header"] += list(range(at, at + header))
            out["payload"] += list(range(at + header, at + len(record)))
        return dict(out)

    def crafted(self) -> dict[str, list[tuple[int, bytes]]]:
        """Hand-made hostile values in LMDB's meta and page fields."""
        b, psize, meta, root = self.bytes, self.psize, self.meta, self.root
        q = lambda v: struct.pack("<Q", v)  # noqa: E731
        h = lambda v: struct.pack("<H", v)  # noqa: E731
        cases = {
            "page size 0 (meta 0)": [(40, struct.pack("<I", 0))],
            "page size 3 (meta 1)": [(psize + 40, struct.pack("<I", 3))],
            "page size 2**31 (both)": [(40, struct.pack("<I", 2**31)), (psize + 40, struct.pack("<I", 2**31))],
            "page size 8192 (both)": [(40, struct.pack("<I", 8192)), (psize + 40, struct.pack("<I", 8192))],
            "last page 2**64-1": [(meta + 136, q(2**64 - 1))],
            "last page +1": [(meta + 136, q(u64(b, meta + 136) + 1))],
            "root 0": [(meta + 128, q(0))],
            "root 1": [(meta + 128, q(1))],
            "root past the end": [(meta + 128, q(u64(b, meta + 136) + 1))],
            "depth +1": [(meta + 94, h(u16(b, meta + 94) + 1))],
            "depth 0": [(meta + 94, h(0))],
            "entries +1": [(meta + 120, q(u64(b, meta + 120) + 1))],
            "older meta wins": [(meta + 144, q(0)), ((psize - meta) + 144, q(5))],
            "FIXEDMAP flag": [(meta + 44, h(u16(b, meta + 44) | 1))],
            "DUPSORT database": [(meta + 92, h(4))],
            "root mp_lower 15": [(root * psize + 12, h(15))],
            "root mp_lower odd": [(root * psize + 12, h(u16(b, root * psize + 12) + 1))],
            "root mp_lower 16 (no nodes)": [(root * psize + 12, h(16))],
            "root mp_lower 18 (one node)": [(root * psize + 12, h(18))],
            "root mp_upper > page": [(root * psize + 14, h(psize + 2))],
            "node offset 0xFFF0": [(root * psize + 16, h(0xFFF0))],
            "node offset 0": [(root * psize + 16, h(0))],
            "root flags LEAF2": [(root * psize + 10, h(0x20 | u16(b, root * psize + 10)))],
            "root page number in header": [(root * psize, q(root + 1))],
        }
        leaf_node = self.nodes(self.leaves[0])[0]
        cases["F_DUPDATA leaf node"] = [(leaf_node + 4, h(4))]
        cases["F_SUBDATA leaf node"] = [(leaf_node + 4, h(2))]
        cases["key 0 -> 1"] = [(leaf_node + 8, struct.pack(">Q", 1))]
        cases["leaf key size 4096"] = [(leaf_node + 6, h(4096))]
        cases["leaf value size 65535"] = [(leaf_node, h(0xFFFF))]
        if self.branches:
            node1 = self.nodes(self.branches[0])[1]
            cases["branch child = itself (cycle)"] = [(node1, h(self.branches[0] & 0xFFFF)), (node1 + 2, h(0))]
            cases["branch separator 0"] = [(node1 + 8, q(0))]
        if self.overflows:
            nodes = self.nodes(self.leaves[0])
            first, second = nodes[0] + 16, nodes[1] + 16
            cases["overflow pgno +1"] = [(first, q(u64(b, first) + 1))]
            cases["overflow pgno = record 1's"] = [(first, b[second:second + 8])]
            cases["overflow pgno past the end"] = [(first, q(2**64 - 3))]
            op = self.overflows[0] * psize
            cases["overflow run length 2**32-1"] = [(op + 12, struct.pack("<I", 2**32 - 1))]
            cases["overflow run length 1"] = [(op + 12, struct.pack("<I", 1))]
            size = (u16(b, nodes[0]) | u16(b, nodes[0] + 2) << 16) + 4096
            cases["overflow value size +4096"] = [(nodes[0], struct.pack("<HH", size & 0xFFFF, size >> 16))]
        return cases


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[dict]:
    """The trials: (dataset, codec, region, patches), deterministic."""
    root = tmp_path_factory.mktemp("damage")
    rng = np.random.default_rng(0)
    small = {"image": rng.integers(0, 40, (150, 3, 8, 8), dtype=np.uint8), "label": np.arange(150, dtype=np.int64)}
    big = {"image": rng.integers(0, 2**16, (24, 3, 20, 40), dtype=np.uint16), "label": np.arange(24) * 3}
    # jpeg holds uint8 only: noise big enough for two overflow pages per record.
    big8 = {"image": rng.integers(0, 256, (24, 3, 64, 80), dtype=np.uint8), "label": np.arange(24) * 3}
    trials = []
    pick = random.Random(0)
    for codec in CODECS:
        for kind, arrays in (("inline", small), ("overflow", big8 if codec == "jpeg" else big)):
            path = root / f"{kind}-{codec}"
            fastload.write_arrays(path, arrays, codec={"image": codec}, samples_per_shard=1000)
            layout = Layout(path / SHARD)
            assert layout.branches if kind == "inline" else layout.overflows
            for region, offsets in layout.regions().items():
                for offset in sorted(pick.sample(offsets, min(FLIPS_PER_REGION, len(offsets)))):
                    xor = pick.choice([0x01, 0x80, 0xFF, pick.randrange(1, 256)])
                    patch = [[offset, bytes([layout.bytes[offset] ^ xor]).hex()]]
                    trials.append({"dataset": str(path), "codec": codec, "region": region, "patches": patch})
            for name, patches in layout.crafted().items():
                trials.append({"dataset": str(path), "codec": codec, "region": "crafted", "case": name,
                               "patches": [[o, v.hex()] for o, v in patches]})
    for i, t in enumerate(trials):
        t["id"] = i
    return trials


def test_the_harness_sees_wrong_samples_and_crashes(corpus, tmp_path):
    """Controls: a dataset read against another's values is "wrong"; an aborting trial is a crash and the
    trials after it in its batch still run."""
    inline = next(t["dataset"] for t in corpus if "inline-raw" in t["dataset"])
    other = tmp_path / "other"  # the same schema, one label differs
    ds = fastload.ShardDataset(inline)
    images = np.stack([ds[i]["image"].numpy() for i in range(len(ds))])
    labels = np.array([int(ds[i]["label"]) for i in range(len(ds))])
    labels[77] += 1
    fastload.write_arrays(other, {"image": images, "label": labels}, samples_per_shard=1000)
    trials = [{"id": 0, "dataset": inline, "patches": []},
              {"id": 1, "dataset": inline, "reference": str(other), "patches": []},
              {"id": 2, "dataset": inline, "control": "abort", "patches": []},
              {"id": 3, "dataset": inline, "patches": []}]
    results = run_batch(trials, tmp_path)
    assert results[0]["native"] == results[0]["torch"] == "ok"
    assert results[1]["native"] == results[1]["torch"] == "wrong:sample 77"
    assert results[2]["native"] == "crash"
    assert results[3]["native"] == results[3]["torch"] == "ok" and results[3]["validators"] == "same"


def run_batch(trials: list[dict], workdir: Path) -> dict[int, dict]:
    """Run trials in worker processes until each has a result; a trial that kills or stalls its worker
    gets "crash" or "hang" for the reader it was in, and the rest run again."""
    results: dict[int, dict] = {}
    todo = list(trials)
    while todo:
        job = {"workdir": str(workdir), "trials": todo}
        timeout = 60 + 3 * len(todo)
        try:
            proc = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(job), capture_output=True,
                                  text=True, timeout=timeout)
            out, err, status = proc.stdout, proc.stderr, ("crash" if proc.returncode != 0 else None)
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout or ""
            out, err, status = stdout.decode() if isinstance(stdout, bytes) else stdout, "", "hang"
        started = None
        for line in out.splitlines():
            msg = json.loads(line)
            if "starting" in msg:
                started = msg
            else:
                results[msg["id"]] = msg
                started = None
        if status is None:
            missing = [t["id"] for t in todo if t["id"] not in results]
            assert not missing, f"worker ended without results for {missing}: {err[-2000:]}"
            break
        assert started is not None, f"worker failed outside any trial ({status}): {err[-2000:]}"
        results[started["id"]] = {"id": started["id"], started["starting"]: status, "stderr": err[-500:]}
        todo = [t for t in todo if t["id"] not in results]
        for leftover in workdir.glob("trial-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    return results


def classify(verdict: str | None) -> str:
    if verdict is None:
        return "not run"
    if verdict == "ok":
        return "harmless"
    if verdict.startswith("typed:"):
        return "typed error"
    return verdict.split(":")[0]


# About 3,000 trials over seven codecs: 1.5 minutes in a plain build, 4.5 under ASan with the machine
# half idle, more when it is loaded (the suite's 300 s is too short there). A hung trial is still caught.
@pytest.mark.timeout(900)
def test_damage_is_never_a_crash_a_hang_or_a_wrong_sample(corpus, tmp_path):
    batches = [corpus[i::BATCHES] for i in range(BATCHES)]
    results: dict[int, dict] = {}
    for batch in batches:
        results.update(run_batch(batch, tmp_path))
    table: dict[tuple[str, str], Counter] = defaultdict(Counter)
    bad = []
    for t in corpus:
        r = results[t["id"]]
        row = table[(t["region"], t["codec"])]
        row["trials"] += 1
        for reader in ("native", "torch"):
            kind = classify(r.get(reader))
            row[f"{reader} {kind}"] += 1
            if kind not in ("harmless", "typed error") or (t["region"] == "crafted" and kind == "harmless"):
                bad.append((t.get("case", t["region"]), t["codec"], t["patches"], reader, r.get(reader)))
        if r.get("validators") != "same":
            bad.append((t.get("case", t["region"]), t["codec"], t["patches"], "validators", r.get("validators")))
    print_table(table)
    assert not bad, "\n".join(map(str, bad[:40]))


def print_table(table: dict[tuple[str, str], Counter]) -> None:
    cols = ["trials", "native typed error", "native harmless", "torch typed error", "torch harmless"]
    print(f"\n{'region':<16} {'codec':<13}" + "".join(f"{c:>20}" for c in cols) + "  other")
    total: Counter = Counter()
    for (region, codec), row in sorted(table.items()):
        total.update(row)
        other = {k: v for k, v in row.items() if k not in cols}
        print(f"{region:<16} {codec:<13}" + "".join(f"{row[c]:>20}" for c in cols) + f"  {other or ''}")
    other = {k: v for k, v in total.items() if k not in cols}
    print(f"{'total':<30}" + "".join(f"{total[c]:>20}" for c in cols) + f"  {other or ''}")
