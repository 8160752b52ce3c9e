"""Lets ``python -m spark_analytics`` run the command line."""

import sys

from spark_analytics.cli import main

sys.exit(main())
