"""Loading (private; import from :mod:`fastload`): shard datasets out as batches of tensors.

``ShardLoader`` and its epoch iterator, plans, state, the native and torch backends, device
transfer, the torch ``Dataset`` (``ShardDataset``) and its subsets, concatenations and mixtures, and
the ``DataLoader``/Lightning helpers. Uses the format, sampling and transforms; never conversion.
"""
