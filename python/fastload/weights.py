"""Per-sample weights for ``ShardLoader(..., sample_weights=w)``: balance classes, or oversample rare mask classes.

- :func:`class_balanced_weights` ``(dataset, field="label")``: ``1 / (samples of the
  class)`` for a scalar integer label, so that every class is drawn equally often.
- :func:`from_mask_classes` ``(dataset, field=None, *, method="rare", ...)``: from the
  per-tile class pixel counts that ``preprocess_tiles --targets NAME=DIR --num-classes K``
  records (``NAME_class_pixels``), weights that draw tiles holding rare classes more
  often: rare class sampling (``"rare"``, as DAFormer) or pixel-weighted inverse class
  frequency (``"inverse"``). The formulas: its docstring and docs/sampling.md ("Tiles
  with rare classes").

Both read one field of every sample once and return a float64 array, one weight per
sample of the dataset (a ``ShardDataset``, a ``concat`` or a ``subset``).
"""

from .loading._mask_weights import from_mask_classes
from .loading._weights import class_balanced_weights

__all__ = ["class_balanced_weights", "from_mask_classes"]
