"""``preprocess_tiles`` at its public path (``python -m fastload.preprocess``).

It lives in :mod:`fastload.conversion.preprocess`.
"""

import sys

from .conversion.preprocess import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
