"""The loader's side of transforms: the compiled chain, per-batch Python hooks and tuple output.

Kept apart from ``_loader.py``: the loader builds one ``Augment`` and asks it
for the output fields (what the native slots hold), the per-batch parameters
(``Program.params``), the torch backend's reference pass, and the last step
of every batch (``batch_transform``, then ``output=`` tuples).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..format._record import max_sample_bytes
from ..transforms import Program, Transform
from ..transforms._reference import apply
from ..transforms._rng import mix64
from ..transforms._spec import storage_dtype
from ._dataset import ShardDataset

BatchTransform = Callable[[dict[str, torch.Tensor], torch.Generator], Any]
BATCH_TAG = 0x62617463685F666E  # ASCII "batch_fn"


def torch_dtype(name: str) -> torch.dtype:
    """Return the torch dtype of a field dtype name (including bfloat16)."""
    return getattr(torch, name) if name != "bool" else torch.bool


def check_dataset_class(dataset: Any, backend: str) -> None:
    """Refuse a ShardDataset subclass that overrides ``__getitem__`` with the native backend, which never calls it."""
    if backend != "native":
        return
    for part in getattr(dataset, "datasets", [dataset]):  # a concatenation or mixture: each of its datasets
        if isinstance(part, ShardDataset):
            _check_class(type(part))


def _check_class(cls: type) -> None:
    overridden = [m for m in ("__getitem__", "__getitems__", "read_batch", "read_arrays")
                  if getattr(cls, m, None) is not getattr(ShardDataset, m, None)]
    if overridden:
        raise ArgumentTypeError(
            f"{cls.__name__} overrides {', '.join(overridden)}, which backend='native' never calls (its C++ "
            "threads read the shards directly), so its batches would silently differ from backend='torch'. "
            "Declare the augmentation with transforms=[...] (fastload.transforms) or batch_transform=fn, "
            "or pass backend='torch' to run the subclass's Python code in DataLoader workers.")


def describe(transforms: Sequence[Transform] | None, layout: str | Mapping[str, str],
             batch_transform: BatchTransform | None) -> dict[str, Any]:
    """Return what of the augmentation a saved state records, so that a resume under another one is refused.

    ``transforms``: each op and its parameters (``Transform.describe``);
    ``layout``: only with transforms (it changes nothing without them);
    ``batch_transform``: the function's qualified name. A function cannot be
    compared, so only its presence is checked (``_state.check_state``).
    """
    ops = [op.describe() if isinstance(op, Transform) else repr(op) for op in transforms or ()]
    lay: Any = None
    if ops:
        lay = layout if isinstance(layout, str) else {str(k): v for k, v in sorted(layout.items())}
    name = None
    if batch_transform is not None:
        name = f"{getattr(batch_transform, '__module__', None) or ''}." \
               f"{getattr(batch_transform, '__qualname__', type(batch_transform).__qualname__)}".lstrip(".")
    return {"transforms": ops, "layout": lay, "batch_transform": name}


class Augment:
    """A loader's transforms (compiled for its fields), ``batch_transform`` and ``output`` order."""

    def __init__(self, dataset: Any, transforms: Sequence[Transform] | None,
                 layout: str | Mapping[str, str], batch_transform: BatchTransform | None,
                 output: Sequence[str] | None, seed: int) -> None:
        fields = [(f.name, f.dtype, f.shape) for f in dataset.fields]
        targets = getattr(dataset, "target_fields", ())
        self.program = Program(list(transforms), fields, layout, max_sample_bytes(), targets) if transforms else None
        if batch_transform is not None and not callable(batch_transform):
            raise ArgumentTypeError(
                f"batch_transform must be callable as fn(batch, generator), not {batch_transform!r}")
        self.batch_transform = batch_transform
        if isinstance(output, str):
            output = (output,)
        if transforms and not getattr(dataset, "same_layout", True):
            raise ArgumentError("transforms= with a concatenation of datasets that store their records differently "
                             "is not supported yet; concatenate datasets of one layout")
        names = [f.name for f in dataset.fields] + (["source"] if getattr(dataset, "with_source", False) else [])
        if output is not None:
            unknown = [n for n in output if n not in names]
            if unknown or not output:
                raise ArgumentError(f"output={tuple(output)!r} names unknown field(s) {unknown}; "
                                 f"the loader yields {names}")
        self.output = tuple(output) if output is not None else None
        self.seed = seed
        self.description = describe(transforms, layout, batch_transform)

    @property
    def transforms(self) -> bool:
        """Return whether there is a transform chain to run on every sample."""
        return self.program is not None and bool(self.program.steps)

    def field_specs(self, dataset: Any) -> list[tuple[str, np.dtype, torch.dtype, tuple[int, ...]]]:
        """Return (name, numpy storage dtype, torch dtype, shape) of each yielded field, after the transforms."""
        out = []
        for f in dataset.fields:
            if self.program is None:
                out.append((f.name, f.np_dtype, torch_dtype(f.dtype), f.shape))
            else:
                s = self.program.outputs[f.name]
                out.append((f.name, storage_dtype(s.dtype), torch_dtype(s.dtype), s.shape))
        return out

    def native_steps(self, dataset: ShardDataset) -> tuple[list[tuple], int]:
        """Return the steps (schema field indices) and parameters per sample for ``_native.BatchReader``."""
        if not self.transforms:
            return [], 0
        assert self.program is not None
        index = {f.name: i for i, f in enumerate(dataset.manifest.fields)}
        return [s.native(index[s.field]) for s in self.program.steps], self.program.num_params

    def params(self, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        """Return the samples' transform parameters ``[n, num_params]``, or None without transforms."""
        if not self.transforms:
            return None
        assert self.program is not None
        return self.program.params(self.seed, epoch, indices)

    def reference(self, batch: dict[str, torch.Tensor], epoch: int, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Apply the chain to a decoded batch with the numpy reference (the torch backend's path)."""
        if not self.transforms:
            return batch
        assert self.program is not None
        arrays = {k: v.numpy() for k, v in batch.items()}
        out = apply(self.program, arrays, self.program.params(self.seed, epoch, np.asarray(indices, np.uint64)))
        result = {}
        for name, array in out.items():
            t = torch.from_numpy(np.ascontiguousarray(array))
            state = self.program.outputs.get(name)  # None for "source", which transforms never touch
            if state is not None and state.dtype == "bfloat16":
                t = t.view(torch.bfloat16)
            result[name] = t
        return result

    def generator(self, epoch: int, first_position: int, device: torch.device | None) -> torch.Generator:
        """Return the ``batch_transform`` generator of the batch whose first sample is at ``first_position``."""
        key = mix64(mix64(np.array([self.seed % 2**64], np.uint64)) ^ np.uint64(epoch) ^ np.uint64(BATCH_TAG))
        with np.errstate(over="ignore"):
            key = mix64(key + np.uint64(first_position))
        g = torch.Generator(device=device if device is not None else "cpu")
        g.manual_seed(int(key[0]) & (2**63 - 1))
        return g

    def finish(self, batches: Iterator[Any], epoch: int, first_positions: Callable[[int], int],
               device: torch.device | None) -> Iterator[Any]:
        """Yield each batch after ``batch_transform`` (on this thread) and in the ``output`` order."""
        if self.batch_transform is None and self.output is None:
            return batches
        return FinishedBatches(self, batches, epoch, first_positions, device)


class FinishedBatches:
    """Batches after ``batch_transform`` and ``output``; forwards ``close``/``stats``/``reset_stats`` to its source."""

    def __init__(self, aug: Augment, batches: Iterator[Any], epoch: int, first_positions: Callable[[int], int],
                 device: torch.device | None) -> None:
        self._aug, self._source, self._epoch, self._first, self._device = aug, batches, epoch, first_positions, device
        self._b = 0

    def __iter__(self) -> FinishedBatches:
        return self

    def __next__(self) -> Any:
        batch = next(self._source)
        aug = self._aug
        if aug.batch_transform is not None:
            result = aug.batch_transform(batch, aug.generator(self._epoch, self._first(self._b), self._device))
            batch = batch if result is None else result
        self._b += 1
        if aug.output is not None:
            batch = tuple(batch[name] for name in aug.output)
        return batch

    def stats(self) -> dict[str, Any]:
        """Return the source's stats."""
        stats = getattr(self._source, "stats", None)
        return stats() if stats is not None else {}

    def reset_stats(self) -> None:
        """Reset the source's stats."""
        reset = getattr(self._source, "reset_stats", None)
        if reset is not None:
            reset()

    def close(self) -> None:
        """Close the source."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()
