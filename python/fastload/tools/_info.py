"""Describing a dataset (``fastload info DIR``) and this installation (``fastload info``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from ..format._codecs import CODECS
from ..format._manifest import load_manifest
from ..format._splits import read_splits
from ..storage import RemoteSpec, is_remote, open_remote, redact, remote_splits


def describe_dataset(directory: str | os.PathLike) -> str:
    """Return a human-readable summary of a dataset, or of every split of a root with ``splits.json``.

    ``directory`` may be a URL of object storage: only its manifests are fetched (into the cache).
    """
    if is_remote(directory):
        return _describe_remote(str(directory))
    splits = read_splits(directory)
    if splits is None:
        return _describe_one(Path(directory))
    lines = [f"dataset root {directory}: splits {', '.join(splits)}"]
    for name, entry in splits.items():
        line = f"  {name}: {entry.get('samples')} samples from {entry.get('sources')} source images"
        if entry.get("class_counts"):
            line += "; per class: " + ", ".join(f"{c} {n}" for c, n in entry["class_counts"].items())
        lines.append(line)
    for name, entry in splits.items():
        lines.append(f"[{name}] " + _describe_one(Path(directory) / str(entry["path"])))
    return "\n".join(lines)


def _describe_remote(url: str) -> str:
    spec = RemoteSpec.build(None, None, None)
    splits = remote_splits(url, spec)
    targets = {None: url} if splits is None else splits
    parts = [] if splits is None else [f"dataset root {redact(url)}: splits {', '.join(splits)}"]
    for name, split_url in targets.items():
        cached = open_remote(split_url, None, spec)
        text = _describe_one(cached.path, shown=cached.url)
        parts.append(text if name is None else f"[{name}] {text}")
        cached.release()
    return "\n".join(parts)


def _describe_one(directory: Path, shown: str | None = None) -> str:
    m = load_manifest(directory)
    shard_bytes = sum(s.bytes for s in m.shards)
    decoded = m.total * sum(f.nbytes for f in m.fields)
    identity = f", dataset id {m.dataset_id}" if m.format_version >= 3 else " (shards not bound to the dataset)"
    lines = [f"dataset {shown or directory}",
             f"  format version {m.format_version}{identity}, fingerprint {m.fingerprint}",
             f"  {m.total} samples in {len(m.shards)} shards, {shard_bytes / 1e6:.2f} MB on disk, "
             f"{decoded / 1e6:.2f} MB decoded" + (f" (ratio {decoded / shard_bytes:.2f}x)" if shard_bytes else ""),
             "  fields:"]
    for f in m.fields:
        opts = "".join(f" {k}={v}" for k, v in f.codec_options.items())
        lines.append(f"    {f.name}: {f.dtype} {list(f.shape)} codec {f.codec}{opts}")
    if m.extra.get("classes"):
        lines.append(f"  classes: {', '.join(m.extra['classes'])}")
    scenes = m.extra.get("scenes")
    if isinstance(scenes, list) and scenes:
        georef = sum(1 for sc in scenes if isinstance(sc, dict) and sc.get("georef"))
        lines.append(f"  scenes: {len(scenes)} (tiles carry scene and window; {georef} georeferenced)")
    for role in ("targets", "inputs"):
        if isinstance(m.extra.get(role), list) and m.extra[role]:
            lines.append(f"  {role}: {', '.join(str(n) for n in m.extra[role])}")
    if m.extra.get("no_tiles"):
        lines.append(f"  source files smaller than the tile (no tiles): {len(m.extra['no_tiles'])}")
    if m.extra.get("skipped"):
        lines.append(f"  skipped source files: {len(m.extra['skipped'])}")
    if m.provenance:
        lines.append(f"  created {m.provenance.get('created')} by {m.provenance.get('tool')} "
                     f"from {m.provenance.get('source_root')}")
    return "\n".join(lines)


def describe_installation() -> str:
    """Return platform, CPU count, native extension, codecs and library versions."""
    import numpy
    import torch

    from .._extension import IMPORT_ERROR

    if IMPORT_ERROR is None:
        native = f"built (codecs: {', '.join(CODECS)}; checksum XXH3-64)"
    else:
        native = f"not available ({IMPORT_ERROR})"
    cpus = os.cpu_count() or 1
    cuda = torch.cuda.is_available()
    lines = [f"platform: {platform.platform()} ({platform.machine()}), python {platform.python_version()}",
             f"cpus: {cpus}", f"native extension: {native}",
             f"cuda: {'available, ' + torch.cuda.get_device_name(0) if cuda else 'not available'}",
             f"torch {torch.__version__}, numpy {numpy.__version__}",
             f"recommended: num_threads={min(cpus, 8)} for ShardLoader; "
             f"num_workers={0 if platform.system() == 'Windows' else min(cpus, 8)} for DataLoader"]
    return "\n".join(lines)
