"""``python -m fastload.demo``: the whole pipeline on built-in sample data (it lives in :mod:`fastload.tools.demo`)."""

import sys

from .tools.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
