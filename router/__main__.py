"""Entry point for ``python -m router``."""

import sys

from router.cli import main

sys.exit(main(prog="python -m router"))
