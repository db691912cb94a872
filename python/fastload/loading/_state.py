"""The loader's resumable state: small JSON-able data, validated against the loader on load."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import FastloadError
from ..format._record import FORMAT_VERSION, READABLE_FORMAT_VERSIONS
from ..sampling._order import ORDER_VERSION

STATE_VERSION = 1
MAX_EPOCH = (1 << 63) - 1  # epochs are uint64 in the order's arithmetic; a state's is a non-negative int64
# Integer entries of a state and their smallest allowed value (bools are refused: True is not an epoch).
_INT_KEYS = {"epoch": 0, "position": 0, "batch_size": 1, "world_size": 1}


class StateError(FastloadError, ValueError):
    """A saved state does not fit this loader: another dataset, order or version."""


def make_state(*, fingerprint: str, n: int, seed: int, shuffle: bool, epoch: int, position: int,
               batch_size: int, world_size: int, sampling: dict[str, Any] | None = None,
               augment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the state dict of a loader at global ``position`` of ``epoch``.

    ``sampling`` describes a policy other than the plain one (``_sampling.py``);
    the plain policy's state has no ``sampling`` key, as before it existed.
    ``augment`` (``_augment.describe``) adds ``transforms``, ``layout`` and
    ``batch_transform``: what, besides the order, determines the batches.
    """
    state = {"state_version": STATE_VERSION, "format_version": FORMAT_VERSION, "order_version": ORDER_VERSION,
             "dataset_fingerprint": fingerprint, "num_samples": n, "seed": seed, "shuffle": shuffle,
             "epoch": epoch, "position": position, "batch_size": batch_size, "world_size": world_size}
    if sampling is not None:
        state["sampling"] = sampling
    if augment is not None:
        state.update(augment)
    return state


def check_state(state: Mapping[str, Any], *, fingerprint: str, n: int, seed: int, shuffle: bool,
                sampling: dict[str, Any] | None = None,
                epoch_length: Callable[[int], int] | None = None,
                augment: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """Validate a saved state against the loader; return its (epoch, position).

    ``epoch_length(e)`` is the number of positions of epoch e (``n`` when None).
    ``augment`` is the loader's ``_augment.describe``; a state saved before a
    key of it existed is not checked for that key.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict, not {type(state).__name__}")
    if state.get("format_version") not in READABLE_FORMAT_VERSIONS:  # 1: saved before format v2; same positions
        raise StateError(f"state has format_version {state.get('format_version')!r}, this fastload reads "
                         f"{READABLE_FORMAT_VERSIONS}")
    for key, expected in (("state_version", STATE_VERSION), ("order_version", ORDER_VERSION)):
        if state.get(key) != expected:
            raise StateError(f"state has {key} {state.get(key)!r}, this fastload uses {expected}")
    if state.get("dataset_fingerprint") != fingerprint or state.get("num_samples") != n:
        raise StateError(f"state was saved for another dataset (fingerprint {state.get('dataset_fingerprint')!r}, "
                         f"{state.get('num_samples')} samples; this one is {fingerprint!r}, {n} samples)")
    for key, value in (("seed", seed), ("shuffle", shuffle)):
        if state.get(key) != value:
            raise StateError(f"state was saved with {key}={state.get(key)!r}, this loader has {key}={value!r}")
    if state.get("sampling") != sampling:
        raise StateError(f"state was saved with sampling {state.get('sampling')!r}, this loader samples "
                         f"{sampling!r}")
    if augment is not None:
        check_augment(state, augment)
    for key, low in _INT_KEYS.items():
        got = state.get(key)
        if key not in state and key in ("batch_size", "world_size"):
            continue  # informational: states may omit them
        if isinstance(got, bool) or not isinstance(got, int) or not low <= got <= MAX_EPOCH:
            raise StateError(f"state has an invalid {key} {got!r}: expected an integer in [{low}, {MAX_EPOCH}]")
    epoch: int = state["epoch"]
    position: int = state["position"]
    length = n if epoch_length is None else epoch_length(epoch)
    if not isinstance(position, int) or not 0 <= position <= length:
        raise StateError(f"state has an invalid epoch {epoch!r} or position {position!r}")
    return epoch, position


def _ops_text(ops: Any) -> str:
    return "[" + ", ".join(_op_text(op) for op in ops) + "]" if isinstance(ops, list) else repr(ops)


def _op_text(op: Any) -> str:
    if not isinstance(op, Mapping):
        return str(op)
    return f"{op.get('op')}(" + ", ".join(f"{k}={v!r}" for k, v in op.items() if k != "op") + ")"


def check_augment(state: Mapping[str, Any], augment: Mapping[str, Any]) -> None:
    """Refuse a state saved under other transforms, layout or presence of a ``batch_transform``.

    JSON turns tuples into lists, so both sides are compared as JSON data. A
    ``batch_transform`` is a function, which cannot be compared: only whether
    there is one is checked.
    """
    if "transforms" in state:
        saved, ours = json.loads(json.dumps(state["transforms"])), json.loads(json.dumps(augment["transforms"]))
        if saved != ours:
            detail = f"this loader has {_ops_text(ours)}" if ours else "this loader has none"
            if saved and isinstance(saved, list) and len(saved) == len(ours):
                i = next(i for i, (a, b) in enumerate(zip(saved, ours)) if a != b)
                detail += f" (op {i} differs: {_op_text(saved[i])} saved, {_op_text(ours[i])} here)"
            what = f"with transforms {_ops_text(saved)}" if saved else "without transforms"
            raise StateError(f"state was saved {what}; {detail}: resuming would not give the same batches")
    if "layout" in state and augment["transforms"] and json.loads(json.dumps(state["layout"])) != augment["layout"]:
        raise StateError(f"state was saved with transforms for layout={state['layout']!r}, this loader has "
                         f"layout={augment['layout']!r}: resuming would not give the same batches")
    if "batch_transform" in state and (state["batch_transform"] is None) != (augment["batch_transform"] is None):
        saved_fn, our_fn = state["batch_transform"], augment["batch_transform"]
        head = (f"state was saved with batch_transform={saved_fn!r}, this loader has no batch_transform"
                if saved_fn is not None else
                f"state was saved without a batch_transform, this loader has batch_transform={our_fn!r}")
        raise StateError(head + " (a function cannot be compared: only whether there is one is checked)")
