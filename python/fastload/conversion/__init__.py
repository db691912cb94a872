"""Conversion (private, but for ``preprocess``): images, rasters, arrays and datasets into the format.

Sources and labels, image reading, tiling, encoding, the parallel map, shard and dataset writers,
``preprocess_tiles`` (the public command module :mod:`fastload.conversion.preprocess`),
``write_arrays`` and ``write_dataset``. Uses the format; never the loading side.
"""
