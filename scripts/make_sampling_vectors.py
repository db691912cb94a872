"""Write tests/data/sampling_vectors.json: golden vectors of sampling version 1 (docs/ORDER.md, "Sampling").

Run once when a sampling version is introduced; the committed file then pins the
functions. Changing any of them must bump SAMPLING_VERSION and add new vectors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from fastload.sampling._alias import SAMPLING_VERSION, TAG_WEIGHTS, AliasTable, quantize, stream_base, words
from fastload.sampling._exactlog import neg_log
from fastload.sampling._sampling import MixSampling, SubsetSampling, WeightedSampling

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "sampling_vectors.json"


def hexf(x: float) -> str:
    return struct.pack(">d", x).hex()


def main() -> None:
    doc: dict = {"sampling_version": SAMPLING_VERSION}
    doc["streams"] = [{"seed": s, "epoch": e, "tag": TAG_WEIGHTS, "base": stream_base(s, e, TAG_WEIGHTS),
                       "words": words(stream_base(s, e, TAG_WEIGHTS), np.arange(8, dtype=np.uint64)).tolist()}
                      for s, e in ((0, 0), (1, 0), (0, 1), (2**64 - 1, 12345))]
    tables = []
    for weights in ([1.0], [1.0, 3.0], [0.1, 0.0, 0.5, 2.5, 1e-9, 0.3], list(np.linspace(0.0, 1.0, 11))):
        table = AliasTable(quantize(weights))
        base = stream_base(7, 3, TAG_WEIGHTS)
        tables.append({"weights": weights, "threshold": table.threshold.tolist(), "alias": table.alias.tolist(),
                       "draws_seed7_epoch3": table.draw(words(base, np.arange(32, dtype=np.uint64))).tolist()})
    doc["alias_tables"] = tables
    u = [1e-300, 2.0**-53, 0.1, 0.25, 0.5, 0.7071067811865476, 0.75, 0.9999999999999999, 1.0]
    doc["neg_log"] = [[hexf(x), hexf(float(y))] for x, y in zip(u, neg_log(np.array(u)))]
    weights = np.linspace(0.1, 2.0, 50)
    epochs = []
    for replacement in (True, False):
        for seed, epoch in ((0, 0), (3, 5)):
            order = WeightedSampling(weights, 20, replacement).epoch_order(seed, epoch, 50, False)
            epochs.append({"mode": "weights", "weights": "linspace(0.1, 2.0, 50)", "num_samples": 20,
                           "replacement": replacement, "seed": seed, "epoch": epoch,
                           "indices": order.indices().tolist()})
    subset = SubsetSampling(np.arange(100, 0, -7, dtype=np.uint64))
    for seed, epoch in ((0, 0), (9, 2)):
        epochs.append({"mode": "subset", "indices_given": "arange(100, 0, -7)", "shuffle": True, "seed": seed,
                       "epoch": epoch, "indices": subset.epoch_order(seed, epoch, 101, True).indices().tolist()})
    for stop in ("first_exhausted", "all_exhausted", 40):
        for shuffle in (False, True):
            mix = MixSampling([10, 4, 7], [0.5, 0.2, 0.3], stop)
            order = mix.epoch_order(4, 1, 21, shuffle)
            epochs.append({"mode": "mix", "sizes": [10, 4, 7], "weights": [0.5, 0.2, 0.3], "stop": stop,
                           "shuffle": shuffle, "seed": 4, "epoch": 1, "sources": mix.sources(4, 1).tolist(),
                           "indices": order.indices().tolist()})
    doc["epochs"] = epochs
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
