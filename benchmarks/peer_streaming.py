"""MosaicML Streaming (``mosaicml-streaming``) as an optional peer of the object-storage benchmarks.

Not a dependency of fastload or of its tests, and skipped when it cannot be imported. ``import
streaming`` also imports its ``vision`` and ``text`` packages. Those need torchvision (which does not
import against this project's CPU torch) and transformers, and its ``base`` package's
``StreamingDataLoader`` needs transformers too. This peer uses none of them. It loads
``StreamingDataset`` and ``MDSWriter`` alone (:func:`streaming_base`), so Streaming can be installed
without those packages:

    pip install --no-deps -c .venv/torch-constraint.txt mosaicml-streaming zstd python-snappy cramjam \
        Brotli catalogue xxhash

The same samples as a fastload benchmark dataset are written in Streaming's MDS format (64 MB shards,
the image as a fixed-shape uint8 array, the label as an int, uncompressed), uploaded beside
fastload's shards, and read with ``StreamingDataset`` (shuffled, seed 0, its defaults otherwise)
through a ``torch.utils.data.DataLoader`` with the same batch size.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any


def streaming_base() -> tuple[Any, Any] | None:
    """Return (StreamingDataset, MDSWriter) without running ``streaming/__init__.py``, or None if not installed."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = list(spec.submodule_search_locations)[0]
        for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
            package = types.ModuleType(name)  # a bare package: its submodules import, its __init__ does not run
            package.__path__ = [path]
            package.__package__ = name
            sys.modules[name] = package
    try:
        from streaming.base.dataset import StreamingDataset
        from streaming.base.format.mds.writer import MDSWriter
    except ImportError:
        return None
    return StreamingDataset, MDSWriter


def available() -> bool:
    """Return whether Streaming's dataset and writer import here."""
    return streaming_base() is not None


def converted(source: Path) -> Path:
    """Return a Streaming (MDS) copy of the fastload dataset ``source`` (written once, in a fresh process)."""
    out = source.with_name(f"{source.name}-streaming")
    if not (out / "index.json").exists():
        subprocess.run([sys.executable, __file__, str(source), str(out)], check=True)
    return out


def loader(url: str, cache_dir: Path, options: dict[str, Any], batch_size: int, workers: int) -> Any:
    """Return a DataLoader over Streaming's dataset at ``url`` (fastload-style storage ``options`` of the moto server).

    Streaming's S3 client (boto3) takes its endpoint and credentials from the environment only.
    """
    import torch

    found = streaming_base()
    assert found is not None
    StreamingDataset = found[0]
    os.environ.update({"S3_ENDPOINT_URL": options["endpoint"], "AWS_ACCESS_KEY_ID": options["access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
                       "AWS_DEFAULT_REGION": options["region"]})
    dataset = StreamingDataset(remote=url, local=str(cache_dir), shuffle=True, shuffle_seed=0, batch_size=batch_size)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)


def _convert(source: str, out: str) -> None:
    import fastload

    found = streaming_base()
    assert found is not None
    MDSWriter = found[1]
    dataset = fastload.ShardDataset(source)
    arrays = {name: t.numpy() for name, t in dataset.read_batch(range(len(dataset))).items()}
    images, labels = arrays["image"], arrays["label"]
    shape = ",".join(str(n) for n in images.shape[1:])
    columns = {"image": f"ndarray:uint8:{shape}", "label": "int"}
    with MDSWriter(out=out, columns=columns, size_limit="64mb") as writer:
        for image, label in zip(images, labels):
            writer.write({"image": image, "label": int(label)})


if __name__ == "__main__":
    _convert(sys.argv[1], sys.argv[2])
