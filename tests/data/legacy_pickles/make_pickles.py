"""Write ``pickles.pkl``: loaders, datasets and states pickled by one version of fastload.

The committed ``pickles.pkl`` was written by main at commit 012670a, before the package was grouped
into stage folders (issue 12), so it names the old module paths (``fastload._loader.ShardLoader``,
``fastload._format.Field``, ...). tests/test_legacy_pickles.py loads it with the current code.
Run from an empty directory: ``python make_pickles.py OUT.pkl`` (the dataset it makes is
``./dataset``, a relative path, so the test can rebuild it anywhere).
"""

import pickle
import sys

import numpy as np

import fastload
from fastload.transforms import RandomCrop, RandomFlip


def arrays():
    """Return the dataset's arrays (tests/test_legacy_pickles.py writes the same)."""
    rng = np.random.default_rng(12)
    return {"image": rng.integers(0, 255, (40, 8, 8, 3), dtype=np.uint8), "label": np.arange(40, dtype=np.int64) % 5}


def main() -> None:
    fastload.write_arrays("dataset", arrays(), samples_per_shard=16)
    ds = fastload.ShardDataset("dataset")
    blobs = {}
    native = fastload.ShardLoader("dataset", batch_size=4, shuffle=True, seed=7, num_threads=2)
    it = iter(native)
    next(it), next(it)
    blobs["native_loader"] = pickle.dumps(native)
    blobs["native_state"] = pickle.dumps(native.state_dict())
    torch_loader = fastload.ShardLoader(ds, batch_size=4, seed=8, backend="torch", num_workers=0,
                                        transforms=[RandomCrop(6), RandomFlip()], layout="hwc",
                                        sample_weights=np.linspace(1, 2, 40), num_samples=24)
    it = iter(torch_loader)
    next(it)
    blobs["torch_loader"] = pickle.dumps(torch_loader)
    subset = fastload.ShardLoader(ds.subset([3, 1, 4, 15, 9, 26]), batch_size=2, seed=9)
    blobs["subset_loader"] = pickle.dumps(subset)
    blobs["concat_loader"] = pickle.dumps(fastload.ShardLoader(fastload.concat([ds, ds]), batch_size=8, seed=10))
    mixed = fastload.ShardLoader(fastload.mix([ds, ds], weights=[1, 3]), batch_size=8, seed=11)
    blobs["mix_loader"] = pickle.dumps(mixed)
    blobs["dataset"] = pickle.dumps(ds)
    blobs["field"] = pickle.dumps(ds.fields[0])
    blobs["order"] = pickle.dumps(fastload.EpochOrder(3, 1, 40))
    with open(sys.argv[1], "wb") as f:
        pickle.dump({"fastload": fastload.__version__, "blobs": blobs}, f)
    for name, blob in blobs.items():
        print(name, len(blob))


if __name__ == "__main__":
    main()
