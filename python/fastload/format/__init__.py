"""The format (private; import from :mod:`fastload`): what a shard dataset is on disk, and reading it back.

The schema and the binary record (``_record``), dtypes, the manifest and its strict check, shard files
and record keys, read-only LMDB environments and their structural check, dataset roots with splits,
and ``fastload verify``'s checks. Imports nothing from conversion, loading or tools (pyproject.toml's
import-linter contract); docs/FORMAT.md is the specification.
"""
