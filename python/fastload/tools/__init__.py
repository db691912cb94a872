"""Tools around the stages: the ``fastload`` command (``verify``, ``info``, ``bench``) and the demo.

Nothing in the library imports this package (pyproject.toml's import-linter contract).
"""
