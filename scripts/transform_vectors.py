"""Regenerate tests/data/transform_vectors.json: the transforms' random draws, pinned (docs/TRANSFORMS.md).

Run only when the draws change on purpose (a new TRANSFORMS_VERSION): the
committed file is what every later version must reproduce.
"""

import json
from pathlib import Path

import numpy as np

from fastload.transforms import AxisMasks, RandomCrop, RandomDihedral, RandomErasing, RandomFlip, RandomRot90
from fastload.transforms._program import Program
from fastload.transforms._reference import float32_to
from fastload.transforms._rng import TRANSFORMS_VERSION, draw, op_keys

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "transform_vectors.json"


def main() -> None:
    """Write the vectors."""
    indices = [0, 1, 2, 7, 1000, 2**40 + 3]
    keys = []
    for seed, epoch, position in [(0, 0, 0), (0, 0, 1), (1, 0, 0), (0, 1, 0), (-5, 3, 2), (2**64 - 1, 2**32, 7)]:
        k = op_keys(seed, epoch, np.array(indices, np.uint64), position)
        keys.append({"seed": seed, "epoch": epoch, "position": position, "indices": indices,
                     "keys": [int(v) for v in k], "draw0": [int(v) for v in draw(k, 0)],
                     "draw1": [int(v) for v in draw(k, 1)]})
    ops = [RandomCrop((6, 6), padding=2), RandomFlip(horizontal=True, vertical=True), RandomRot90(), RandomDihedral()]
    program = Program(ops, [("image", "uint8", (3, 9, 9))])
    params = program.params(42, 3, np.arange(16, dtype=np.uint64))
    fill_ops = [RandomErasing(p=0.8), AxisMasks("width", 4, count=2), AxisMasks("height", 3)]
    fill = Program(fill_ops, [("image", "uint8", (2, 12, 16))])
    fill_params = fill.params(7, 1, np.arange(16, dtype=np.uint64))
    values = np.array([0.0, -0.0, 1.0, 1.0009765625, 65504.0, 65519.0, 65520.0, 1e-5, 6e-8, 2.9e-8, -3.0e-8,
                       1 / 3, 3.14159265, -1e38, float("inf")], np.float32)
    data = {"transforms_version": TRANSFORMS_VERSION, "keys": keys,
            "chain": {"ops": [repr(op) for op in ops], "seed": 42, "epoch": 3, "indices": list(range(16)),
                      "params": params.tolist()},
            "fill_chain": {"ops": [repr(op) for op in fill_ops], "seed": 7, "epoch": 1, "indices": list(range(16)),
                           "params": fill_params.tolist()},
            "float16": {"in": values.tolist(), "bits": float32_to(values, "float16").view(np.uint16).tolist()},
            "bfloat16": {"in": values.tolist(), "bits": float32_to(values, "bfloat16").tolist()}}
    OUT.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
