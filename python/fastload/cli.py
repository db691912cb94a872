"""The ``fastload`` command at its public path (``python -m fastload.cli``); it lives in :mod:`fastload.tools.cli`."""

import sys

from .tools.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
