"""``python -m fastload``: the same as the ``fastload`` command."""

import sys

from .tools.cli import main

sys.exit(main())
