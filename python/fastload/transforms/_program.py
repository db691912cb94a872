"""Compiles a chain of ops against a dataset's fields: the steps per field, the output fields, the draws."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import FastloadWarning
from ._floats import float32_to
from ._ops import (
    FillTransform,
    Normalize,
    ResampleTransform,
    SelectChannels,
    SpatialTransform,
    ToDtype,
    Transform,
    TransformError,
)
from ._rng import op_keys
from ._spec import (
    CONVERT,
    FILL,
    GATHER,
    LAYOUTS,
    NORMALIZE,
    RESIZE,
    SCALE,
    SELECT,
    FieldState,
    Step,
    storage_dtype,
)

INTEGER_RANGE = {"uint8": 255, "int8": 127, "uint16": 65535, "int16": 32767, "int32": 2**31 - 1, "int64": 2**63 - 1}
NUMERIC = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bfloat16")


def _pad_bytes(op: SpatialTransform | FillTransform, state: FieldState) -> bytes:
    value = op.pad_value(state.name) if isinstance(op, SpatialTransform) else op.value
    if state.dtype == "bfloat16":
        return float32_to(np.array([value], np.float32), "bfloat16").tobytes()
    dt = storage_dtype(state.dtype)
    with np.errstate(all="ignore"):
        cast = np.array([value]).astype(dt)
    if cast[0] != value and not (np.isnan(value) and dt.kind == "f"):
        raise op.fail(state.name, f"pad value {value!r} does not fit dtype {state.dtype}")
    return cast.tobytes()


class Program:
    """A transform chain compiled for one set of fields.

    ``fields`` are (name, dtype, shape) of what the loader decodes; ``layout``
    ("chw" or "hwc", or a dict per field name) says where a 3-D field keeps
    its channels; 2-D fields are single-channel images or masks; ``targets`` names fields that
    are labels or per-pixel targets (resampled nearest by default, whatever their rank). ``max_sample_bytes``
    (the readers' bound on one decoded sample) bounds every field's bytes at every
    point of the chain, so an op that would grow a sample past it is refused here,
    the same for both backends.
    """

    def __init__(self, ops: Sequence[Transform], fields: Sequence[tuple[str, str, tuple[int, ...]]],
                 layout: str | Mapping[str, str] = "chw", max_sample_bytes: int | None = None,
                 targets: Sequence[str] = ()) -> None:
        self.ops = list(ops)
        state: dict[str, FieldState] = {}
        for name, dtype, shape in fields:
            lay = layout.get(name, "chw") if isinstance(layout, Mapping) else layout
            if lay not in LAYOUTS:
                raise TransformError(f"layout of field {name!r} must be 'chw' or 'hwc', not {lay!r}")
            state[name] = FieldState(name, dtype, tuple(shape), "hw" if len(shape) == 2 else lay, name in targets)
        self.inputs = dict(state)
        self.steps: list[Step] = []
        # Ops with per-sample parameters: position, op, column offset, input height and width.
        self.spatial: list[tuple[int, SpatialTransform | FillTransform, int, int, int]] = []
        self.num_params = 0
        for position, op in enumerate(self.ops):
            if not isinstance(op, Transform):
                raise TransformError(f"transforms[{position}] is {op!r}, not a fastload.transforms op")
            for name in op.targets(state):
                state[name] = self._compile(op, position, state[name])
                total = sum(s.nbytes for s in state.values())
                if max_sample_bytes is not None and total > max_sample_bytes:
                    raise op.fail(name, f"a sample would be {total} bytes (field shape {state[name].shape}), over "
                                        f"the {max_sample_bytes}-byte bound of one sample (FASTLOAD_MAX_SAMPLE_BYTES)")
        self.outputs = state

    def _compile(self, op: Transform, position: int, src: FieldState) -> FieldState:
        if not src.spatial and not isinstance(op, SpatialTransform):
            raise op.fail(src.name, f"shape {src.shape} is not an image (2-D, or 3-D chw/hwc)")
        c, h, w = src.chw if src.spatial else (0, 0, 0)
        if isinstance(op, ResampleTransform):
            mode = op.mode(src)
            if not self.spatial or self.spatial[-1][0] != position:
                self.spatial.append((position, op, self.num_params, h, w))
                self.num_params += 4
            dst = src.with_chw(c, *op.size)
            self.steps.append(Step(RESIZE, src.name, src, dst, op.name, param_offset=self.spatial[-1][2],
                                   mode=1 if mode == "bilinear" else 0))
            return dst
        if isinstance(op, SpatialTransform):
            oh, ow = op.out_size(h, w, src.name)
            if not self.spatial or self.spatial[-1][0] != position:
                self.spatial.append((position, op, self.num_params, h, w))
                self.num_params += 6
            dst = src.with_chw(c, oh, ow)
            self.steps.append(Step(GATHER, src.name, src, dst, op.name, param_offset=self.spatial[-1][2],
                                   pad=_pad_bytes(op, src)))
            return dst
        if isinstance(op, FillTransform):
            op.check(h, w, src.name)
            if not self.spatial or self.spatial[-1][0] != position:
                self.spatial.append((position, op, self.num_params, h, w))
                self.num_params += 4 * op.count
            elif self.spatial[-1][3:] != (h, w):
                raise op.fail(src.name, f"height x width {(h, w)} differs from the op's other fields; "
                                        "it draws one set of rectangles for all its fields")
            self.steps.append(Step(FILL, src.name, src, src, op.name, param_offset=self.spatial[-1][2],
                                   pad=_pad_bytes(op, src), rects=op.count))
            return src
        if isinstance(op, SelectChannels):
            if len(src.shape) != 3:
                raise op.fail(src.name, f"shape {src.shape} has no channel axis")
            bad = [i for i in op.indices if not 0 <= i < c]
            if bad:
                raise op.fail(src.name, f"channel(s) {bad} out of range for {c} channels")
            dst = src.with_chw(len(op.indices), h, w)
            self.steps.append(Step(SELECT, src.name, src, dst, op.name, channels=list(op.indices)))
            return dst
        if isinstance(op, (ToDtype, Normalize)):
            if src.dtype not in NUMERIC:
                raise op.fail(src.name, f"dtype {src.dtype} is not numeric")
            dst = src.with_chw(c, h, w, op.dtype)
            if isinstance(op, ToDtype):
                step = Step(CONVERT, src.name, src, dst, op.name, mode=SCALE, scale=op.scale)
            else:
                mean, std = op.mean, op.std
                for what, values in (("mean", mean), ("std", std)):
                    if len(values) not in (1, c):
                        raise op.fail(src.name, f"{len(values)} {what} values for {c} channels")
                _check_units(op, src)
                step = Step(CONVERT, src.name, src, dst, op.name, mode=NORMALIZE,
                            mean=[float(np.float32(v)) for v in (mean * c if len(mean) == 1 else mean)],
                            std=[float(np.float32(v)) for v in (std * c if len(std) == 1 else std)])
            self.steps.append(step)
            return dst
        raise TransformError(f"{op!r} is not supported")

    def params(self, seed: int, epoch: int, indices: Any) -> np.ndarray:
        """Return every sample's parameters ``[len(indices), num_params]`` (int64) for the spatial steps."""
        indices = np.asarray(indices, dtype=np.uint64)
        out = np.zeros((len(indices), self.num_params), dtype=np.int64)
        for position, op, offset, h, w in self.spatial:
            keys = op_keys(seed, epoch, indices, position)
            if isinstance(op, ResampleTransform):
                out[:, offset:offset + 4] = op.boxes(keys, h, w)
            elif isinstance(op, SpatialTransform):
                out[:, offset:offset + 6] = op.maps(keys, h, w)
            else:
                out[:, offset:offset + 4 * op.count] = op.rects(keys, h, w)
        return out

    def steps_for(self, name: str) -> list[Step]:
        """Return the steps of field ``name``, in order."""
        return [s for s in self.steps if s.field == name]


def _check_units(op: Normalize, src: FieldState) -> None:
    """Warn when ``op``'s statistics look like 0-1 data's while the field holds integers (torchvision habits)."""
    if src.dtype not in INTEGER_RANGE:
        return
    if all(0.0 <= m <= 1.0 for m in op.mean) and all(0.0 < s < 1.0 for s in op.std):
        top = INTEGER_RANGE[src.dtype]
        warnings.warn(f"{op!r}: mean and std look like statistics of 0-1 data, but field {src.name!r} is "
                      f"{src.dtype} (0-{top}) here: put ToDtype(scale=1 / {top}) before it, or give mean and std "
                      f"in the data's units (times {top})", FastloadWarning, stacklevel=2)
