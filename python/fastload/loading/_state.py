"""The loader's resumable state: small JSON-able data, validated against the loader on load."""

from __future__ import annotations

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
               batch_size: int, world_size: int, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the state dict of a loader at global ``position`` of ``epoch``.

    ``sampling`` describes a policy other than the plain one (``_sampling.py``);
    the plain policy's state has no ``sampling`` key, as before it existed.
    """
    state = {"state_version": STATE_VERSION, "format_version": FORMAT_VERSION, "order_version": ORDER_VERSION,
             "dataset_fingerprint": fingerprint, "num_samples": n, "seed": seed, "shuffle": shuffle,
             "epoch": epoch, "position": position, "batch_size": batch_size, "world_size": world_size}
    if sampling is not None:
        state["sampling"] = sampling
    return state


def check_state(state: Mapping[str, Any], *, fingerprint: str, n: int, seed: int, shuffle: bool,
                sampling: dict[str, Any] | None = None,
                epoch_length: Callable[[int], int] | None = None) -> tuple[int, int]:
    """Validate a saved state against the loader; return its (epoch, position).

    ``epoch_length(e)`` is the number of positions of epoch e (``n`` when None).
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
