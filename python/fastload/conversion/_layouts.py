"""The band layout of 2-D and 3-D arrays (numpy and HDF5 rasters): bands-first or bands-last."""

from __future__ import annotations

from ..errors import ArgumentError


class LayoutError(ValueError):
    """A 3-D array's layout cannot be told from its shape; the message asks for --npy-layout."""


def npy_layout_of(shape: tuple[int, ...], layout: str) -> str:
    """Return ``"chw"`` or ``"hwc"`` for a 3-D array; ``layout="auto"`` decides from the shape.

    As for TIFF, a small leading axis and two large ones is bands-first: an
    axis is small when it is at most half of each of the other two. When both
    ends (or neither) look like bands the shape is ambiguous: ValueError
    asking for ``--npy-layout``.
    """
    if layout != "auto":
        return layout
    a, b, c = shape
    lead = 2 * a <= min(b, c)
    trail = 2 * c <= min(a, b)
    if lead != trail:
        return "chw" if lead else "hwc"
    raise LayoutError(f"3-D array of shape {tuple(shape)}: cannot tell bands-first (C, H, W) from bands-last "
                     "(H, W, C); pass --npy-layout chw or --npy-layout hwc")


def npy_hwc_shape(shape: tuple[int, ...], layout: str) -> tuple[int, int, int]:
    """Return (height, width, channels) of a 2-D or 3-D array in the given (or detected) layout."""
    if len(shape) == 2:
        return (shape[0], shape[1], 1)
    if len(shape) == 3:
        if npy_layout_of(shape, layout) == "chw":
            return (shape[1], shape[2], shape[0])
        return (shape[0], shape[1], shape[2])
    raise ArgumentError(f"array of shape {shape}: expected (H, W), (H, W, C) or (C, H, W)")
