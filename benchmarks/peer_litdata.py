"""LitData (Lightning AI's ``litdata``) as an optional peer of the object-storage benchmarks.

Not a dependency of fastload or of its tests: ``pip install litdata`` to include it (it is skipped
otherwise). The same samples as a fastload benchmark dataset are written in LitData's format
(``litdata.optimize``, 64 MB chunks, the image as a uint8 array and the label as an int), uploaded
beside fastload's shards, and read with ``StreamingDataset`` + ``StreamingDataLoader`` (shuffled,
seed 0, its default ``max_pre_download=2`` chunks).

One patch, as the issue said: LitData's obstore client options have no ``allow_http``, so it cannot
reach a plain-http endpoint such as moto's; :func:`allow_plain_http` adds it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def available() -> bool:
    """Return whether litdata is installed."""
    return importlib.util.find_spec("litdata") is not None


def converted(source: Path) -> Path:
    """Return a LitData copy of the fastload dataset ``source`` (written once, in a fresh process)."""
    out = source.with_name(f"{source.name}-litdata")
    if not (out / "index.json").exists():
        subprocess.run([sys.executable, __file__, str(source), str(out)], check=True)
    return out


def allow_plain_http() -> None:
    """Let LitData's obstore downloads reach an ``http://`` endpoint (its client options lack ``allow_http``)."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


def loader(url: str, cache_dir: Path, options: dict[str, Any], batch_size: int, workers: int) -> Any:
    """Return LitData's loader over ``url`` (fastload-style storage ``options`` of the moto server)."""
    from litdata import StreamingDataLoader, StreamingDataset

    allow_plain_http()
    storage = {"endpoint_url": options["endpoint"], "aws_access_key_id": options["access_key_id"],
               "aws_secret_access_key": options["secret_access_key"], "region_name": options["region"]}
    dataset = StreamingDataset(url, cache_dir=str(cache_dir), storage_options=storage, shuffle=True, seed=0)
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers)


def _convert(source: str, out: str) -> None:
    from litdata import optimize

    os.environ[_SOURCE_ENV] = source  # LitData's workers read the samples themselves (forked or spawned)
    count = len(_arrays()["label"])
    optimize(fn=_sample, inputs=list(range(count)), output_dir=out, chunk_bytes="64MB", num_workers=1,
             mode="overwrite")


_SOURCE_ENV = "FASTLOAD_LITDATA_SOURCE"
_ARRAYS: dict[str, Any] = {}


def _arrays() -> dict[str, Any]:
    if not _ARRAYS:
        import fastload

        dataset = fastload.ShardDataset(os.environ[_SOURCE_ENV])
        _ARRAYS.update({name: t.numpy() for name, t in dataset.read_batch(range(len(dataset))).items()})
    return _ARRAYS


def _sample(index: int) -> dict[str, Any]:
    arrays = _arrays()
    return {"image": arrays["image"][index], "label": int(arrays["label"][index])}


if __name__ == "__main__":
    _convert(sys.argv[1], sys.argv[2])
