"""Sampling: which sample sits at each position of an epoch, as pure, versioned functions (docs/ORDER.md).

:class:`EpochOrder` is the uniform order (a counter-based permutation, ``ORDER_VERSION``); weighted
draws, subsets and mixtures of datasets follow ``SAMPLING_VERSION``. ``ShardLoader`` picks the policy
from its arguments (``shuffle``, ``indices``, ``sample_weights``, ``fastload.mix``); the C++ reader
only receives the indices.
"""

from ._alias import SAMPLING_VERSION
from ._order import ORDER_VERSION, EpochOrder

__all__ = ["ORDER_VERSION", "SAMPLING_VERSION", "EpochOrder"]
