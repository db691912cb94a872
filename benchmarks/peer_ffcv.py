"""FFCV (``ffcv``, MadryLab) as an optional peer of the first-epoch benchmark (issue 26).

Not a dependency of fastload or of its tests: it is skipped where ``import ffcv`` fails. FFCV builds a C
extension against OpenCV and libjpeg-turbo and JIT-compiles its pipelines with numba; docs/benchmarks.md
says how it was installed for the figures there. The same samples as a fastload benchmark dataset are
written into one ``.beton`` file (the image as an ``NDArrayField``, uncompressed: FFCV has no zstd; the
label as an ``IntField``) and read by ``ffcv.Loader``: random order, seed 0, ``os_cache=True`` (the file
mapped, read through the page cache, as fastload reads its shards), batch 256, its default
``batches_ahead=3``, ``num_workers`` threads. Each configuration runs in a fresh process timed by the same
loop as fastload's (``first_epoch_child.measure_epochs``).

Run as ``python peer_ffcv.py convert SOURCE OUT`` or ``python peer_ffcv.py epochs PATH THREADS EPOCHS``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BATCH_SIZE = 256


def available() -> bool:
    """Return whether ffcv is installed (its import, with numba and its extension, is tried in the child)."""
    return importlib.util.find_spec("ffcv") is not None


def converted(source: Path) -> Path:
    """Return an FFCV copy of the fastload dataset ``source`` (written once, in a fresh process)."""
    out = source.with_name(f"{source.name}-ffcv.beton")
    if not out.exists():
        part = out.with_name(out.name + ".part")
        subprocess.run([sys.executable, __file__, "convert", str(source), str(part)], check=True)
        part.rename(out)
    return out


def run_child(path: Path, threads: int, epochs: int) -> dict:
    """Run ``epochs`` epochs of FFCV over ``path`` in a fresh process; return its rows (as first_epoch_child's)."""
    done = subprocess.run([sys.executable, __file__, "epochs", str(path), str(threads), str(epochs)],
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


class _Samples:
    """A fastload dataset's samples as FFCV's writer takes them: ``(image, label)`` by index."""

    def __init__(self, source: str) -> None:
        import fastload

        dataset = fastload.ShardDataset(source)
        arrays = dataset.read_batch(range(len(dataset)))
        self.images = arrays["image"].numpy()
        self.labels = arrays["label"].numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.images[index], int(self.labels[index])


def _convert(source: str, out: str) -> None:
    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    samples = _Samples(source)
    image = samples.images[0]
    fields = {"image": NDArrayField(image.dtype, image.shape), "label": IntField()}
    DatasetWriter(out, fields, num_workers=1).from_indexed_dataset(samples)


def _epochs(path: str, threads: int, epochs: int) -> None:
    from first_epoch_child import measure_epochs, peak_rss_mb

    started = time.perf_counter()
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.ndarray import NDArrayDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor

    imported = time.perf_counter() - started
    loader = Loader(path, batch_size=BATCH_SIZE, num_workers=threads, order=OrderOption.RANDOM, os_cache=True,
                    drop_last=False, seed=0,
                    pipelines={"image": [NDArrayDecoder(), ToTensor()], "label": [IntDecoder(), ToTensor()]})
    rows = measure_epochs(epochs, lambda epoch: loader, lambda batch: len(batch[1]))  # each pass: its next epoch
    print(json.dumps({"import_s": imported, "peak_rss_mb": peak_rss_mb(), "epochs": rows}))


if __name__ == "__main__":
    if sys.argv[1] == "convert":
        _convert(sys.argv[2], sys.argv[3])
    else:
        _epochs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
