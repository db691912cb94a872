"""Deterministic augmentation and normalisation, declared as data and run in the native threads.

``ShardLoader(path, transforms=[RandomCrop(112), RandomFlip(), Normalize(mean, std)])``
applies the chain to every sample in the C++ worker threads (or, with
``backend="torch"``, in the numpy reference, bitwise equal). Random draws are a
pure function of (seed, epoch, sample index, op position): the same for any
thread count, backend or resume point. docs/TRANSFORMS.md gives the exact
semantics of every op.
"""

from ._ops import (
    AxisMasks,
    CenterCrop,
    Normalize,
    Pad,
    RandomCrop,
    RandomDihedral,
    RandomErasing,
    RandomFlip,
    RandomResizedCrop,
    RandomRot90,
    Resize,
    SelectChannels,
    ToDtype,
    Transform,
    TransformError,
)
from ._program import Program

__all__ = [
    "AxisMasks",
    "CenterCrop",
    "Normalize",
    "Pad",
    "Program",
    "RandomCrop",
    "RandomDihedral",
    "RandomErasing",
    "RandomFlip",
    "RandomResizedCrop",
    "RandomRot90",
    "Resize",
    "SelectChannels",
    "ToDtype",
    "Transform",
    "TransformError",
]
